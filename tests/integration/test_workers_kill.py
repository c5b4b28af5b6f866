"""``--workers``: whatever kills the core, at any moment of its start, leaves no process behind.

The core is killed with SIGKILL at a dozen points of its start-up (before
and after it forks the fork server, while workers start, once it serves),
in the foreground and daemonized. Within a second no process of that node
is alive (each carries a marker in its environment, inherited across the
forks, so even one reparented elsewhere is found), and the TCP and HTTP
ports it had bound can be bound again at once.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from nsqtw.tools.daemons import TWISTD
from tests.daemon import ROOT

MARK = "NSQTW_KILL_TEST"
_LISTEN = re.compile(r"(TCP|HTTP): listening on 127\.0\.0\.1:(\d+)")
#: seconds after the start at which the core is killed (start-up takes about one)
FOREGROUND = [0.0, 0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0, 1.3, 1.6, 2.0]
#: seconds after the daemon wrote its pidfile
DAEMONIZED = [0.0, 0.05, 0.15, 0.3, 0.6, 1.0]


def marked(token: str) -> list[int]:
    """The live (not zombie) processes whose environment carries ``token``."""
    needle = f"{MARK}={token}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(name))
    return found


def bindable(port: int) -> bool:
    """Whether a server could listen on ``port`` now (as Twisted's listener does, SO_REUSEADDR)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen(1)
        except OSError:
            return False
    return True


def ports(log: str) -> list[int]:
    try:
        with open(log) as f:
            return [int(m.group(2)) for m in _LISTEN.finditer(f.read())]
    except OSError:
        return []


def check_nothing_left(token: str, log: str, when: str) -> None:
    """Within a second, no process of the node is alive and its ports are free.

    Both are waited for: a killed process's environment is gone (``marked`` no longer finds it)
    as soon as its memory is let go, which the kernel does before it closes the process's
    files, so for a moment its listening socket outlives what ``marked`` sees."""
    deadline = time.monotonic() + 1.0
    while (marked(token) or not all(bindable(p) for p in ports(log))) and time.monotonic() < deadline:
        time.sleep(0.01)
    left = sorted(marked(token))
    for pid in left:  # not to leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert not left, f"killed {when}: processes left behind: {left}"
    for port in ports(log):
        assert bindable(port), f"killed {when}: port {port} still held"


def env(token: str) -> dict[str, str]:
    return dict(os.environ, **{MARK: token, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})


@pytest.mark.parametrize("delay", FOREGROUND)
def test_a_core_killed_while_it_starts_leaves_nothing_behind(tmp_path, delay: float) -> None:
    token = uuid.uuid4().hex
    log = str(tmp_path / "out.log")
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", TWISTD, "--pidfile=", "-n", "nsqtw", "--workers=2",
                                 "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"],
                                cwd=tmp_path, env=env(token), stdout=out, stderr=subprocess.STDOUT)
    time.sleep(delay)
    proc.kill()
    proc.wait()
    check_nothing_left(token, log, f"{delay}s into its start")


@pytest.mark.parametrize("delay", DAEMONIZED)
def test_a_daemonized_core_killed_while_it_starts_leaves_nothing_behind(tmp_path, delay: float) -> None:
    token = uuid.uuid4().hex
    log, pidfile = str(tmp_path / "nsqd.log"), str(tmp_path / "nsqd.pid")
    launcher = subprocess.Popen([sys.executable, "-c", TWISTD, f"--pidfile={pidfile}", f"--logfile={log}",
                                 "nsqtw", "--workers=2", "--tcp-address=127.0.0.1:0",
                                 "--http-address=127.0.0.1:0"],
                                cwd=tmp_path, env=env(token), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    pid = 0
    while not pid and time.monotonic() < deadline:
        try:
            with open(pidfile) as f:
                pid = int(f.read().strip() or 0)
        except (OSError, ValueError):
            time.sleep(0.005)
    assert pid, "the daemon never wrote its pidfile"
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    # the process the user started ends too: 0 if the daemon said READY before it was killed,
    # else 1 (with a FATAL line), and it leaves none of twistd's processes waiting
    try:
        status = launcher.wait(timeout=5)
    finally:
        launcher.kill()
    assert status in (0, 1), status
    check_nothing_left(token, log, f"{delay}s after it daemonized")
