"""A data path on a disk that fills up, then gets space back.

Where the test may mount (root), the data path is a real 256 KiB tmpfs that
fills and is then grown with ``remount``; the same scenario also runs
everywhere with an injected fault in the disk layer (writes fail with
ENOSPC while a flag file exists, see :mod:`tests.reliability.faults`).
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from tests.daemon import Daemon
from tests.rawclient import Client, subscribe
from tests.reliability.conftest import assert_no_traceback, http_raw, ping, status_of, wait_for
from tests.reliability.faults import faulty_daemon_code

DiskFull = tuple[Daemon, Callable[[], None], Callable[[], None]]


@pytest.fixture(params=["tmpfs", "injected"])
def full_disk(request, tmp_path) -> Iterator[DiskFull]:
    """A running daemon, ``fill()`` (or let publishing fill it) and ``make_room()``."""
    if request.param == "tmpfs":
        path = tmp_path / "fs"
        path.mkdir()
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(path)],
                                capture_output=True)
        if result.returncode != 0:
            pytest.skip("cannot mount tmpfs here (the injected variant covers it): "
                        + result.stderr.decode().strip())
        d = Daemon(str(path), "--mem-queue-size=0", "--max-bytes-per-file=65536")
        d.start()
        try:
            yield d, lambda: None, lambda: subprocess.run(
                ["mount", "-o", "remount,size=8m", str(path)], check=True)
        finally:
            d.stop()
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
    else:
        path = tmp_path / "data"
        path.mkdir()
        flag = str(tmp_path / "disk-is-full")
        d = Daemon(str(path), "--mem-queue-size=0", "--max-bytes-per-file=65536",
                   code=faulty_daemon_code(), env={"NSQTW_TEST_DISK_FULL_FLAG": flag})
        d.start()
        try:
            yield d, lambda: open(flag, "w").close(), lambda: os.unlink(flag)
        finally:
            d.stop()


def test_disk_full_then_space_returns(full_disk) -> None:
    """Disk full: E_PUB_FAILED, unhealthy /ping and /stats, HTTP /pub refused; space back: publishing
    recovers and every acknowledged message is delivered."""
    d, fill, make_room = full_disk
    acked = []
    body = b"x" * 1000
    error = None
    for i in range(1000):
        if i == 20:
            fill()
        c = Client(d.tcp_address)
        c.cmd("PUB", "t", body=b"%05d" % i + body)
        ftype, data = c.response(timeout=5)
        c.close()
        if ftype != 0:
            error = data
            break
        acked.append(b"%05d" % i + body)
    assert error is not None and error.startswith(b"E_PUB_FAILED PUB failed"), error
    status, text = ping(d)
    assert status == 500 and text.startswith(b"NOK"), (status, text)
    with urllib.request.urlopen(f"http://{d.http_address}/stats?format=json") as r:
        assert json.load(r)["health"].startswith("NOK")
    response = http_raw(d.http_address, b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                        b"Content-Length: 4\r\n\r\nhttp")
    assert status_of(response) == 503 and response.endswith(b'{"message":"EXITING"}'), response

    make_room()
    assert wait_for(lambda: ping(d)[0] == 200, 10)
    assert ping(d) == (200, b"OK")
    Client(d.tcp_address).pub("t", b"after")
    acked.append(b"after")

    got = {m.body for m in subscribe(d.tcp_address, "t", "c", rdy=200).drain()}
    assert set(acked) <= got
    assert_no_traceback(d)
