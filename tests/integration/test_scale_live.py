"""A node's thread count does not grow with its topics and channels (one shared disk pool)."""

from __future__ import annotations

import os
import urllib.request


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _post(address: str, path: str) -> None:
    req = urllib.request.Request(f"http://{address}{path}", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


def test_thousand_channels_keep_the_thread_count(daemon_factory) -> None:
    """Creating 1,000 channels (2,000 disk queues with their topics) adds no thread: the pool serves them."""
    d = daemon_factory("--disk-threads=3")
    for i in range(10):
        _post(d.http_address, f"/topic/create?topic=few{i}")
        _post(d.http_address, f"/channel/create?topic=few{i}&channel=c")
    few = _threads(d.proc.pid)
    assert few <= 3 + 4, few  # the reactor, the pool's threads, and at most a few of Python's own
    for i in range(500):
        _post(d.http_address, f"/topic/create?topic=t{i}")
    for i in range(1000):
        _post(d.http_address, f"/channel/create?topic=t{i % 500}&channel=c{i}")
    req = urllib.request.Request(f"http://{d.http_address}/pub?topic=t7", data=b"through the pool")
    with urllib.request.urlopen(req, timeout=30) as r:  # the queues work: a publish goes through
        assert r.read() == b"OK"
    assert _threads(d.proc.pid) == few
    with urllib.request.urlopen(f"http://{d.http_address}/ping", timeout=10) as r:
        assert r.read() == b"OK"
