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
from typing import Any

__all__ = ["LISTEN_LINE", "TWISTD", "TWISTD_FLOOR", "nsqtw_command", "process_cpu", "rss_bytes", "start_daemon",
           "start_listening", "stop_daemons", "twistd_floor_rss"]

#: runs twistd from the current interpreter (no dependence on a ``twistd`` script on PATH)
TWISTD = "import sys; from twisted.scripts.twistd import run; sys.argv[0] = 'twistd'; run()"

#: what ``twistd PLUGIN`` imports and runs before the plugin's own code (twistd's modules and its
#: plugin discovery), then prints its ``VmRSS``: the floor under any twistd daemon's RSS
TWISTD_FLOOR = ("from twisted.scripts import twistd\n"
                "from twisted.application.service import IServiceMaker\n"
                "from twisted.plugin import getPlugins\n"
                "list(getPlugins(IServiceMaker))\n"
                "print([ln for ln in open('/proc/self/status') if ln.startswith('VmRSS:')][0].split()[1])\n")

#: the start-up lines both daemons write: which listener, on which address
LISTEN_LINE = re.compile(r"(TCP|HTTP): listening on (\S+)")


def nsqtw_command() -> list[str]:
    """The command line that starts nsqtw's nsqd in the foreground (flags follow)."""
    return [sys.executable, "-c", TWISTD, "--pidfile=", "-n", "nsqtw"]


def start_listening(cmd: list[str], cwd: str, env: dict[str, str] | None = None,
                    ) -> tuple[subprocess.Popen[str], str, str]:
    """Start any nsqd from ``cmd``; wait for its TCP and HTTP lines; keep reading its log.

    Returns the process and its TCP and HTTP addresses.
    """
    proc, found = start_daemon(cmd, cwd, env)
    return proc, found["TCP"], found["HTTP"]


def start_daemon(cmd: list[str], cwd: str, env: dict[str, str] | None = None,
                 listeners: tuple[str, ...] = ("TCP", "HTTP")) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """Start any daemon from ``cmd``; wait for the ``listening on`` lines of ``listeners``; keep reading its log.

    Returns the process and the address of each listener. A thread drains
    stderr afterwards, since a full pipe would block the daemon.
    """
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    found: dict[str, str] = {}
    assert proc.stderr is not None
    while not set(listeners) <= found.keys():
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError(f"{cmd[0]} exited before listening")
        m = LISTEN_LINE.search(line)
        if m:
            found[m.group(1)] = m.group(2)
    threading.Thread(target=lambda: [None for _ in proc.stderr or ()], daemon=True).start()
    return proc, found


def stop_daemons(*named: tuple[str, subprocess.Popen[Any]], within: float = 30.0) -> None:
    """SIGTERM each ``(name, process)`` in turn and wait for it to exit.

    One still there ``within`` seconds later is killed, the others are
    stopped all the same, and then a ``RuntimeError`` names those that hung:
    a graceful stop that hangs is a bug to see, not a wait for ever (nsqd's
    own stop gives a failing disk 10 s).
    """
    hung = []
    for name, proc in named:
        proc.terminate()
        try:
            proc.wait(within)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            hung.append(f"{name} (pid {proc.pid})")
    if hung:
        raise RuntimeError(f"{', '.join(hung)}: still running {within:g} s after SIGTERM, killed")


def process_cpu(pid: int) -> tuple[float, float]:
    """User and system CPU seconds process ``pid`` and its live descendants have used so far
    (Linux ``/proc``): an nsqtw node with ``--workers`` is a process tree.

    The daemon's CPU per message or per cycle is the figure the side-by-side
    tools trust on a shared machine, where throughput alone is noisy.
    """
    tick = os.sysconf("SC_CLK_TCK")
    user = system = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError):  # a child that ended meanwhile
            if p == pid:
                raise
            continue
        user += int(fields[11])
        system += int(fields[12])
    return user / tick, system / tick


def rss_bytes(pid: int) -> int:
    """Process ``pid``'s resident set size now (Linux ``/proc``)."""
    with open(f"/proc/{pid}/status") as f:
        line = next(ln for ln in f if ln.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def twistd_floor_rss(env: dict[str, str] | None = None) -> int:
    """The RSS of a process that did what twistd does before a plugin's code runs (:data:`TWISTD_FLOOR`).

    ``env`` should be the daemon's, so the same plugin directories are searched.
    """
    out = subprocess.run([sys.executable, "-c", TWISTD_FLOOR], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout) * 1024
