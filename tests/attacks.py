"""Hostile loads against a live nsqd, with a well-behaved bystander watching.

Used by tests/reliability/test_fairness.py (small sizes, bounds for a
loaded CI machine) and by benchmarks/attack_compare.py (full sizes, Go nsqd and
nsqtw side by side). Each attack runs while a :class:`Bystander` publishes
one message at a time and times each round trip, and a consumer with a 1 s
heartbeat answers its heartbeats; the result says how the bystander fared
and whether the consumer was cut.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import subprocess
import sys
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
        return (_timings("bystander round trips", self.round_trips)
                + f"; heartbeat consumer {'CUT' if self.consumer_cut else 'kept'}"
                + (f"; bystander error {self.bystander_error}" if self.bystander_error else ""))


def _timings(label: str, times: list[float]) -> str:
    """How many, the median and the worst of a bystander's timings."""
    ordered = sorted(times)
    p50 = ordered[len(ordered) // 2] if ordered else float("nan")
    worst = ordered[-1] if ordered else float("inf")
    return f"{label}: {len(ordered)}, median {p50 * 1000:.1f} ms, worst {worst * 1000:.0f} ms"


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


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CHILD = ("import json, sys; sys.path.insert(0, sys.argv[1]); from tests.attacks import ATTACKS; "
          "r = ATTACKS[sys.argv[2]](*json.loads(sys.argv[3])); r.pop('socket', None); print(json.dumps(r))")


def in_process(name: str, *args: Any) -> dict[str, Any]:
    """Run attack ``name`` in a Python process of its own and return its result.

    A client that works as hard as it can (a REQ storm, a REGISTER flood)
    holds its Python process's GIL; a bystander's threads in that process
    would then wait for the GIL, not for the daemon. In its own process
    the attack leaves the bystander measuring the daemon alone.
    """
    done = subprocess.run([sys.executable, "-c", _CHILD, _ROOT, name, json.dumps(args)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    result: dict[str, Any] = json.loads(done.stdout)
    return result


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
    return _timed_request("PUT", f"http://{http}/config/nsqlookupd_tcp_addresses", body)


def _timed_request(method: str, url: str, body: bytes, timeout: float = 60) -> dict[str, Any]:
    """One HTTP request: its status, the start of its answer, and how long it took."""
    request = urllib.request.Request(url, data=body, method=method)
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
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


def warm_up(http: str) -> None:
    """One routed HTTP request (``GET /info``): nsqtw imports its HTTP router at the first one."""
    with urllib.request.urlopen(f"http://{http}/info", timeout=30) as r:
        r.read()


def http_mpub_lines(http: str, size: int = 5 * 1024 * 1024, topic: str = "bigmpub") -> dict[str, Any]:
    """``POST /mpub`` of ``size`` bytes of one-byte lines (``x\\n`` repeated): one huge batch."""
    body = b"x\n" * (size // 2)
    return {"messages": len(body) // 2, **_timed_request("POST", f"http://{http}/mpub?topic={topic}", body, 120)}


PING = b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"


def pipelined_pings(http: str, count: int = 20_000) -> dict[str, Any]:
    """``count`` keep-alive ``GET /ping`` requests in one write on one connection; all answers read."""
    sock = _connect(http, timeout=60)
    started = time.monotonic()
    sender = threading.Thread(target=sock.sendall, args=(PING * count,), daemon=True)
    sender.start()
    data = bytearray()
    statuses: list[bytes] = []
    pos = 0
    while len(statuses) < count:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        data += chunk
        while True:
            end = data.find(b"\r\n\r\n", pos)
            if end < 0:
                break
            head = bytes(data[pos:end])
            length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
            if len(data) < end + 4 + length:
                break
            statuses.append(head.split(b" ", 2)[1] + b" " + bytes(data[end + 4:end + 4 + length]))
            pos = end + 4 + length
        del data[:pos]
        pos = 0
    elapsed = time.monotonic() - started
    sender.join(10)
    sock.close()
    ok = sum(1 for s in statuses if s == b"200 OK")
    return {"answers": len(statuses), "ok": ok, "seconds": round(elapsed, 3), "rate": round(len(statuses) / elapsed)}


def register_flood(lookupd_tcp: str, count: int = 100_000, prefix: str = "flood") -> dict[str, Any]:
    """A fake nsqd IDENTIFYs, then sends ``count`` REGISTERs (topic ``prefix<i>``) in one stream."""
    sock = _connect(lookupd_tcp, timeout=60)
    body = json.dumps({"broadcast_address": "127.0.0.1", "tcp_port": 4150, "http_port": 4151,
                       "version": "1.3.0", "hostname": "flooder"}).encode()
    sock.sendall(b"  V1IDENTIFY\n" + struct.pack(">i", len(body)) + body)
    size = struct.unpack(">i", _recv_exact(sock, 4))[0]
    _recv_exact(sock, size)
    payload = b"".join(b"REGISTER %s%d\n" % (prefix.encode(), i) for i in range(count))
    started = time.monotonic()
    sender = threading.Thread(target=sock.sendall, args=(payload,), daemon=True)
    sender.start()
    answers = 0
    ok = 0
    buf = b""
    while answers < count:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        buf += chunk
        pos = 0
        while len(buf) - pos >= 4:
            (size,) = struct.unpack_from(">i", buf, pos)
            if len(buf) - pos - 4 < size:
                break
            ok += buf[pos + 4:pos + 4 + size] == b"OK"
            answers += 1
            pos += 4 + size
        buf = buf[pos:]
    elapsed = time.monotonic() - started
    sender.join(10)
    return {"registers": answers, "ok": ok, "seconds": round(elapsed, 3), "rate": round(answers / elapsed),
            "socket": sock}


class LookupBystander:
    """A client asking nsqlookupd ``GET /lookup?topic=bystander`` in a loop (keep-alive), times timed."""

    def __init__(self, http: str) -> None:
        self.times: list[float] = []
        self.error = ""
        self._http = http
        self._stop = threading.Event()
        request = urllib.request.Request(f"http://{http}/topic/create?topic=bystander", data=b"", method="POST")
        urllib.request.urlopen(request, timeout=10).read()
        self._thread = threading.Thread(target=self._ask, daemon=True)

    def __enter__(self) -> LookupBystander:
        self._thread.start()
        time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    @property
    def worst(self) -> float:
        return max(self.times, default=float("inf"))

    def summary(self) -> str:
        return _timings("bystander /lookup", self.times) + (f"; error {self.error}" if self.error else "")

    def _ask(self) -> None:
        import http.client

        host, port = self._http.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                conn.request("GET", "/lookup?topic=bystander")
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    raise RuntimeError(response.status)
                self.times.append(time.monotonic() - started)
                time.sleep(0.01)
        except Exception as e:  # noqa: BLE001 - reported, not raised, from the thread
            self.error = repr(e)
        finally:
            conn.close()


def req_storm(tcp: str, seconds: float, messages: int = 2500, rdy: int = 2500,
              topic: str = "reqstorm") -> dict[str, Any]:
    """A consumer REQs (timeout 0) every message it gets for ``seconds``, then FINs them all.

    ``messages`` are published first. Returns the REQ rate, and how many
    distinct messages were FINed at the end (each once: a FIN of an id
    already FINed would draw an error frame, counted in ``errors``).
    """
    pub_sock = _connect(tcp)
    pub_sock.sendall(MAGIC)
    for start in range(0, messages, 1000):
        pub_sock.sendall(mpub(topic, [b"%d" % i for i in range(start, min(messages, start + 1000))]))
        _read_frame(pub_sock)
    pub_sock.close()
    sock = _connect(tcp, timeout=30)
    sock.sendall(MAGIC + f"SUB {topic} c\nRDY {rdy}\n".encode())
    reqs = 0
    errors = 0
    finned: dict[bytes, int] = {}
    buf = b""
    started = time.monotonic()
    req_until = started + seconds
    last_new = started
    while True:
        now = time.monotonic()
        finning = now >= req_until
        if finning:
            if len(finned) >= messages or now - max(last_new, req_until) > 5:
                break
            sock.settimeout(0.5)
        try:
            chunk = sock.recv(1 << 20)
        except TimeoutError:
            continue
        if not chunk:
            break
        buf += chunk
        out = []
        pos = 0
        end = len(buf)
        while end - pos >= 8:
            size, kind = struct.unpack_from(">ii", buf, pos)
            if end - pos - 4 < size:
                break
            if kind == 2:
                msg_id = buf[pos + 18:pos + 34]
                if finning:
                    out.append(b"FIN " + msg_id + b"\n")
                    finned[msg_id] = finned.get(msg_id, 0) + 1
                    last_new = now
                else:
                    out.append(b"REQ " + msg_id + b" 0\n")
                    reqs += 1
            elif kind == 1:
                errors += 1
            elif buf[pos + 8:pos + 4 + size] == b"_heartbeat_":
                out.append(b"NOP\n")
            pos += 4 + size
        buf = buf[pos:]
        if out:
            sock.sendall(b"".join(out))
    elapsed = min(time.monotonic(), req_until) - started
    sock.close()
    return {"reqs": reqs, "rate": round(reqs / max(elapsed, 1e-9)), "finned": len(finned),
            "finned_twice": sum(1 for n in finned.values() if n > 1), "errors": errors}


ATTACKS: dict[str, Callable[..., dict[str, Any]]] = {
    "deflate_bomb": deflate_bomb,
    "mpub_flood": mpub_flood,
    "churn": churn,
    "huge_config": huge_config,
    "endless_chunked": endless_chunked,
    "http_mpub_lines": http_mpub_lines,
    "pipelined_pings": pipelined_pings,
    "register_flood": register_flood,
    "req_storm": req_storm,
}
