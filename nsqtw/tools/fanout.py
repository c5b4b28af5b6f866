"""``nsqtw-bench fanout``: one topic with many channels, and a bystander's latency while it fans out.

Against any nsqd (Go or nsqtw)::

    nsqtw-bench fanout --nsqd-tcp-address=127.0.0.1:4150 --nsqd-http-address=127.0.0.1:4151 \\
        --channels=50,500,5000 --mode=pub,mpub

For each channel count and mode: a topic is made with that many channels
(no consumers), then one publisher sends the messages, each PUB or MPUB
answered before the next, from one connection. The copy rate is the copies
(messages × channels) over the time from the first publish until the
channels' depths in ``/stats`` add up to all of them (read once the last
publish is answered, every 20 ms: the last channel's depth, and all of
them once it has every message; the time is taken before that last
reading, and the bystander stops there). Meanwhile a bystander,
in its own process, takes turns at ``GET /ping`` and a ``PUB`` to a topic
of its own, each on its own connection; its p50 and worst latency are the
node's responsiveness during the fan-out. The topic is deleted at the end.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing as mp
import socket
import struct
import time
from dataclasses import asdict, dataclass
from typing import Any

from nsqtw.protocol.wire import MAGIC_V2, encode_command, encode_mpub
from nsqtw.tools.scale import _post

__all__ = ["FanoutResult", "run_fanout"]

#: how often the channels' depths are read from /stats once every publish is answered
POLL_INTERVAL = 0.02
#: the bystander's pause between rounds (a /ping, then a PUB)
BYSTANDER_PAUSE = 0.005


@dataclass
class FanoutResult:
    """One fan-out: copies/s and the bystander's latencies (ms) while it ran."""

    channels: int
    mode: str
    messages: int
    seconds: float
    copies_per_s: float
    ping_p50_ms: float
    ping_max_ms: float
    pub_p50_ms: float
    pub_max_ms: float

    def text(self) -> str:
        return (f"fanout: {self.channels} channels, {self.messages} messages by {self.mode} - "
                f"{self.copies_per_s:,.0f} copies/s ({self.seconds:.2f}s) - bystander /ping p50 "
                f"{self.ping_p50_ms:.1f}ms max {self.ping_max_ms:.1f}ms - PUB p50 {self.pub_p50_ms:.1f}ms "
                f"max {self.pub_max_ms:.1f}ms")

    def json(self) -> str:
        return json.dumps({"mode": "fanout", **asdict(self)})


