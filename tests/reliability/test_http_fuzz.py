"""Hostile HTTP: raw requests over sockets to the HTTP API.

Malformed query strings, bodies, methods and huge bodies get an answer
below 500 (or a hang-up for bytes that are not HTTP at all), never a 5xx or
a traceback, and the daemon's memory stays bounded.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.daemon import Daemon
from tests.rawclient import Client
from tests.reliability.conftest import assert_no_traceback, http_raw, ping, rss_kib, status_of

_ROUTES = ["/ping", "/info", "/pub", "/mpub", "/stats", "/topic/create", "/topic/delete", "/topic/empty",
           "/topic/pause", "/topic/unpause", "/channel/create", "/channel/delete", "/channel/empty",
           "/channel/pause", "/channel/unpause", "/config/nsqlookupd_tcp_addresses", "/config/verbose",
           "/config/nope", "/", "/debug/pprof", "/PING", "/pub/", "//stats", "/./info", "/a/../ping"]
_METHODS = [b"GET", b"POST", b"PUT", b"DELETE", b"HEAD", b"OPTIONS", b"PATCH", b"CONNECT", b"TRACE",
            b"BREW", b"get"]
_KEYS = ["topic", "channel", "format", "defer", "binary", "include_clients", "include_mem", "x", ""]

# characters allowed in a request target (no space, CR, LF); everything else goes %-escaped or broken
_URL_TEXT = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="#"),
                    max_size=30)
_escape = st.sampled_from(["%00", "%2F", "%2f", "%zz", "%", "%e9", "%ff%fe", "..%2F..%2F", "+", ";", "&&", "="])
_value = st.one_of(_URL_TEXT, _escape, st.sampled_from(["t", "c", "..", "a/b", "x" * 70, "-1",
                                                         "99999999999999999999", "1.5", "true", "text"]))
_query = st.lists(st.tuples(st.one_of(st.sampled_from(_KEYS), _URL_TEXT), st.one_of(_value, _escape)),
                  max_size=5).map(lambda pairs: "&".join(f"{k}={v}" for k, v in pairs))
_body = st.one_of(
    st.binary(max_size=300),
    st.sampled_from([b"", b"\n", b"\n\n\n", b"\x00" * 8, b"a\nb\n", b'{"topic": 1}', b'["127.0.0.1:1"]',
                     b'["not an address"]', b"\xff\xff\xff\x7f", b"\x00\x00\x00\x02\x00\x00\x00\x05"]),
)


@st.composite
def _request(draw: st.DrawFn) -> bytes:
    """A request that is well-framed HTTP/1.1 but has hostile contents."""
    method = draw(st.sampled_from(_METHODS))
    path = draw(st.one_of(st.sampled_from(_ROUTES), _URL_TEXT.map(lambda s: "/" + s)))
    query = draw(_query)
    target = (path + ("?" + query if query or draw(st.booleans()) else "")).encode()
    body = draw(_body)
    headers = [b"Host: fuzz", b"Connection: close"]
    if draw(st.booleans()):
        headers.append(b"Content-Type: " + draw(st.sampled_from(
            [b"application/x-www-form-urlencoded", b"multipart/form-data; boundary=x", b"text/plain",
             b"application/json"])))
    if draw(st.booleans()) and body:
        # chunked framing, sometimes with a lying chunk size
        size = len(body) if draw(st.booleans()) else draw(st.integers(0, 2**40))
        headers.append(b"Transfer-Encoding: chunked")
        payload = b"%x\r\n" % size + body + b"\r\n0\r\n\r\n"
    else:
        headers.append(b"Content-Length: %d" % len(body))
        payload = body
    return method + b" " + target + b" HTTP/1.1\r\n" + b"\r\n".join(headers) + b"\r\n\r\n" + payload


@pytest.fixture(scope="module")
def api(tmp_path_factory) -> Iterator[Daemon]:
    """One daemon whose HTTP API the module fuzzes (small message limits keep huge bodies cheap)."""
    d = Daemon(str(tmp_path_factory.mktemp("http")), "--max-msg-size=1024", "--max-body-size=4096")
    d.start()
    yield d
    d.stop()


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(request=_request())
def test_http_fuzz_well_framed(api, request: bytes) -> None:
    """Every well-framed request with hostile method, path, query or body gets an answer below 500."""
    if b"Transfer-Encoding: chunked" in request:
        # a lying chunk size leaves the daemon waiting for the rest: end the input, accept a hang-up
        status = status_of(http_raw(api.http_address, request, half_close=True))
        assert status == 0 or 200 <= status < 500, (request[:200], status)
        return
    response = http_raw(api.http_address, request)
    status = status_of(response)
    assert 200 <= status < 500, (request[:200], response[:300])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=st.one_of(
    st.binary(max_size=400),
    st.builds(lambda m, t, v: m + b" " + t + b" " + v + b"\r\n\r\n", st.binary(max_size=10),
              st.binary(max_size=40), st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/9.9", b"", b"HTTP/1.1 x"])),
    st.builds(lambda h: b"GET /ping HTTP/1.1\r\n" + h + b"\r\n\r\n", st.binary(max_size=100)),
))
def test_http_fuzz_garbage(api, data: bytes) -> None:
    """Bytes that are barely HTTP get a 4xx or a hang-up, never a 5xx."""
    status = status_of(http_raw(api.http_address, data, half_close=True))
    assert status == 0 or 200 <= status < 500, (data[:200], status)


def _post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + extra
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


@pytest.mark.parametrize("request_bytes, status", [
    (_post("/pub?topic=big", b"x" * 1025), 413),
    (_post("/mpub?topic=big", b"x" * 4097), 413),
    (_post("/mpub?topic=big&binary=true", b"\x7f\xff\xff\xff" + b"x" * 100), 413),  # nsqd: 413 for any binary error
    (_post("/pub?topic=big", b"x" * (8 * 1024 * 1024)), 413),
    # Go's net/http reads 1 MiB of request line and headers; so does nsqtw (GoHTTPChannel)
    (b"GET /stats?" + b"a=" + b"x" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 200),
    (b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: " + b"y" * 100_000 + b"\r\n\r\n", 200),
    (b"GET /ping HTTP/1.1\r\nHost: x\r\n" + b"X-Many: 1\r\n" * 1000 + b"\r\n", 200),
    (b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: " + b"y" * 1_100_000 + b"\r\n\r\n", 431),
    (b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", 400),
    (b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400),
    (b"POST /pub?topic=%zz HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\na", 400),
], ids=["pub-too-big", "mpub-too-big", "mpub-binary-lying-count", "pub-8MiB", "huge-query", "huge-header",
        "many-headers", "past-1MiB-headers", "negative-length", "two-lengths", "bad-escape"])
def test_http_hostile_requests(api, request_bytes, status) -> None:
    """Over-size bodies, lines and headers, lying lengths: Go nsqd's status for each."""
    assert status_of(http_raw(api.http_address, request_bytes)) == status


