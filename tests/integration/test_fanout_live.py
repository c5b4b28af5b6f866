"""A burst of PUBs to a topic with many channels does not stall the node (a real daemon).

Two kinds of channels: without clients (they share the topic's messages,
nsqtw/core/parking.py) and each with a subscribed client that takes nothing
(RDY 0: each takes its copies one by one, in bounded slices per reactor turn).
"""

from __future__ import annotations

import http.client
import json
import socket
import struct
import threading
import time

import pytest

from nsqtw.protocol.wire import MAGIC_V2, encode_command
from tests.rawclient import Client

MESSAGES = 500
#: generous for a loaded 2-core CI machine; a hand-off of the whole burst in one turn takes seconds
PING_BOUND = 1.0


def _conn(address: str) -> http.client.HTTPConnection:
    host, port = address.rsplit(":", 1)
    return http.client.HTTPConnection(host, int(port), timeout=60)


def _post(conn: http.client.HTTPConnection, path: str) -> None:
    conn.request("POST", path, body=b"")
    response = conn.getresponse()
    assert response.status == 200, response.read()
    response.read()


def _depths(conn: http.client.HTTPConnection) -> list[int]:
    conn.request("GET", "/stats?format=json&topic=fan&include_clients=false")
    stats = json.loads(conn.getresponse().read())
    return [c["depth"] for t in stats["topics"] if t["topic_name"] == "fan" for c in t["channels"]]


@pytest.mark.parametrize(("channels", "subscribed"), [(2000, False), (500, True)], ids=["idle", "subscribed"])
def test_a_burst_to_many_channels_leaves_ping_responsive(daemon_factory, channels: int, subscribed: bool) -> None:
    """500 PUBs in one burst to 2,000 channels without clients, or to 500 channels each with a
    client at RDY 0: a bystander's /ping never waits a second, and every channel gets all 500."""
    d = daemon_factory()
    conn = _conn(d.http_address)
    _post(conn, "/topic/create?topic=fan")
    subscribers: list[socket.socket] = []
    host, port = d.tcp_address.rsplit(":", 1)
    for i in range(channels):
        _post(conn, f"/channel/create?topic=fan&channel=c{i}")
        if subscribed:
            sub = socket.create_connection((host, int(port)), timeout=60)
            sub.sendall(MAGIC_V2 + b"SUB fan c%d\n" % i)
            assert sub.recv(64) == struct.pack(">ii", 6, 0) + b"OK"
            subscribers.append(sub)

    pings: list[float] = []
    stop = threading.Event()

    def bystander() -> None:
        ping = _conn(d.http_address)
        while not stop.is_set():
            started = time.monotonic()
            ping.request("GET", "/ping")
            assert ping.getresponse().read() == b"OK"
            pings.append(time.monotonic() - started)
            time.sleep(0.005)

    thread = threading.Thread(target=bystander, daemon=True)
    thread.start()
    time.sleep(0.2)
    pub = socket.create_connection((host, int(port)), timeout=60)
    pub.sendall(MAGIC_V2 + encode_command(b"PUB", b"fan", body=b"m" * 100) * MESSAGES)  # one burst
    answers = b""
    ok = struct.pack(">ii", 6, 0) + b"OK"
    while len(answers) < MESSAGES * len(ok):
        chunk = pub.recv(65536)
        assert chunk
        answers += chunk
    assert answers == ok * MESSAGES
    deadline = time.monotonic() + 120
    while sum(_depths(conn)) < channels * MESSAGES and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    thread.join(30)
    pub.close()
    assert _depths(conn) == [MESSAGES] * channels
    assert pings and max(pings) < PING_BOUND, (len(pings), max(pings))
    for sub in subscribers:
        sub.close()


def test_pubs_to_full_channels_without_clients_reach_each_once(daemon_factory) -> None:
    """--mem-queue-size=20, five channels without clients, 300 PUBs each answered before the
    next (past the first 20 they gather in the topic, then reach the channels' disk queues
    together): every channel's depth comes to 300, and a consumer on each gets all 300 once."""
    d = daemon_factory("--mem-queue-size=20")
    conn = _conn(d.http_address)
    _post(conn, "/topic/create?topic=fan")
    names = [f"c{i}" for i in range(5)]
    for name in names:
        _post(conn, f"/channel/create?topic=fan&channel={name}")
    pub = Client(d.tcp_address, timeout=60)
    bodies = [b"m%03d" % i for i in range(300)]
    for body in bodies:
        pub.pub("fan", body)  # answered OK before the next
    pub.close()
    deadline = time.monotonic() + 60
    while _depths(conn) != [300] * 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _depths(conn) == [300] * 5
    for name in names:
        sub = Client(d.tcp_address, timeout=30)
        sub.sub("fan", name, 300)
        got = [m.body for m in sub.messages(300, fin=True)]
        assert sorted(got) == bodies, name
        assert sub.nothing_for(0.5) == []  # nothing more: each once
        sub.close()
    assert _depths(conn) == [0] * 5
