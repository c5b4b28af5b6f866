"""docs/deploy.md's systemd units work as written: each ``ExecStart=`` line, run as systemd would run
it (``NOTIFY_SOCKET`` set), sends READY=1 once its listeners answer, STOPPING=1 at SIGTERM, exits 0.

Only what a test machine must change is replaced, and every replacement is
listed in the test's ``replace`` table: the installed ``twistd`` becomes this
interpreter running twistd, fixed ports become free ones, the data
directory a temporary one, and the addresses of other daemons closed
ports (``free_port``: nothing listens there). Everything else is the doc's text.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest

from tests.daemon import ROOT, TWISTD
from tests.integration.test_startup import free_port

DOC = os.path.join(ROOT, "docs", "deploy.md")


def units() -> dict[str, dict[str, str]]:
    """The doc's unit files, by file name: ``{"nsqtw.service": {"Type": "notify", ...}}``."""
    with open(DOC) as f:
        text = f.read()
    out: dict[str, dict[str, str]] = {}
    for block in re.findall(r"```ini\n(.*?)```", text, re.S):
        name = re.search(r"^# /etc/systemd/system/(\S+)$", block, re.M)
        assert name, block
        out[name.group(1)] = dict(re.findall(r"^(\w+)=(.*)$", block, re.M))
    return out


def test_doc_has_the_three_units() -> None:
    """One unit per daemon, each Type=notify (readiness), Restart=on-failure, stopped by SIGTERM."""
    found = units()
    assert set(found) == {"nsqtw.service", "nsqtw-lookupd.service", "nsqtw-admin.service"}
    for unit in found.values():
        assert unit["Type"] == "notify" and unit["NotifyAccess"] == "main"
        assert unit["Restart"] == "on-failure"
        assert unit.get("KillSignal", "SIGTERM") == "SIGTERM"
        assert " --nodaemon " in unit["ExecStart"]


@pytest.mark.parametrize("unit_name, plugin", [("nsqtw.service", "nsqtw"),
                                               ("nsqtw-lookupd.service", "nsqtw-lookupd"),
                                               ("nsqtw-admin.service", "nsqtw-admin")])
def test_exec_start_runs_and_notifies(unit_name, plugin, tmp_path) -> None:
    """The unit's ExecStart, with only the listed replacements, starts the daemon; READY=1 comes when
    its HTTP listener already answers; SIGTERM sends STOPPING=1 and exits 0."""
    unit = units()[unit_name]
    argv = shlex.split(unit["ExecStart"])
    assert argv[0] == "/opt/nsqtw/bin/twistd" and plugin in argv
    http = free_port()
    replace = {  # the doc's value -> the test's, the only changes
        "/opt/nsqtw/bin/twistd": [sys.executable, "-c", TWISTD],
        "--data-path=/var/lib/nsqtw": [f"--data-path={tmp_path}"],
        "--tcp-address=0.0.0.0:4150": [f"--tcp-address=127.0.0.1:{free_port()}"],
        "--http-address=0.0.0.0:4151": [f"--http-address=127.0.0.1:{http}"],
        "--tcp-address=0.0.0.0:4160": [f"--tcp-address=127.0.0.1:{free_port()}"],
        "--http-address=0.0.0.0:4161": [f"--http-address=127.0.0.1:{http}"],
        "--http-address=0.0.0.0:4171": [f"--http-address=127.0.0.1:{http}"],
        "--lookupd-tcp-address=127.0.0.1:4160": [f"--lookupd-tcp-address=127.0.0.1:{free_port()}"],
        "--lookupd-http-address=127.0.0.1:4161": [f"--lookupd-http-address=127.0.0.1:{free_port()}"],
    }
    cmd = [part for arg in argv for part in replace.get(arg, [arg])]
    kept = [arg for arg in argv if arg not in replace]
    assert kept == ["--nodaemon", "--pidfile=", plugin]  # every flag of the daemon was replaced above
    notify_path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(notify_path)
    env = dict(os.environ, NOTIFY_SOCKET=notify_path)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(cmd, cwd=str(tmp_path), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        assert select.select([sock], [], [], 30)[0], "no READY=1 within 30 s"
        assert sock.recv(4096) == b"READY=1"
        path = "/" if plugin == "nsqtw-admin" else "/ping"
        with urllib.request.urlopen(f"http://127.0.0.1:{http}{path}", timeout=10) as r:
            assert r.status == 200
        proc.send_signal(signal.SIGTERM)  # systemd's stop
        assert proc.wait(30) == 0
        assert select.select([sock], [], [], 5)[0]
        assert sock.recv(4096) == b"STOPPING=1"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()