def _read_ready(s: socket.socket) -> bytes:
    """What the daemon has sent so far, without waiting."""
    data = b""
    s.setblocking(False)
    try:
        while (part := s.recv(65536)):
            data += part
    except (BlockingIOError, OSError):
        pass
    finally:
        s.setblocking(True)
        s.settimeout(10)
    return data


def _upload_until_answered(address: str, head: bytes, body_chunk: bytes, chunks: int) -> bytes:
    """Send ``head`` then up to ``chunks`` chunks, reading the answer as soon as there is one.

    The daemon answers a body far past its limit before it ends and hangs up
    shortly after (as Go does): the client must read while it sends, or the
    reset that follows can take the answer with it.
    """
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(head)
        answer = _read_ready(s)
        for _ in range(chunks):
            if answer:
                break
            try:
                s.sendall(body_chunk)
            except OSError:
                break
            answer += _read_ready(s)
        s.settimeout(5)
        try:
            while (part := s.recv(65536)):
                answer += part
        except OSError:
            pass
    return answer


def test_http_huge_bodies_keep_memory_bounded(api) -> None:
    """Bodies far over the limit, declared or chunked: each is answered 413 long before its end,
    the daemon keeps limit+1 bytes of each, and RSS stays bounded."""
    before = rss_kib(api)
    mib = b"z" * (1024 * 1024)
    chunked = b"%x\r\n%s\r\n" % (len(mib), mib)
    for _ in range(3):
        for i in range(8):
            if i % 2:
                head = (b"POST /mpub?topic=huge HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Length: %d\r\n\r\n" % (32 * len(mib)))
                answer = _upload_until_answered(api.http_address, head, mib, 32)
            else:
                head = b"POST /mpub?topic=huge HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                answer = _upload_until_answered(api.http_address, head, chunked, 32)
            assert status_of(answer) == 413, answer[:200]
    after = rss_kib(api)
    assert after - before < 64 * 1024, (before, after)


def test_http_fuzz_leaves_daemon_serving(api) -> None:
    """After the fuzzing (same daemon): /ping is OK, TCP still works, and no traceback was logged."""
    assert ping(api) == (200, b"OK")
    c = Client(api.tcp_address)
    c.pub("after-fuzz", b"x")
    response = http_raw(api.http_address, _post("/pub?topic=after-fuzz", b"y"))
    assert status_of(response) == 200 and response.endswith(b"OK")
    assert_no_traceback(api)
