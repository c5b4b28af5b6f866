"""Hostile inputs sent byte for byte to a live nsqd, and what came back.

One driver serves two callers: ``benchmarks/record_hostile_reference.py`` runs
the cases against Go nsqd v1.3.0 and stores the answers in
``tests/reference/nsqd-1.3.0-hostile.json``; ``tests/integration/
test_hostile_live.py`` runs the same cases against nsqtw and compares. An
answer is what a client sees: the frames or the HTTP status and body, and
whether the daemon then closed the connection. Timings are kept apart
(``seconds``) because they are compared by bounds, not equality.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAGIC = b"  V2"


@dataclass
class Target:
    """Where a daemon listens; ``https`` is empty when it has no HTTPS port."""

    tcp: str
    http: str
    https: str = ""


def _connect(address: str, timeout: float = 5.0) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_all(sock: socket.socket, quiet: float, limit: float = 10.0) -> tuple[bytes, bool]:
    """Bytes until the peer closes or ``quiet`` seconds pass with nothing; (data, closed)."""
    data = b""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        sock.settimeout(quiet)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return data, False
        except ConnectionResetError:
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def _frames(data: bytes, closed: bool) -> list[Any]:
    """V2 frames as [type, text]; heartbeats dropped; "<closed>" last when the peer hung up."""
    out: list[Any] = []
    while len(data) >= 8:
        size, kind = struct.unpack(">ii", data[:8])
        if len(data) < 4 + size:
            break
        body = data[8:4 + size]
        data = data[4 + size:]
        if kind == 2:
            out.append([kind, "<message {}>".format(body[26:].decode("utf-8", "replace"))])
        elif body != b"_heartbeat_":
            out.append([kind, body.decode("utf-8", "replace")])
    if data:
        out.append(["<partial>", len(data)])
    if closed:
        out.append("<closed>")
    return out


def _tcp(target: Target, payload: bytes, quiet: float = 0.5) -> dict[str, Any]:
    with _connect(target.tcp) as sock:
        sock.sendall(MAGIC + payload)
        data, closed = _read_all(sock, quiet)
    return {"frames": _frames(data, closed)}


def _identify(body: bytes) -> bytes:
    return b"IDENTIFY\n" + struct.pack(">i", len(body)) + body


def _http_answer(data: bytes, closed: bool) -> dict[str, Any]:
    if not data:
        return {"status": None, "closed": closed}
    head, _, body = data.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status_line.split(" ", 2)
    return {"status": int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else status_line,
            "body": body.decode("utf-8", "replace"), "closed": closed}


def _http(address: str, request: bytes, quiet: float = 1.0) -> dict[str, Any]:
    with _connect(address) as sock:
        sock.sendall(request)
        data, closed = _read_all(sock, quiet)
    return _http_answer(data, closed)


def _stats_text_status(target: Target) -> int:
    try:
        with urllib.request.urlopen(f"http://{target.http}/stats?format=text", timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _client_field(target: Target, topic: str, field: str) -> Any:
    with urllib.request.urlopen(f"http://{target.http}/stats?format=json&topic={topic}", timeout=10) as r:
        stats = json.load(r)
    for t in stats.get("topics") or []:
        for c in t["channels"]:
            for client in c["clients"]:
                return client[field]
    return None


# --- the cases ------------------------------------------------------------------


def identify_lone_surrogate(target: Target) -> dict[str, Any]:
    """IDENTIFY with an unpaired surrogate escape; /stats?format=text while it is connected."""
    with _connect(target.tcp) as sock:
        sock.sendall(MAGIC + _identify(b'{"hostname": "\\udfff", "client_id": "\\ud800x"}')
                     + b"SUB hostile_sur c\n")
        data, closed = _read_all(sock, 0.5)
        return {"frames": _frames(data, closed), "stats_text": _stats_text_status(target),
                "client_id": _client_field(target, "hostile_sur", "client_id")}


def identify_nested_array_2000(target: Target) -> dict[str, Any]:
    """IDENTIFY whose body is an array nested 2,000 deep."""
    return _tcp(target, _identify(b"[" * 2000 + b"]" * 2000))


def identify_nested_field_2000(target: Target) -> dict[str, Any]:
    """IDENTIFY with an unknown field nested 2,000 deep (Go ignores unknown fields)."""
    return _tcp(target, _identify(b'{"x":' + b"[" * 2000 + b"]" * 2000 + b', "client_id": "n"}'))


def identify_nested_field_20000(target: Target) -> dict[str, Any]:
    """IDENTIFY with a field nested 20,000 deep: past Go's 10,000 limit."""
    return _tcp(target, _identify(b'{"x":' + b"[" * 20000 + b"]" * 20000 + b"}"))


