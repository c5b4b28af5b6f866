"""A burst of PUBs to a topic with thousands of channels does not stall the node (a real daemon)."""

from __future__ import annotations

import http.client
import json
import socket
import struct
import threading
import time

from nsqtw.protocol.wire import MAGIC_V2, encode_command

CHANNELS = 2000
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


def test_a_burst_to_thousands_of_channels_leaves_ping_responsive(daemon_factory) -> None:
    """2,000 channels, 500 PUBs in one burst: a bystander's /ping never waits a second, and every
    channel gets all 500 messages (the hand-off goes in bounded slices per reactor turn)."""
    d = daemon_factory()
    conn = _conn(d.http_address)
    _post(conn, "/topic/create?topic=fan")
    for i in range(CHANNELS):
        _post(conn, f"/channel/create?topic=fan&channel=c{i}")

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
    host, port = d.tcp_address.rsplit(":", 1)
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
    while sum(_depths(conn)) < CHANNELS * MESSAGES and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    thread.join(30)
    pub.close()
    assert _depths(conn) == [MESSAGES] * CHANNELS
    assert pings and max(pings) < PING_BOUND, (len(pings), max(pings))
