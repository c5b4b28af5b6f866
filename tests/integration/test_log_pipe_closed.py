"""A daemon whose stderr reader went away (a closed pipe) loses its log lines, not its work or a core.

Before, the first failed flush raised, Twisted logged the failure, and that
line scheduled the next failing flush: the daemon spun at most of a core
for as long as it ran (found when a benchmark script died and left its
daemon behind). Go nsqd's logger ignores write errors too.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time

from tests.daemon import ROOT, Daemon
from tests.integration.test_busypoll_live import cpu_seconds
from tests.rawclient import Client

QUIET = 2.0


def test_a_closed_stderr_loses_lines_not_the_daemon(tmp_path) -> None:
    cmd = Daemon(str(tmp_path)).command("127.0.0.1:0", "127.0.0.1:0")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(cmd, cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        out = b""
        deadline = time.monotonic() + 20
        while b"TCP: listening on " not in out or not out.split(b"TCP: listening on ", 1)[1].count(b"\n"):
            assert time.monotonic() < deadline, out
            if select.select([fd], [], [], 1)[0]:
                chunk = os.read(fd, 65536)
                assert chunk, out
                out += chunk
        tcp = out.split(b"TCP: listening on ", 1)[1].split(b"\n", 1)[0].decode()
        proc.stdout.close()  # the reader goes away

        c = Client(tcp)
        for i in range(20):  # each new topic logs a line (and a warning for the client's odd command)
            c.pub(f"closed-{i}", b"x")
            c.cmd("NOSUCH")
            assert c.response()[1].startswith(b"E_INVALID"), i
            c = Client(tcp)
        time.sleep(0.5)  # the lines' flushes are due by now, and failed
        before = cpu_seconds(proc.pid)
        time.sleep(QUIET)
        used = cpu_seconds(proc.pid) - before
        assert used < 0.1 * QUIET, f"{used:.2f}s of CPU in {QUIET}s without traffic"
        Client(tcp).pub("closed-0", b"still here")  # and it still works
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
