"""nsqd's HTTP API over a real loopback socket: an in-process Site, treq as the client."""

from __future__ import annotations

import io
import json
import struct
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.web.client import FileBodyProducer
from twisted.web.iweb import UNKNOWN_LENGTH

from nsqtw.core.nsqd import NSQD
from nsqtw.nsqd.http import HTTPAPI
from tests.helpers import make_options


class Live:
    """One NSQD on the real reactor with its HTTP API on 127.0.0.1, port picked by the OS."""

    def __init__(self, **options: Any) -> None:
        options.setdefault("broadcast_address", "127.0.0.1")
        self.nsqd = NSQD(make_options(**options), reactor)
        self.api = HTTPAPI(self.nsqd)
        self.port = reactor.listenTCP(0, self.api.site(), interface="127.0.0.1")
        self.nsqd.http_port = self.port.getHost().port
        self.base = f"http://127.0.0.1:{self.nsqd.http_port}"

    async def call(self, method: str, path: str, data: bytes | None = None,
                   headers: dict[str, str] | None = None) -> tuple[int, str | None, bytes]:
        r = await treq.request(method, self.base + path, data=data, headers=headers,
                               allow_redirects=False, persistent=False)
        body = await treq.content(r)
        ctype = r.headers.getRawHeaders("content-type")
        return r.code, ctype[0] if ctype else None, body

    async def close(self) -> None:
        await self.port.stopListening()
        await self.nsqd.close()


@pytest.fixture
def live():
    node = Live(msg_timeout=2.0, max_msg_size=1024, max_body_size=4096)
    yield node
    pytest_twisted.blockon(ensureDeferred(node.close()))


JSON = "application/json; charset=utf-8"
TEXT = "text/plain; charset=utf-8"


@pytest_twisted.ensureDeferred
async def test_every_endpoint_once(live: Live) -> None:
    """Each route answers as nsqd does, over a socket."""
    assert await live.call("GET", "/ping") == (200, TEXT, b"OK")
    code, ctype, body = await live.call("GET", "/info")
    info = json.loads(body)
    assert (code, ctype, info["version"], info["http_port"]) == (200, JSON, "1.3.0", live.nsqd.http_port)
    assert await live.call("POST", "/pub?topic=t", b"hello") == (200, TEXT, b"OK")
    assert await live.call("POST", "/pub?topic=t&defer=10", b"later") == (200, TEXT, b"OK")
    assert await live.call("POST", "/mpub?topic=t", b"a\nb\nc") == (200, TEXT, b"OK")
    binary = struct.pack(">ii", 1, 2) + b"xy"
    assert await live.call("POST", "/mpub?topic=t&binary=true", binary) == (200, TEXT, b"OK")
    for path in ("/topic/create?topic=u", "/channel/create?topic=u&channel=c",
                 "/topic/pause?topic=u", "/topic/unpause?topic=u",
                 "/channel/pause?topic=u&channel=c", "/channel/unpause?topic=u&channel=c",
                 "/channel/empty?topic=u&channel=c", "/topic/empty?topic=u",
                 "/channel/delete?topic=u&channel=c", "/topic/delete?topic=u"):
        assert await live.call("POST", path) == (200, None, b""), path
    assert "u" not in live.nsqd.topics
    assert await live.call("GET", "/config/log_level") == (200, JSON, b"2")
    assert await live.call("PUT", "/config/log_level", b"debug") == (200, JSON, b"1")
    assert await live.call("PUT", "/config/nsqlookupd_tcp_addresses", b'["127.0.0.1:4160"]') == (
        200, JSON, b'["127.0.0.1:4160"]')
    assert live.nsqd.topics["t"].message_count == 6


@pytest_twisted.ensureDeferred
async def test_errors(live: Live) -> None:
    """nsqd's error codes and statuses, as JSON whatever the Accept header says."""
    accept = {"Accept": "application/vnd.nsq; version=1.0"}
    cases = [
        ("POST", "/pub", b"x", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/pub?topic=bad!", b"x", 400, "INVALID_TOPIC"),
        ("POST", "/pub?topic=t", b"", 400, "MSG_EMPTY"),
        ("POST", "/pub?topic=t", b"x" * 1025, 413, "MSG_TOO_BIG"),
        ("POST", "/pub?topic=t&defer=-1", b"x", 400, "INVALID_DEFER"),
        ("POST", "/mpub?topic=t", b"x" * 4097, 413, "BODY_TOO_BIG"),
        ("POST", "/mpub?topic=t&binary=true", b"\x00\x01", 413, "BAD_BODY"),
        ("POST", "/topic/delete?topic=nope", None, 404, "TOPIC_NOT_FOUND"),
        ("POST", "/channel/create?topic=nope&channel=c", None, 404, "TOPIC_NOT_FOUND"),
        ("POST", "/channel/create?topic=t", None, 400, "MISSING_ARG_CHANNEL"),
        ("GET", "/config/nope", None, 400, "INVALID_OPTION"),
        ("GET", "/pub?topic=t", None, 405, "METHOD_NOT_ALLOWED"),
        ("GET", "/nope", None, 404, "NOT_FOUND"),
    ]
    for method, path, body, code, message in cases:
        got = await live.call(method, path, body, accept)
        assert got == (code, JSON, json.dumps({"message": message}, separators=(",", ":")).encode()), path


@pytest_twisted.ensureDeferred
async def test_chunked_oversized_body(live: Live) -> None:
    """A body sent without Content-Length is still cut at the limit and refused."""

    producer = FileBodyProducer(io.BytesIO(b"x" * 65536))
    producer.length = UNKNOWN_LENGTH  # sent with chunked transfer encoding
    r = await treq.post(live.base + "/pub?topic=t", data=producer, persistent=False)
    assert (r.code, await treq.content(r)) == (413, b'{"message":"MSG_TOO_BIG"}')


@pytest_twisted.ensureDeferred
async def test_stats_both_formats(live: Live) -> None:
    """/stats in JSON (with its switches) and in nsqd's text layout."""
    await live.call("POST", "/topic/create?topic=t")
    await live.call("POST", "/channel/create?topic=t&channel=c")
    await live.call("POST", "/pub?topic=t", b"x")
    code, ctype, body = await live.call("GET", "/stats?format=json")
    data = json.loads(body)
    assert (code, ctype) == (200, JSON)
    assert list(data) == ["version", "health", "start_time", "topics", "memory", "producers"]
    assert data["topics"][0]["channels"][0]["channel_name"] == "c"
    code, _, body = await live.call("GET", "/stats?format=json&include_mem=false&include_clients=false")
    data = json.loads(body)
    assert "memory" not in data and data["producers"] is None
    assert data["topics"][0]["channels"][0]["clients"] is None
    code, ctype, body = await live.call("GET", "/stats?format=text")
    text = body.decode()
    assert (code, ctype) == (200, TEXT)
    assert text.startswith("nsqd v1.3.0 (built w/nsqtw-0.1.0)\nstart_time ")
    assert "\nMemory:\n   heap_objects             \t" in text
    assert "\n   [t              ] depth: " in text
    assert "\n      [c                        ] depth: " in text
    assert text.endswith("\nProducers: None\n")
