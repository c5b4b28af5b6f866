"""Hostile loads against a live nsqd, with a well-behaved bystander watching.

Used by tests/reliability/test_fairness.py (small sizes, bounds for a
loaded CI machine) and by tools/attack_compare.py (full sizes, Go nsqd and
nsqtw side by side). Each attack runs while a :class:`Bystander` publishes
one message at a time and times each round trip, and a consumer with a 1 s
heartbeat answers its heartbeats; the result says how the bystander fared
and whether the consumer was cut.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MAGIC = b"  V2"


def _connect(address: str, timeout: float = 10.0) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_frame(sock: socket.socket) -> tuple[int, bytes]:
    head = _recv_exact(sock, 8)
    size, kind = struct.unpack(">ii", head)
    return kind, _recv_exact(sock, size - 4)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _identify(body: dict[str, Any]) -> bytes:
    raw = json.dumps(body).encode()
    return b"IDENTIFY\n" + struct.pack(">i", len(raw)) + raw


def pub(topic: str, body: bytes) -> bytes:
    return f"PUB {topic}\n".encode() + struct.pack(">i", len(body)) + body


def mpub(topic: str, bodies: list[bytes]) -> bytes:
    payload = struct.pack(">i", len(bodies)) + b"".join(struct.pack(">i", len(b)) + b for b in bodies)
    return f"MPUB {topic}\n".encode() + struct.pack(">i", len(payload)) + payload


@dataclass
class Watch:
    """What the bystander and the heartbeat consumer saw during an attack."""

    round_trips: list[float] = field(default_factory=list)
    consumer_cut: bool = False
    bystander_error: str = ""

    @property
    def worst(self) -> float:
        return max(self.round_trips, default=float("inf"))

    def summary(self) -> str:
        rts = sorted(self.round_trips)
        p50 = rts[len(rts) // 2] if rts else float("nan")
        return (f"bystander round trips: {len(rts)}, median {p50 * 1000:.1f} ms, worst {self.worst * 1000:.0f} ms; "
                f"heartbeat consumer {'CUT' if self.consumer_cut else 'kept'}"
                + (f"; bystander error {self.bystander_error}" if self.bystander_error else ""))


class Bystander:
    """A publisher (one PUB at a time, round trips timed) and a 1 s-heartbeat consumer, in threads."""

    def __init__(self, tcp: str) -> None:
        self.watch = Watch()
        self._stop = threading.Event()
        self._pub = _connect(tcp)
        self._pub.sendall(MAGIC)
        self._sub = _connect(tcp)
        self._sub.sendall(MAGIC + _identify({"heartbeat_interval": 1000}) + b"SUB bystander_hb c\n")
        _read_frame(self._sub)
        _read_frame(self._sub)
        self._threads = [threading.Thread(target=self._publish, daemon=True),
                         threading.Thread(target=self._heartbeats, daemon=True)]

    def __enter__(self) -> Watch:
        for t in self._threads:
            t.start()
        time.sleep(0.2)
        return self.watch

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)
        self._pub.close()
        self._sub.close()

    def _publish(self) -> None:
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                self._pub.sendall(pub("bystander", b"x"))
                kind, data = _read_frame(self._pub)
                while data == b"_heartbeat_":
                    self._pub.sendall(b"NOP\n")
                    kind, data = _read_frame(self._pub)
                if data != b"OK":
                    raise RuntimeError(data)
                self.watch.round_trips.append(time.monotonic() - started)
                time.sleep(0.01)
        except Exception as e:  # noqa: BLE001 - reported, not raised, from the thread
            self.watch.bystander_error = repr(e)

    def _heartbeats(self) -> None:
        self._sub.settimeout(0.2)
        while not self._stop.is_set():
            try:
                _, data = _read_frame(self._sub)
            except TimeoutError:
                continue
            except OSError:
                self.watch.consumer_cut = True
                return
            if data == b"_heartbeat_":
                self._sub.sendall(b"NOP\n")
        # still connected? a closed connection reads as EOF at once
        self._sub.setblocking(False)
        try:
            if self._sub.recv(1, socket.MSG_PEEK) == b"":
                self.watch.consumer_cut = True
        except BlockingIOError:
            pass
        except OSError:
            self.watch.consumer_cut = True


# --- the attacks -------------------------------------------------------------------


def deflate_bomb(tcp: str, inflated: int, seconds: float) -> dict[str, Any]:
    """A client negotiates deflate and sends a little that inflates to ``inflated`` bytes of NOPs."""
    sock = _connect(tcp)
    sock.sendall(MAGIC + _identify({"deflate": True, "deflate_level": 6, "feature_negotiation": True}))
    _read_frame(sock)
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = b"NOP\n" * (1 << 16)
    payload = b"".join(comp.compress(block) for _ in range(inflated // len(block))) + comp.flush(zlib.Z_SYNC_FLUSH)
    sock.settimeout(seconds + 5)
    sent = 0
    try:
        sock.sendall(payload)
        sent = len(payload)
    except OSError:
        pass
    time.sleep(seconds)
    sock.close()
    return {"compressed_bytes": len(payload), "sent": sent}


def mpub_flood(tcp: str, publishers: int, seconds: float, batch: int = 100, size: int = 10) -> dict[str, Any]:
    """``publishers`` connections each pipeline ``batch`` MPUBs of ``size`` tiny messages, then read the OKs."""
    stop = time.monotonic() + seconds
    counts = [0] * publishers

    def flood(i: int) -> None:
        sock = _connect(tcp)
        sock.sendall(MAGIC)
        command = mpub("flood", [b"m"] * size) * batch
        while time.monotonic() < stop:
            sock.sendall(command)
            for _ in range(batch):
                _read_frame(sock)
            counts[i] += batch * size
        sock.close()

    threads = [threading.Thread(target=flood, args=(i,), daemon=True) for i in range(publishers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)
    return {"messages": sum(counts), "rate": round(sum(counts) / seconds)}


def churn(tcp: str, http: str, cycles: int) -> dict[str, Any]:
    """Connect and close ``cycles`` times: a third bare TCP, a third SUB, a third HTTP /ping."""
    started = time.monotonic()
    for i in range(cycles):
        kind = i % 3
        if kind == 0:
            sock = _connect(tcp)
            sock.sendall(MAGIC)
            sock.close()
        elif kind == 1:
            sock = _connect(tcp)
            sock.sendall(MAGIC + b"SUB churn c\n")
            _read_frame(sock)
            sock.close()
        else:
            sock = _connect(http)
            sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            while sock.recv(65536):
                pass
            sock.close()
    elapsed = time.monotonic() - started
    return {"cycles": cycles, "rate": round(cycles / elapsed)}


def huge_config(http: str, addresses: int) -> dict[str, Any]:
    """PUT /config/nsqlookupd_tcp_addresses with ``addresses`` addresses."""
    body = json.dumps([f"127.0.0.{1 + i % 250}:{10000 + i}" for i in range(addresses)]).encode()
    request = urllib.request.Request(f"http://{http}/config/nsqlookupd_tcp_addresses", data=body, method="PUT")
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            status, text = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read()
    return {"status": status, "body": text.decode("utf-8", "replace")[:200],
            "seconds": round(time.monotonic() - started, 3)}


def endless_chunked(http: str, seconds: float) -> dict[str, Any]:
    """POST /pub with a chunked body that never ends; how much is sent before the answer."""
    sock = _connect(http)
    sock.sendall(b"POST /pub?topic=endless HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
    sent = 0
    answer = b""
    stop = time.monotonic() + seconds
    sock.settimeout(0.5)
    while time.monotonic() < stop:
        try:
            sock.sendall(chunk)
            sent += 65536
        except OSError:
            break
        sock.setblocking(False)
        try:
            answer += sock.recv(65536)
        except BlockingIOError:
            pass
        except OSError:
            break
        finally:
            sock.settimeout(0.5)
        if answer:
            break
    sock.close()
    return {"sent_bytes": sent, "status": answer.split(b" ", 2)[1].decode() if answer else None}


ATTACKS: dict[str, Callable[..., dict[str, Any]]] = {
    "deflate_bomb": deflate_bomb,
    "mpub_flood": mpub_flood,
    "churn": churn,
    "huge_config": huge_config,
    "endless_chunked": endless_chunked,
}