def identify_invalid_utf8(target: Target) -> dict[str, Any]:
    """IDENTIFY with raw bytes that are not UTF-8 inside strings."""
    with _connect(target.tcp) as sock:
        sock.sendall(MAGIC + _identify(b'{"client_id": "a\xff\xfeb", "user_agent": "\xc3"}')
                     + b"SUB hostile_utf c\n")
        data, closed = _read_all(sock, 0.5)
        return {"frames": _frames(data, closed),
                "client_id": _client_field(target, "hostile_utf", "client_id"),
                "user_agent": _client_field(target, "hostile_utf", "user_agent")}


def _rdy_then_pub(target: Target, rdy: bytes, topic: str) -> dict[str, Any]:
    with _connect(target.tcp) as sock:
        sock.sendall(MAGIC + f"SUB {topic} c\n".encode() + rdy
                     + f"PUB {topic}\n".encode() + struct.pack(">i", 1) + b"m")
        data, closed = _read_all(sock, 0.5)
    return {"frames": _frames(data, closed)}


def rdy_empty(target: Target) -> dict[str, Any]:
    """``RDY `` with an empty count, then a PUB: is the message delivered?"""
    return _rdy_then_pub(target, b"RDY \n", "hostile_rdy_e")


def rdy_two_spaces(target: Target) -> dict[str, Any]:
    """``RDY  5`` (two spaces), then a PUB."""
    return _rdy_then_pub(target, b"RDY  5\n", "hostile_rdy_s")


def rdy_trailing_space(target: Target) -> dict[str, Any]:
    """``RDY 5 `` (a trailing space), then a PUB."""
    return _rdy_then_pub(target, b"RDY 5 \n", "hostile_rdy_t")