def _address(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


class _V2:
    """A blocking V2 connection that sends a command and reads its answer (heartbeats answered)."""

    def __init__(self, address: str) -> None:
        self.sock = socket.create_connection(_address(address), timeout=120)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(MAGIC_V2)
        self._buf = b""

    def _read(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RuntimeError("nsqd closed the connection")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def ask(self, command: bytes) -> None:
        self.sock.sendall(command)
        while True:
            size, frame_type = struct.unpack(">ii", self._read(8))
            data = self._read(size - 4)
            if frame_type == 0 and data == b"_heartbeat_":
                self.sock.sendall(b"NOP\n")
                continue
            if frame_type != 0 or data != b"OK":
                raise RuntimeError(f"nsqd answered {data[:200]!r}")
            return

    def close(self) -> None:
        self.sock.close()


def _publisher(tcp: str, topic: str, mode: str, messages: int, batch: int, size: int, out: Any) -> None:
    try:
        conn = _V2(tcp)
        body = b"f" * size
        if mode == "pub":
            commands = [encode_command(b"PUB", topic.encode(), body=body)] * messages
        else:
            commands = [encode_mpub(topic.encode(), [body] * min(batch, messages - i))
                        for i in range(0, messages, batch)]
        started = time.time()
        out.put(("started", started))
        for command in commands:
            conn.ask(command)
        conn.close()
        out.put(("published", time.time() - started))
    except Exception as e:
        out.put(("error", f"publisher: {e!r}"))


def _bystander(tcp: str, http_address: str, stop: Any, out: Any) -> None:
    try:
        conn = http.client.HTTPConnection(*_address(http_address), timeout=120)
        pub = _V2(tcp)
        command = encode_command(b"PUB", b"fanout_bystander", body=b"b")
        pings: list[float] = []
        pubs: list[float] = []
        while not stop.is_set():
            t = time.perf_counter()
            conn.request("GET", "/ping")
            conn.getresponse().read()
            pings.append(time.perf_counter() - t)
            t = time.perf_counter()
            pub.ask(command)
            pubs.append(time.perf_counter() - t)
            time.sleep(BYSTANDER_PAUSE)
        pub.close()
        out.put(("bystander", (pings, pubs)))
    except Exception as e:
        out.put(("error", f"bystander: {e!r}"))


def _depth(conn: http.client.HTTPConnection, topic: str, channel: str = "") -> int:
    """The depths of the topic's channels added up (of one channel, when named)."""
    only = f"&channel={channel}" if channel else ""
    conn.request("GET", f"/stats?format=json&topic={topic}{only}&include_clients=false")
    response = conn.getresponse()
    stats = json.loads(response.read())
    stats = stats.get("data", stats)
    return sum(c["depth"] for t in stats["topics"] if t["topic_name"] == topic for c in t["channels"])


def _p50_max(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    values = sorted(values)
    return values[len(values) // 2] * 1e3, values[-1] * 1e3


def run_fanout(tcp: str, http_address: str, channels: int, mode: str, messages: int, batch: int = 100,
               size: int = 100, topic: str = "fanout", timeout: float = 600.0) -> FanoutResult:
    """Make the topic and its channels, fan ``messages`` out, measure, delete the topic; see the module."""
    if mode not in ("pub", "mpub"):
        raise ValueError(f"mode must be pub or mpub, not {mode!r}")
    conn = http.client.HTTPConnection(*_address(http_address), timeout=120)
    _post(conn, f"/topic/create?topic={topic}")
    for c in range(channels):
        _post(conn, f"/channel/create?topic={topic}&channel=c{c}")
    _post(conn, "/topic/create?topic=fanout_bystander")
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    stop = ctx.Event()
    bystander = ctx.Process(target=_bystander, args=(tcp, http_address, stop, out))
    publisher = ctx.Process(target=_publisher, args=(tcp, topic, mode, messages, batch, size, out))
    bystander.start()
    time.sleep(0.2)  # the bystander's connections are open before the load starts
    publisher.start()
    got: dict[str, Any] = {}
    try:
        # /stats is read only once every publish was answered: read all along, it would load
        # the daemon (thousands of channels each time) during the very time it measures
        while "published" not in got:
            kind, value = out.get(timeout=timeout)
            got[kind] = value
            if kind == "error":
                raise RuntimeError(value)
        want = messages * channels
        deadline = time.time() + timeout
        last = f"c{channels - 1}"
        # The last channel's depth until it has every message: a /stats of thousands of channels
        # is itself a load. Then the bystander stops, and all the channels' depths are read: the
        # fan-out ended no later than that reading began.
        while True:
            if time.time() > deadline:
                raise RuntimeError(f"fan-out not done in {timeout}s")
            if _depth(conn, topic, last) >= messages:
                stop.set()
                ended = time.time()
                if _depth(conn, topic) >= want:
                    break
            time.sleep(POLL_INTERVAL)
        seconds = ended - got["started"]
    finally:
        stop.set()
        while "bystander" not in got and "error" not in got:
            kind, value = out.get(timeout=timeout)
            got[kind] = value
        for p in (publisher, bystander):
            p.join(timeout)
    if "error" in got:
        raise RuntimeError(got["error"])
    pings, pubs = got["bystander"]
    _post(conn, f"/topic/delete?topic={topic}")
    _post(conn, "/topic/delete?topic=fanout_bystander")
    conn.close()
    return FanoutResult(channels, mode, messages, round(seconds, 3), round(messages * channels / seconds),
                        *(round(x, 2) for x in (*_p50_max(pings), *_p50_max(pubs))))


def messages_for(channels: int, copies: int, most: int = 10_000) -> int:
    """Messages for about ``copies`` copies over ``channels``, at most ``most`` (a channel's memory queue)."""
    return max(1, min(most, copies // max(1, channels)))
