"""A data directory nsqd cannot write: the start fails loudly, and a later failure to save
``nsqd.dat`` keeps ``/ping`` unhealthy until a save succeeds.

The read-only directory is a real read-only mount where the test may mount
(root: ``chmod`` does not stop root's writes); a data path that is a file
runs everywhere. The save failure is injected in the metadata layer
(``NSQTW_TEST_METADATA_FAIL_FLAG``, :mod:`tests.reliability.faults`).
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator

import pytest

from tests.daemon import Daemon
from tests.integration.test_startup import ANCHOR, env_with, fatal_lines, received, run_to_exit
from tests.reliability.conftest import ping, wait_for
from tests.reliability.faults import faulty_daemon_code


@pytest.fixture(params=["read-only mount", "a file"])
def unwritable_data_path(request, tmp_path) -> Iterator[tuple[str, str]]:
    """A data path nsqd cannot write: (path, what nsqd's FATAL line says)."""
    if request.param == "a file":
        path = tmp_path / "not-a-dir"
        path.write_text("")
        yield str(path), "failed to load metadata - failed to read metadata from "
        return
    path = tmp_path / "ro"
    path.mkdir()
    for cmd in (["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)],
                ["mount", "-o", "remount,ro", str(path)]):
        result = subprocess.run(cmd, capture_output=True)
        if result.returncode != 0:
            subprocess.run(["umount", str(path)], capture_output=True)
            pytest.skip("cannot mount a read-only tmpfs here (root needed): " + result.stderr.decode())
    try:
        yield str(path), "failed to persist metadata - "
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_unwritable_data_path_fails_the_start(unwritable_data_path, tmp_path, notify_socket) -> None:
    """A data path nsqd cannot write (a read-only mount: chmod does not stop root) ends the start with
    one FATAL line and status 1, as Go's nsqd does, before any client is served; no READY=1."""
    path, reason = unwritable_data_path
    r = run_to_exit("nsqtw", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                              f"--data-path={path}"], str(tmp_path), env_with(NOTIFY_SOCKET=notify_socket[0]))
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "Traceback" not in out and "listening on" not in out, out
    fatal = fatal_lines(out)
    assert len(fatal) == 1 and fatal[0].startswith(reason), out
    assert b"READY=1" not in received(notify_socket[1], 0.2)
    go = os.path.join(ANCHOR, "nsqd")
    if os.path.exists(go):  # side by side: Go's nsqd refuses it too, with the same words
        r = subprocess.run([go, "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                            f"--data-path={path}"], cwd=str(tmp_path), capture_output=True, text=True,
                           timeout=30, check=False)
        assert r.returncode == 1 and fatal_lines(r.stderr)[0].startswith(reason), r.stderr


def test_nsqd_dat_save_failure_keeps_ping_unhealthy_until_saved(tmp_path) -> None:
    """Saving nsqd.dat failing after start (fault injected in the metadata layer): /ping answers
    500 "NOK - failed to persist metadata - ..." through the retries, and OK once a save succeeds."""
    flag = tmp_path / "metadata-fails"
    data = tmp_path / "data"
    data.mkdir()
    d = Daemon(str(data), code=faulty_daemon_code(), env={"NSQTW_TEST_METADATA_FAIL_FLAG": str(flag)})
    d.start()
    try:
        assert ping(d) == (200, b"OK")
        flag.write_text("")
        urllib.request.urlopen(f"http://{d.http_address}/topic/create?topic=t", data=b"", timeout=10).close()
        status = wait_for(lambda: ping(d)[0] == 500, 10)
        assert status, ping(d)
        time.sleep(2.5)  # two retries at least: still unhealthy
        code, body = ping(d)
        assert (code, body.split(b" - ")[0:2]) == (500, [b"NOK", b"failed to persist metadata"]), body
        flag.unlink()
        assert wait_for(lambda: ping(d) == (200, b"OK"), 10), ping(d)
        assert b'"t"' in (data / "nsqd.dat").read_bytes()
    finally:
        assert d.stop() == 0