def put_config_nested_100000(target: Target) -> dict[str, Any]:
    """PUT /config/nsqlookupd_tcp_addresses with a JSON array nested 100,000 deep."""
    body = b"[" * 100000 + b"]" * 100000
    return _http(target.http, b"PUT /config/nsqlookupd_tcp_addresses HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)


def put_config_nested_2000(target: Target) -> dict[str, Any]:
    """PUT /config/nsqlookupd_tcp_addresses with an array of an array nested 2,000 deep."""
    body = b"[" * 2000 + b"]" * 2000
    return _http(target.http, b"PUT /config/nsqlookupd_tcp_addresses HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)


def pub_declared_too_big(target: Target) -> dict[str, Any]:
    """POST /pub declaring 100 MB, sent slowly: answered at once, or only after the upload?"""
    start = time.monotonic()
    with _connect(target.http) as sock:
        sock.sendall(b"POST /pub?topic=hostile_big HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: 100000000\r\n\r\n")
        answer: dict[str, Any] = {"status": None}
        for _ in range(20):
            try:
                sock.sendall(b"x" * 65536)
            except OSError:
                break
            data, closed = _read_all(sock, 0.1, limit=0.1)
            if data:
                answer = _http_answer(data + _read_all(sock, 0.3)[0], closed)
                break
    answer["answered_within_s"] = round(time.monotonic() - start, 1) < 3.0
    return answer


def pub_chunked_too_big(target: Target) -> dict[str, Any]:
    """POST /pub with a chunked body that does not end."""
    with _connect(target.http) as sock:
        sock.sendall(b"POST /pub?topic=hostile_chunk HTTP/1.1\r\nHost: x\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
        answer: dict[str, Any] = {"status": None}
        for _ in range(200):  # 13 MB at most
            try:
                sock.sendall(chunk)
            except OSError:
                break
            data, closed = _read_all(sock, 0.01, limit=0.01)
            if data:
                answer = _http_answer(data + _read_all(sock, 0.3)[0], closed)
                break
    return answer


def query_invalid_utf8(target: Target) -> dict[str, Any]:
    """A raw query string that is not UTF-8."""
    return _http(target.http, b"POST /pub?topic=hostile_q&x=\xff\xfe HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Length: 1\r\n\r\nm")


def long_request_line(target: Target) -> dict[str, Any]:
    """A 20 KB request line."""
    return _http(target.http, b"GET /ping?x=" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")


def long_header(target: Target) -> dict[str, Any]:
    """One 20 KB header."""
    return _http(target.http, b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")


def many_headers(target: Target) -> dict[str, Any]:
    """600 small headers (Twisted's default stops at 500)."""
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(600))
    return _http(target.http, b"GET /ping HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")


def huge_header(target: Target) -> dict[str, Any]:
    """Headers past 1 MiB: Go's net/http limit."""
    return _http(target.http, b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1100 * 1024)
                 + b"\r\n\r\n")


def plain_http_on_https(target: Target) -> dict[str, Any]:
    """Plain HTTP sent to the HTTPS port."""
    return _http(target.https, b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")


def _tls_answer_only(frames: list[Any]) -> list[Any]:
    """The negotiation answer is the same JSON from both daemons: keep its tls_v1 flag only."""
    if frames and isinstance(frames[0], list) and frames[0][1].startswith("{"):
        frames[0][1] = "tls_v1={}".format(json.loads(frames[0][1]).get("tls_v1"))
    return frames


def plaintext_after_tls_v1(target: Target) -> dict[str, Any]:
    """IDENTIFY negotiates TLS, then the client goes on in plaintext."""
    with _connect(target.tcp) as sock:
        sock.sendall(MAGIC + _identify(b'{"tls_v1": true, "feature_negotiation": true}'))
        first, _ = _read_all(sock, 0.5)
        sock.sendall(b"NOP\nNOP\nPUB x\n" + b"\x00" * 64)
        data, closed = _read_all(sock, 1.0)
    return {"frames": _tls_answer_only(_frames(first + data, closed))}


def stalled_tls_handshake(target: Target) -> dict[str, Any]:
    """IDENTIFY negotiates TLS, then the client says nothing: nsqd's 5 s handshake deadline."""
    start = time.monotonic()
    with _connect(target.tcp, timeout=10) as sock:
        sock.sendall(MAGIC + _identify(b'{"tls_v1": true, "feature_negotiation": true}'))
        data, closed = _read_all(sock, 8.0)
    return {"frames": _tls_answer_only(_frames(data, closed)), "closed_after_s": round(time.monotonic() - start)}


def tls_then_garbage_handshake(target: Target) -> dict[str, Any]:
    """A TLS ClientHello that is nonsense after the record header."""
    with _connect(target.tcp) as sock:
        sock.sendall(MAGIC + _identify(b'{"tls_v1": true, "feature_negotiation": true}'))
        first, _ = _read_all(sock, 0.5)
        sock.sendall(b"\x16\x03\x01\x00\x10" + b"\x00" * 16)
        data, closed = _read_all(sock, 1.0)
    alert = b""
    if data[:1] == b"\x15":  # a TLS alert record comes first
        size = 5 + struct.unpack(">H", data[3:5])[0]
        alert, data = data[:size], data[size:]
    frames = _frames(first, False) + (["<tls alert>"] if alert else []) + _frames(data, closed)
    return {"frames": _tls_answer_only(frames)}


def tls_ok(target: Target) -> dict[str, Any]:
    """Control: a real TLS upgrade still works (and the server's first TLS frame is OK)."""
    with _connect(target.tcp) as sock:
        sock.sendall(MAGIC + _identify(b'{"tls_v1": true, "feature_negotiation": true}'))
        _read_all(sock, 0.5)
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        with ctx.wrap_socket(sock) as tls:
            data, closed = _read_all(tls, 0.5)  # type: ignore[arg-type]
            tls.sendall(b"NOP\n")
    return {"frames": _frames(data, closed)}


#: every case, by name, in the order they run
CASES: dict[str, Callable[[Target], dict[str, Any]]] = {
    f.__name__: f for f in (
        identify_lone_surrogate, identify_nested_array_2000, identify_nested_field_2000,
        identify_nested_field_20000, identify_invalid_utf8, rdy_empty, rdy_two_spaces,
        rdy_trailing_space, put_config_nested_100000, put_config_nested_2000,
        pub_declared_too_big, pub_chunked_too_big, query_invalid_utf8, long_request_line,
        long_header, many_headers, huge_header, plain_http_on_https, plaintext_after_tls_v1,
        stalled_tls_handshake, tls_then_garbage_handshake, tls_ok,
    )
}


def run_all(target: Target, names: list[str] | None = None) -> dict[str, dict[str, Any]]:
    return {name: CASES[name](target) for name in (names or list(CASES))}
