"""A data path on a tiny filesystem fills up, then space returns (tmpfs, as root)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from tests.rawclient import Client, subscribe


@pytest.fixture
def tiny_fs(tmp_path):
    """A 256 KiB tmpfs; the test can grow it with remount."""
    path = tmp_path / "fs"
    path.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(path)],
                            capture_output=True)
    if result.returncode != 0:
        pytest.skip("cannot mount tmpfs here: " + result.stderr.decode().strip())
    yield path
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def ping(daemon) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://{daemon.http_address}/ping") as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_disk_full_then_space_returns(tiny_fs, daemon_factory) -> None:
    """Disk full: E_PUB_FAILED, unhealthy /ping; space back: publishing recovers; no acknowledged message lost."""
    d = daemon_factory("--mem-queue-size=0", "--max-bytes-per-file=65536", data_path=str(tiny_fs))
    acked = []
    body = b"x" * 1000
    error = None
    for i in range(1000):
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

    subprocess.run(["mount", "-o", "remount,size=8m", str(tiny_fs)], check=True)
    deadline = time.monotonic() + 10
    while ping(d)[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ping(d) == (200, b"OK")
    Client(d.tcp_address).pub("t", b"after")
    acked.append(b"after")

    got = {m.body for m in subscribe(d.tcp_address, "t", "c", rdy=200).drain()}
    assert set(acked) <= got
