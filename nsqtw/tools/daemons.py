"""Start an nsqd (Go's or nsqtw) as a child process on loopback port 0 and learn its addresses.

Shared by the side-by-side tools (``nsqtw-bench compare``, ``tools/*_compare.py``) and the
integration tests: both daemons log ``TCP: listening on HOST:PORT`` and ``HTTP: listening on
HOST:PORT`` at start-up, which is how a caller that asked for port 0 learns the ports.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading

__all__ = ["LISTEN_LINE", "TWISTD", "nsqtw_command", "process_cpu", "start_listening"]

#: runs twistd from the current interpreter (no dependence on a ``twistd`` script on PATH)
TWISTD = "import sys; from twisted.scripts.twistd import run; sys.argv[0] = 'twistd'; run()"

#: the start-up lines both daemons write: which listener, on which address
LISTEN_LINE = re.compile(r"(TCP|HTTP): listening on (\S+)")


def nsqtw_command() -> list[str]:
    """The command line that starts nsqtw's nsqd in the foreground (flags follow)."""
    return [sys.executable, "-c", TWISTD, "--pidfile=", "-n", "nsqtw"]


def start_listening(cmd: list[str], cwd: str, env: dict[str, str] | None = None,
                    ) -> tuple[subprocess.Popen[str], str, str]:
    """Start any nsqd from ``cmd``; wait for its TCP and HTTP lines; keep reading its log.

    Returns the process and its TCP and HTTP addresses. A thread drains
    stderr afterwards, since a full pipe would block the daemon.
    """
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    found: dict[str, str] = {}
    assert proc.stderr is not None
    while len(found) < 2:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError(f"{cmd[0]} exited before listening")
        m = LISTEN_LINE.search(line)
        if m:
            found[m.group(1)] = m.group(2)
    threading.Thread(target=lambda: [None for _ in proc.stderr or ()], daemon=True).start()
    return proc, found["TCP"], found["HTTP"]


def process_cpu(pid: int) -> tuple[float, float]:
    """User and system CPU seconds process ``pid`` has used so far (Linux ``/proc``).

    The daemon's CPU per message or per cycle is the figure the side-by-side
    tools trust on a shared machine, where throughput alone is noisy.
    """
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick
