"""A real client library (pynsq from PyPI) against a real nsqtw on loopback."""

from __future__ import annotations

import json
import socket
import struct
import urllib.request

import pytest

from tests.daemon import WORKERS
from tests.integration.pynsq_driver import consume, publish


@pytest.fixture(scope="module", params=WORKERS, ids=lambda n: f"workers={n}")
def workers(request) -> int:
    """Every test here runs against one process and against ``--workers=2`` (conftest.py)."""
    return int(request.param)


def stats(daemon) -> dict:
    with urllib.request.urlopen(f"http://{daemon.http_address}/stats?format=json") as r:
        return json.load(r)


def test_publish_and_consume(nsqd) -> None:
    """PUB and MPUB through nsq.Writer arrive at nsq.Reader, every body once."""
    assert publish(nsqd.tcp_address, "t", [b"one", b"two"]) == [b"OK", b"OK"]
    assert publish(nsqd.tcp_address, "t", [b"three", b"four"], mpub=True) == [b"OK"]
    got = consume(nsqd.tcp_address, "t", "c", 4, max_in_flight=10)
    assert sorted(m.body for m in got) == [b"four", b"one", b"three", b"two"]
    assert all(m.attempts == 1 for m in got)
    assert all(len(m.id) == 16 for m in got)


def create_channel(address: str, topic: str, channel: str) -> None:
    """SUB over a raw socket creates the channel (then the client leaves)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as s:
        s.sendall(f"  V2SUB {topic} {channel}\n".encode())
        assert s.recv(10) == struct.pack(">ii", 6, 0) + b"OK"


def test_fan_out_to_two_channels(nsqd) -> None:
    """Two channels of one topic each receive every message."""
    create_channel(nsqd.tcp_address, "fan", "a")
    create_channel(nsqd.tcp_address, "fan", "b")
    publish(nsqd.tcp_address, "fan", [b"%d" % i for i in range(20)], mpub=True)
    a = consume(nsqd.tcp_address, "fan", "a", 20, max_in_flight=20)
    b = consume(nsqd.tcp_address, "fan", "b", 20, max_in_flight=20)
    assert sorted(int(m.body) for m in a) == list(range(20))
    assert sorted(int(m.body) for m in b) == list(range(20))


def test_req_redelivers(nsqd) -> None:
    """pynsq's requeue sends REQ; the message comes back with attempts 2."""
    publish(nsqd.tcp_address, "req", [b"x"])
    seen = []

    def handler(msg):
        seen.append(msg.attempts)
        if msg.attempts >= 2:
            return True
        msg.enable_async()
        msg.requeue(backoff=False, delay=0)
        return None

    consume(nsqd.tcp_address, "req", "c", 2, handler=handler)
    assert seen == [1, 2]


def test_timeout_redelivers_and_touch(daemon_factory) -> None:
    """An unfinished message times out and returns with attempts+1; TOUCH is accepted."""
    d = daemon_factory("--msg-timeout=1s")
    publish(d.tcp_address, "slow", [b"x"])
    seen = []

    def handler(msg):
        seen.append(msg.attempts)
        if msg.attempts == 1:
            msg.enable_async()
            msg.touch()
            return None  # never finished: times out
        return True

    consume(d.tcp_address, "slow", "c", 2, handler=handler, timeout=15)
    assert seen == [1, 2]
    [topic] = [t for t in stats(d)["topics"] if t["topic_name"] == "slow"]
    assert topic["channels"][0]["timeout_count"] == 1
