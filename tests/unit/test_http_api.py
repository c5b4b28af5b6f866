"""nsqd's HTTP API in memory: StubTreq against HTTPAPI, time driven by task.Clock."""

from __future__ import annotations

import json
import re
import struct
from typing import Any

from treq.testing import StubTreq
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from nsqtw._go.json import go_json
from nsqtw._go.query import parse_query
from nsqtw.http.server import BoundedRequest, RequestSite
from nsqtw.nsqd.http import HTTPAPI
from nsqtw.observe.stats import format_text, go_duration, snapshot
from nsqtw.protocol.wire import encode_command
from tests.helpers import EPOCH, connect, make_nsqd, reference, take_frames

REF = reference("nsqd-1.3.0-responses.json")["http"]


def settle(clock: Any, turns: int = 5) -> None:
    for _ in range(turns):
        clock.advance(0)


class Response:
    def __init__(self, code: int, headers: Any, body: bytes) -> None:
        self.code = code
        self.headers = headers
        self.body = body

    @property
    def content_type(self) -> str | None:
        values = self.headers.getRawHeaders("content-type")
        return values[0] if values else None

    def json(self) -> Any:
        return json.loads(self.body)


class Client:
    """StubTreq over the API's own Site (bounded bodies), recording every request object."""

    def __init__(self, test: SynchronousTestCase, **options: Any) -> None:
        options.setdefault("broadcast_address", "127.0.0.1")
        self.test = test
        self.nsqd, self.clock = make_nsqd(**options)
        self.api = HTTPAPI(self.nsqd)
        self.stub = StubTreq(self.api.resource())
        agent = self.stub._agent
        site = self.api.site(reactor=agent._memoryReactor)
        #: (body bytes kept, body bytes received) of every request, as the handler saw them
        self.requests: list[tuple[int, int]] = []
        seen = self.requests

        class Recording(BoundedRequest):
            def process(self) -> None:
                seen.append((len(self.content.getvalue()), self.body_received))
                super().process()

        site.requestFactory = Recording
        agent._serverFactory = site

    def __call__(self, method: str, url: str, data: bytes | None = None,
                 headers: dict[str, str] | None = None) -> Response:
        d = self.stub.request(method, "http://127.0.0.1" + url, data=data, headers=headers,
                              allow_redirects=False)
        self.stub.flush()
        settle(self.clock)
        self.stub.flush()
        r = self.test.successResultOf(d)
        body = self.test.successResultOf(r.content())
        return Response(r.code, r.headers, body)


def parse_case(text: str) -> tuple[str, str, int | None, dict[str, str]]:
    """``POST /pub?topic=x (body 3 bytes) headers {...}`` -> method, url, body size, headers."""
    m = re.fullmatch(r"(\w+) (\S+)(?: \(body (\d+) bytes\))?(?: headers (\{.*\}))?", text)
    assert m, text
    headers = json.loads(m.group(4).replace("'", '"')) if m.group(4) else {}
    return m.group(1), m.group(2), int(m.group(3)) if m.group(3) else None, headers


def case_body(url: str, size: int | None) -> bytes | None:
    if size is None:
        return None
    if "binary=true" in url:
        if size == 20:  # two messages: 4 + (4+3) + (4+5)
            return struct.pack(">i", 2) + struct.pack(">i", 3) + b"abc" + struct.pack(">i", 5) + b"defgh"
        return b"\x00\x01"[:size]
    if url.startswith("/mpub"):
        return (b"ab\ncd\n" * size)[:size]
    return b"x" * size


def shape(value: Any) -> Any:
    """The JSON's structure: keys in order, value kinds; lists by their first element."""
    if isinstance(value, dict):
        return [(k, shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return ["list", shape(value[0])] if value else ["list"]
    if value is None:
        return None
    return type(value).__name__


def stats_state(client: Client) -> dict[str, Any]:
    """Rebuild the reference's /stats scene: a consumer on ref_h/statsch, a producer, other topics."""
    nsqd, clock = client.nsqd, client.clock
    pub, pt = connect(nsqd, clock)
    pub.dataReceived(encode_command(b"PUB", b"ref_msg", body=b"payload"))
    settle(clock)
    take_frames(pt)
    sub, _st = connect(nsqd, clock)
    ident = {"client_id": "stats-client", "hostname": "h", "user_agent": "ref/1.0"}
    sub.dataReceived(encode_command(b"IDENTIFY", body=json.dumps(ident).encode()))
    client("POST", "/pub?topic=ref_h", b"abc")
    client("POST", "/channel/create?topic=ref_h&channel=statsch")
    client("POST", "/mpub?topic=ref_h", b"1\n2\n3\n4\n5")
    client("POST", "/pub?topic=ref_h&defer=1000", b"deferred")
    sub.dataReceived(b"SUB ref_h statsch\nRDY 3\n")
    settle(clock)
    for ch in ("ch1", "ch2", "ch10"):
        client("POST", "/topic/create?topic=ref_t")
        client("POST", f"/channel/create?topic=ref_t&channel={ch}")
    client("POST", "/mpub?topic=ref_t", b"a\nb")
    return {"producer": pub, "consumer": sub}


class ReferenceTests(SynchronousTestCase):
    """Go nsqd v1.3.0's recorded HTTP answers."""

    def test_reference_cases(self) -> None:
        """Every recorded request, replayed in order, gets the same status, content type and body."""
        client = Client(self, msg_timeout=2.0)
        checked = 0
        for case in REF:
            method, url, size, headers = parse_case(case["request"])
            if url.startswith("/stats"):
                continue
            r = client(method, url, case_body(url, size), headers)
            self.assertEqual(r.code, case["status"], case["request"])
            self.assertEqual(r.content_type, case["content_type"], case["request"])
            if url == "/info":
                ours, theirs = r.json(), json.loads(case["body"])
                self.assertEqual(list(ours), list(theirs))
                for key in ("http_port", "tcp_port", "start_time", "hostname"):
                    ours.pop(key), theirs.pop(key)
                self.assertEqual(ours, theirs)
            else:
                self.assertEqual(r.body.decode(), case["body"], case["request"])
            checked += 1
        self.assertGreater(checked, 30)

    def test_reference_stats_json_shapes(self) -> None:
        """/stats JSON: same keys, order, nesting and nulls as nsqd, for each recorded query."""
        client = Client(self, msg_timeout=2.0)
        stats_state(client)
        for case in REF:
            method, url, _, _ = parse_case(case["request"])
            if not url.startswith("/stats") or "format=text" in url:
                continue
            r = client(method, url)
            self.assertEqual((r.code, r.content_type), (case["status"], case["content_type"]))
            self.assertEqual(shape(r.json()), shape(json.loads(case["body"])), url)

    def test_go_json_reencodes_reference_bytes(self) -> None:
        """Our JSON encoder writes nsqd's recorded /stats bodies back byte for byte."""
        for case in REF:
            if case["content_type"] and case["content_type"].startswith("application/json"):
                self.assertEqual(go_json(json.loads(case["body"])).decode(), case["body"])

    def test_reference_stats_text(self) -> None:
        """The text format from the recorded snapshot equals nsqd's text, columns and all."""
        text_case = next(c for c in REF if c["request"] == "GET /stats?format=text")
        json_case = next(c for c in REF if c["request"] == "GET /stats?format=json")
        snap = json.loads(json_case["body"])
        expected = text_case["body"]
        for key in snap["memory"]:
            snap["memory"][key] = int(re.search(rf"   {key} +\t(\d+)\n", expected).group(1))
        connect_ts = snap["topics"][0]["channels"][0]["clients"][0]["connect_ts"]
        ours = format_text(snap, now=connect_ts + 1.5, start_time=snap["start_time"])
        # the first line names what built the program: Go's toolchain there, nsqtw here
        head = r"nsqd v1\.3\.0 \(built w/[a-z0-9.-]+\)\nstart_time \S+\nuptime \S+\n"
        self.assertRegex(ours, r"^nsqd v1\.3\.0 \(built w/nsqtw-0\.1\.0\)\n")
        self.assertRegex(expected, r"^nsqd v1\.3\.0 \(built w/go1\.19\.8\)\n")
        self.assertRegex(ours, "^" + head)
        self.assertRegex(expected, "^" + head)
        self.assertEqual(re.sub(head, "", ours, count=1), re.sub(head, "", expected, count=1))
        self.assertIn("\nuptime 7.5s\n", ours)


class PingInfoTests(SynchronousTestCase):
    def test_ping_unhealthy(self) -> None:
        """/ping answers 500 with nsqd's health text when a backend fails."""
        client = Client(self)
        client.nsqd.set_health("disk", "boom")
        r = client("GET", "/ping")
        self.assertEqual((r.code, r.body, r.content_type), (500, b"NOK - boom", "text/plain; charset=utf-8"))
        self.assertIsNone(r.headers.getRawHeaders("x-nsq-content-type"))

    def test_ping_is_answered_ahead_of_klein(self) -> None:
        """GET /ping goes to its handler directly (direct_routes), with the same answer; POST /ping
        and every other route still go through Klein's routing."""
        from klein.resource import KleinResource

        client = Client(self)
        real = KleinResource.render
        routed: list[bytes] = []

        def render(resource: object, request: object) -> object:
            routed.append(request.path)  # type: ignore[attr-defined]
            return real(resource, request)  # type: ignore[arg-type]

        self.patch(KleinResource, "render", render)
        r = client("GET", "/ping")
        self.assertEqual((r.code, r.body, r.content_type), (200, b"OK", "text/plain; charset=utf-8"))
        self.assertEqual(routed, [])
        self.assertEqual(client("POST", "/ping").code, 405)
        self.assertEqual(client("GET", "/info").code, 200)
        self.assertEqual(routed, [b"/ping", b"/info"])

    def test_klein_routes_are_the_route_table(self) -> None:
        """The handlers marked with route() give Klein exactly the routes of ROUTES, with their methods
        (GET ones answer HEAD in werkzeug too), for nsqd and nsqlookupd."""
        from nsqtw.lookupd.http import LookupdHTTPAPI
        from nsqtw.nsqd.http import HTTPAPI

        for api in (HTTPAPI, LookupdHTTPAPI):
            app = api.klein_app()
            self.assertIs(api.klein_app(), app)
            rules = {rule.rule.replace("<opt>", ":opt"): tuple(sorted(rule.methods - {"HEAD"}))
                     for rule in app.url_map.iter_rules()}
            self.assertEqual(rules, {path: tuple(sorted(methods)) for path, methods in api.routes.items()})
            self.assertTrue(all(not rule.merge_slashes and rule.strict_slashes for rule in app.url_map.iter_rules()))

    def test_direct_route_paths_need_no_cleaning(self) -> None:
        """_Root serves direct routes before its escape and clean-path checks: their paths must pass them."""
        from urllib.parse import unquote_to_bytes

        from nsqtw._go.path import clean_path
        from nsqtw.lookupd.http import LookupdHTTPAPI
        from nsqtw.nsqd.http import HTTPAPI

        for api in (HTTPAPI, LookupdHTTPAPI):
            for path in api.direct_routes:
                self.assertEqual(unquote_to_bytes(path), path)
                self.assertEqual(clean_path(path.decode("ascii")), path.decode("ascii"))
                self.assertIn(path.decode("ascii"), api.routes)

    def test_ping_spelled_otherwise_takes_the_routed_way(self) -> None:
        """/%70ing, //ping, /ping/ and HEAD /ping are not direct: httprouter's answers, as before."""
        client = Client(self)
        self.assertEqual(client("GET", "/%70ing").code, 200)
        self.assertEqual(client("GET", "//ping").code, 301)
        self.assertEqual(client("GET", "/ping/").code, 301)
        self.assertEqual(client("HEAD", "/ping").code, 405)

    def test_info_ports(self) -> None:
        """/info reports the bound ports and nsqd's durations in nanoseconds."""
        client = Client(self, max_heartbeat_interval=30.0)
        client.nsqd.tcp_port, client.nsqd.http_port = 4150, 4151
        info = client("GET", "/info").json()
        self.assertEqual((info["tcp_port"], info["http_port"]), (4150, 4151))
        self.assertEqual(info["max_heartbeat_interval"], 30_000_000_000)
        self.assertEqual(info["start_time"], int(EPOCH))

    def test_tls_required(self) -> None:
        """With --tls-required=true plain HTTP answers nsqd's 403 TLS_REQUIRED."""
        client = Client(self, tls_required=1)
        client.nsqd.https_port = 4152
        r = client("GET", "/ping")
        self.assertEqual((r.code, r.body), (403, b'{"message": "TLS_REQUIRED", "https_port": 4152}'))


class PublishTests(SynchronousTestCase):
    def test_pub_and_defer(self) -> None:
        """/pub queues the body; defer= holds it back for that many milliseconds."""
        client = Client(self)
        client("POST", "/channel/create?topic=t&channel=c")  # no topic yet
        client("POST", "/topic/create?topic=t")
        client("POST", "/channel/create?topic=t&channel=c")
        self.assertEqual(client("POST", "/pub?topic=t", b"now").body, b"OK")
        self.assertEqual(client("POST", "/pub?topic=t&defer=500", b"later").body, b"OK")
        channel = client.nsqd.topics["t"].channels["c"]
        self.assertEqual(channel.stats_counts()["deferred_count"], 1)
        client.clock.advance(0.5)
        self.assertEqual(channel.stats_counts()["deferred_count"], 0)
        self.assertEqual(channel.depth(), 2)

    def test_pub_errors(self) -> None:
        """/pub refuses bad topics, defers outside 0..max-req-timeout and bad queries."""
        client = Client(self, max_req_timeout=1.0)
        cases = [
            ("/pub?topic=t&defer=1001", 400, "INVALID_DEFER"),
            ("/pub?topic=t&defer=1e3", 400, "INVALID_DEFER"),
            ("/pub?topic=" + "a" * 65, 400, "INVALID_TOPIC"),
            ("/pub?topic=a%zz", 400, "INVALID_REQUEST"),
            ("/pub?topic=a;b", 400, "INVALID_REQUEST"),
        ]
        for url, code, message in cases:
            r = client("POST", url, b"x")
            self.assertEqual((r.code, r.json()), (code, {"message": message}), url)
        self.assertEqual(client("POST", "/pub?topic=t&defer=1000", b"x").code, 200)

    def test_pub_exiting(self) -> None:
        """A publish the topic refuses (closing) answers 503 EXITING."""
        client = Client(self)
        client("POST", "/topic/create?topic=t")
        client.nsqd.topics["t"].exiting = True
        r = client("POST", "/pub?topic=t", b"x")
        self.assertEqual((r.code, r.json()), (503, {"message": "EXITING"}))
        r = client("POST", "/mpub?topic=t", b"x\ny")
        self.assertEqual((r.code, r.json()), (503, {"message": "EXITING"}))

    def test_mpub_text(self) -> None:
        """/mpub splits on newlines and silently drops empty lines."""
        client = Client(self)
        self.assertEqual(client("POST", "/mpub?topic=t", b"a\n\nbb\nccc\n").body, b"OK")
        topic = client.nsqd.topics["t"]
        self.assertEqual([m.body for m in topic.memory], [b"a", b"bb", b"ccc"])

    def test_mpub_binary(self) -> None:
        """binary=true (or any unknown value) reads nsqd's [count][size][body]... format."""
        client = Client(self)
        body = struct.pack(">i", 2) + struct.pack(">i", 1) + b"\n" + struct.pack(">i", 2) + b"xy"
        for flag in ("true", "1", "yes"):
            self.assertEqual(client("POST", f"/mpub?topic=t&binary={flag}", body).body, b"OK")
        self.assertEqual([m.body for m in client.nsqd.topics["t"].memory][:2], [b"\n", b"xy"])
        # binary=false is the text format
        client("POST", "/mpub?topic=u&binary=false", body)
        self.assertEqual(len(client.nsqd.topics["u"].memory), 2)

    def test_mpub_errors(self) -> None:
        """/mpub's size and format errors, as nsqd names them."""
        client = Client(self, max_msg_size=10, max_body_size=100)
        cases = [
            ("/mpub?topic=t", b"x" * 11, 413, "MSG_TOO_BIG"),
            ("/mpub?topic=t", b"x\n" * 51, 413, "BODY_TOO_BIG"),
            ("/mpub?topic=t&binary=true", struct.pack(">i", 0), 413, "BAD_BODY"),
            ("/mpub?topic=t&binary=true", struct.pack(">i", 20), 413, "BAD_BODY"),
            ("/mpub?topic=t&binary=true", struct.pack(">ii", 1, 11) + b"x" * 11, 413, "BAD_MESSAGE"),
            ("/mpub?topic=t&binary=true", struct.pack(">ii", 1, 0), 413, "BAD_MESSAGE"),
            ("/mpub?topic=t&binary=true", struct.pack(">ii", 1, 5) + b"abc", 413, "BAD_MESSAGE"),
            ("/mpub?topic=t&binary=true", struct.pack(">i", 2) + struct.pack(">i", 1), 413, "BAD_MESSAGE"),
            ("/mpub", b"x", 400, "MISSING_ARG_TOPIC"),
            ("/mpub?topic=b!d", b"x", 400, "INVALID_TOPIC"),
        ]
        for url, body, code, message in cases:
            r = client("POST", url, body)
            self.assertEqual((r.code, r.json()), (code, {"message": message}), (url, body))

    def test_oversized_bodies_are_not_buffered(self) -> None:
        """A body past the limit is refused with 413 and never held whole in memory."""
        client = Client(self, max_msg_size=1000, max_body_size=5000)
        r = client("POST", "/pub?topic=t", b"x" * 50_000)
        self.assertEqual((r.code, r.json()), (413, {"message": "MSG_TOO_BIG"}))
        r = client("POST", "/mpub?topic=t", b"x\n" * 50_000)
        self.assertEqual((r.code, r.json()), (413, {"message": "BODY_TOO_BIG"}))
        self.assertEqual(client.requests, [(1001, 50_000), (5001, 100_000)])
        self.assertNotIn("t", client.nsqd.topics)  # /pub refuses before creating the topic

    def test_chunked_oversized_body(self) -> None:
        """A chunked body (no Content-Length) past the limit is cut and refused too."""
        nsqd, _ = make_nsqd(max_msg_size=10)
        site = HTTPAPI(nsqd).site()
        proto = site.buildProtocol(None)
        transport = StringTransport()
        proto.makeConnection(transport)
        chunk = b"x" * 100
        proto.dataReceived(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(10):
            proto.dataReceived(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        proto.dataReceived(b"0\r\n\r\n")
        self.assertIn(b" 413 ", transport.value().split(b"\r\n")[0] + b" ")
        self.assertTrue(transport.value().endswith(b'{"message":"MSG_TOO_BIG"}'))


class AdminTests(SynchronousTestCase):
    def test_topic_lifecycle(self) -> None:
        """create, pause, unpause, empty, delete a topic; each answers 200 with no body."""
        client = Client(self)
        for path in ("create", "pause"):
            r = client("POST", f"/topic/{path}?topic=t")
            self.assertEqual((r.code, r.body, r.content_type), (200, b"", None))
        self.assertTrue(client.nsqd.topics["t"].paused)
        client("POST", "/pub?topic=t", b"x")
        client("POST", "/topic/unpause?topic=t")
        self.assertFalse(client.nsqd.topics["t"].paused)
        client("POST", "/topic/empty?topic=t")
        self.assertEqual(client.nsqd.topics["t"].depth(), 0)
        client("POST", "/topic/delete?topic=t")
        self.assertNotIn("t", client.nsqd.topics)

    def test_topic_errors(self) -> None:
        """Missing, invalid and unknown topics on every topic route."""
        client = Client(self)
        for path in ("create", "delete", "empty", "pause", "unpause"):
            r = client("POST", f"/topic/{path}")
            self.assertEqual((r.code, r.json()), (400, {"message": "MISSING_ARG_TOPIC"}), path)
        for path in ("delete", "empty", "pause", "unpause"):
            r = client("POST", f"/topic/{path}?topic=nope")
            self.assertEqual((r.code, r.json()), (404, {"message": "TOPIC_NOT_FOUND"}), path)
        for path in ("create", "empty"):
            r = client("POST", f"/topic/{path}?topic=b!d")
            self.assertEqual((r.code, r.json()), (400, {"message": "INVALID_TOPIC"}), path)

    def test_channel_lifecycle(self) -> None:
        """create, pause, unpause, empty, delete a channel."""
        client = Client(self)
        client("POST", "/topic/create?topic=t")
        client("POST", "/channel/create?topic=t&channel=c")
        channel = client.nsqd.topics["t"].channels["c"]
        client("POST", "/pub?topic=t", b"x")
        settle(client.clock)
        client("POST", "/channel/pause?topic=t&channel=c")
        self.assertTrue(channel.paused)
        client("POST", "/channel/unpause?topic=t&channel=c")
        self.assertFalse(channel.paused)
        self.assertEqual(channel.depth(), 1)
        r = client("POST", "/channel/empty?topic=t&channel=c")
        self.assertEqual((r.code, channel.depth()), (200, 0))
        client("POST", "/channel/delete?topic=t&channel=c")
        self.assertNotIn("c", client.nsqd.topics["t"].channels)

    def test_channel_errors(self) -> None:
        """Missing and invalid arguments, unknown topic and channel, on every channel route."""
        client = Client(self)
        client("POST", "/topic/create?topic=t")
        for path in ("create", "delete", "empty", "pause", "unpause"):
            for query, code, message in [
                ("", 400, "MISSING_ARG_TOPIC"),
                ("?topic=b!d&channel=c", 400, "INVALID_ARG_TOPIC"),
                ("?topic=t", 400, "MISSING_ARG_CHANNEL"),
                ("?topic=t&channel=b!d", 400, "INVALID_ARG_CHANNEL"),
                ("?topic=nope&channel=c", 404, "TOPIC_NOT_FOUND"),
            ]:
                r = client("POST", f"/channel/{path}{query}")
                self.assertEqual((r.code, r.json()), (code, {"message": message}), (path, query))
        for path in ("delete", "empty", "pause", "unpause"):
            r = client("POST", f"/channel/{path}?topic=t&channel=nope")
            self.assertEqual((r.code, r.json()), (404, {"message": "CHANNEL_NOT_FOUND"}), path)


class ConfigTests(SynchronousTestCase):
    def test_get_any_option(self) -> None:
        """GET /config/:opt answers every flag by its config name, typed as nsqd marshals it."""
        client = Client(self, max_msg_size=1234, msg_timeout=2.0)
        expect = {
            "max_msg_size": (b"1234", "application/json; charset=utf-8"),
            "msg_timeout": (b"2000000000", "application/json; charset=utf-8"),
            "snappy": (b"true", "application/json; charset=utf-8"),
            "broadcast_address": (b"127.0.0.1", "text/plain; charset=utf-8"),
            "data_path": (b"", None),
            "auth_http_addresses": (b"[]", "application/json; charset=utf-8"),
            "e2e_processing_latency_percentiles": (b"[]", "application/json; charset=utf-8"),
            "tls_min_version": (b"769", "application/json; charset=utf-8"),
        }
        for opt, (body, ctype) in expect.items():
            r = client("GET", f"/config/{opt}")
            self.assertEqual((r.code, r.body, r.content_type), (200, body, ctype), opt)
        for opt in ("nope", "client_timeout", "lookupd_tcp_address", "version"):
            r = client("GET", f"/config/{opt}")
            self.assertEqual((r.code, r.json()), (400, {"message": "INVALID_OPTION"}), opt)

    def test_put_lookupd_addresses(self) -> None:
        """PUT a JSON list of addresses; it is kept and announced through config_changed."""
        client = Client(self)
        changed: list[str] = []
        client.nsqd.config_changed = changed.append  # type: ignore[attr-defined]
        r = client("PUT", "/config/nsqlookupd_tcp_addresses", b'["127.0.0.1:4160"]')
        self.assertEqual((r.code, r.body), (200, b'["127.0.0.1:4160"]'))
        self.assertEqual(client.nsqd.runtime_lookupd_tcp_addresses, ["127.0.0.1:4160"])
        self.assertEqual(client("GET", "/config/nsqlookupd_tcp_addresses").body, b'["127.0.0.1:4160"]')
        self.assertEqual(changed, ["nsqlookupd_tcp_addresses"])

    def test_put_log_level(self) -> None:
        """PUT a level name (any case); GET answers nsqd's number for it."""
        client = Client(self)
        self.assertEqual(client("PUT", "/config/log_level", b"WARN").body, b"3")
        self.assertEqual(client("GET", "/config/log_level").body, b"3")
        self.assertEqual(client.nsqd.runtime_log_level, "warn")

    def test_put_errors(self) -> None:
        """Bad values, empty or too-long bodies and read-only options."""
        client = Client(self, max_msg_size=20)
        cases = [
            ("log_level", b"loud", 400, "INVALID_VALUE"),
            ("nsqlookupd_tcp_addresses", b"[1]", 400, "INVALID_VALUE"),
            ("nsqlookupd_tcp_addresses", b"nope", 400, "INVALID_VALUE"),
            ("log_level", b"", 413, "INVALID_VALUE"),
            ("log_level", b"x" * 21, 413, "INVALID_VALUE"),
            ("max_msg_size", b"5", 400, "INVALID_OPTION"),
        ]
        for opt, body, code, message in cases:
            r = client("PUT", f"/config/{opt}", body)
            self.assertEqual((r.code, r.json()), (code, {"message": message}), (opt, body))


class RoutingTests(SynchronousTestCase):
    def test_not_found_and_method_not_allowed(self) -> None:
        """Unknown paths are 404 NOT_FOUND; known paths with another method 405 with Allow."""
        client = Client(self)
        r = client("GET", "/debug/pprof/")
        self.assertEqual((r.code, r.json()), (404, {"message": "NOT_FOUND"}))
        r = client("DELETE", "/config/log_level")
        self.assertEqual((r.code, r.json()), (405, {"message": "METHOD_NOT_ALLOWED"}))
        self.assertEqual(r.headers.getRawHeaders("allow"), ["GET, OPTIONS, PUT"])
        r = client("HEAD", "/ping")
        self.assertEqual(r.code, 405)
        self.assertEqual(r.headers.getRawHeaders("allow"), ["GET, OPTIONS"])

    def test_options(self) -> None:
        """OPTIONS answers 200 with the allowed methods, like httprouter."""
        client = Client(self)
        r = client("OPTIONS", "/pub")
        self.assertEqual((r.code, r.body, r.headers.getRawHeaders("allow")), (200, b"", ["OPTIONS, POST"]))

    def test_redirects(self) -> None:
        """httprouter's fixes: trailing slash and letter case are redirected (301 GET, 307 others)."""
        client = Client(self)
        r = client("GET", "/ping/")
        self.assertEqual((r.code, r.headers.getRawHeaders("location")), (301, ["/ping"]))
        self.assertEqual(r.body, b'<a href="/ping">Moved Permanently</a>.\n\n')
        r = client("POST", "/PUB?topic=t", b"x")
        self.assertEqual((r.code, r.headers.getRawHeaders("location")), (307, ["/pub?topic=t"]))
        r = client("GET", "//stats")
        self.assertEqual((r.code, r.headers.getRawHeaders("location")), (301, ["/stats"]))

    def test_parse_query_like_go(self) -> None:
        """Go's url.ParseQuery: first value wins for nsqd, bad pairs are skipped but flagged."""
        self.assertEqual(parse_query("a=1&a=2&b=x+y%21"), ({"a": ["1", "2"], "b": ["x y!"]}, False))
        self.assertEqual(parse_query("a=1;b=2&c=3"), ({"c": ["3"]}, True))
        self.assertEqual(parse_query("a=%4"), ({}, True))
        self.assertEqual(parse_query("&&a"), ({"a": [""]}, False))


class StatsTests(SynchronousTestCase):
    def test_filters_and_switches(self) -> None:
        """topic/channel narrow the result; include_clients=false nulls clients and producers."""
        client = Client(self)
        stats_state(client)
        full = client("GET", "/stats?format=json").json()
        self.assertEqual([t["topic_name"] for t in full["topics"]], ["ref_h", "ref_msg", "ref_t"])
        self.assertEqual([c["channel_name"] for c in full["topics"][2]["channels"]], ["ch1", "ch10", "ch2"])
        self.assertIn("memory", full)
        self.assertEqual(full["producers"][0]["pub_counts"], [{"topic": "ref_msg", "count": 1}])

        one = client("GET", "/stats?format=json&topic=ref_h&channel=statsch").json()
        self.assertEqual(len(one["topics"]), 1)
        self.assertNotIn("pub_counts", one["producers"][0])  # filtered to ref_h: nothing left
        none = client("GET", "/stats?format=json&topic=nope").json()
        self.assertEqual((none["topics"], none["producers"]), (None, None))
        empty = client("GET", "/stats?format=json&topic=ref_h&channel=nope").json()
        self.assertEqual(empty["topics"], [])

        bare = client("GET", "/stats?format=json&include_clients=false&include_mem=0").json()
        self.assertNotIn("memory", bare)
        self.assertIsNone(bare["producers"])
        self.assertIsNone(bare["topics"][0]["channels"][0]["clients"])
        self.assertEqual(bare["topics"][0]["channels"][0]["client_count"], 1)

    def test_counts(self) -> None:
        """depth, in-flight and deferred counts come from the channel, as nsqd reports them."""
        client = Client(self)
        stats_state(client)
        ch = client("GET", "/stats?format=json&topic=ref_h").json()["topics"][0]["channels"][0]
        self.assertEqual((ch["depth"], ch["in_flight_count"], ch["deferred_count"], ch["message_count"]),
                         (3, 3, 1, 7))
        self.assertEqual(ch["clients"][0]["client_id"], "stats-client")

    def test_text_format(self) -> None:
        """format=text (the default) prints nsqd's layout, paused markers included."""
        client = Client(self, msg_timeout=600.0)
        stats_state(client)
        client("POST", "/topic/pause?topic=ref_t")
        client("POST", "/channel/pause?topic=ref_h&channel=statsch")
        client.clock.advance(65)
        r = client("GET", "/stats?include_mem=false")
        self.assertEqual(r.content_type, "text/plain; charset=utf-8")
        text = r.body.decode()
        self.assertTrue(text.startswith("nsqd v1.3.0 (built w/nsqtw-0.1.0)\nstart_time "))
        self.assertIn("\nuptime 1m5s\n\nHealth: OK\n\nTopics:\n   [ref_h          ] depth: ", text)
        self.assertNotIn("Memory:", text)
        self.assertIn("\n*P [ref_t          ] depth: ", text)
        self.assertIn("\n   *P [statsch                  ] depth: 4     be-depth: 0     inflt: 3    def: 0 ", text)
        self.assertIn("        [V2 h:", text)
        self.assertIn(" ref/1.0", text)
        self.assertIn("connected: 1m5s\n", text)
        self.assertIn("\nProducers:\n   [V2 192.168.1.1:54321    ] msgs: ", text)
        self.assertIn("msgs: 1        topics: ref_msg=1 connected: 1m5s\n", text)

    def test_empty_node_text(self) -> None:
        """A node without topics or producers says None for both."""
        client = Client(self)
        text = client("GET", "/stats?format=text&include_mem=false").body.decode()
        self.assertTrue(text.endswith("\nHealth: OK\n\nTopics: None\n\nProducers: None\n"))

    def test_as_nsq_stat_and_nsqadmin_read_it(self) -> None:
        """Every field nsqadmin and nsq_stat read is present with the JSON type Go gives it."""
        client = Client(self)
        stats_state(client)
        data = client("GET", "/stats?format=json").json()
        self.assertEqual((data["version"], data["health"]), ("1.3.0", "OK"))
        self.assertIsInstance(data["start_time"], int)
        ints = {"depth", "backend_depth", "message_count", "message_bytes"}
        chan_ints = {"depth", "backend_depth", "in_flight_count", "deferred_count", "message_count",
                     "requeue_count", "timeout_count", "client_count"}
        client_ints = {"state", "ready_count", "in_flight_count", "message_count", "finish_count",
                       "requeue_count", "connect_ts", "sample_rate"}
        client_strs = {"client_id", "hostname", "version", "remote_address", "user_agent",
                       "tls_cipher_suite", "tls_version", "tls_negotiated_protocol"}
        client_bools = {"deflate", "snappy", "tls", "tls_negotiated_protocol_is_mutual"}
        for topic in data["topics"]:
            self.assertIsInstance(topic["topic_name"], str)
            self.assertIs(type(topic["paused"]), bool)
            for key in ints:
                self.assertIs(type(topic[key]), int, key)
            self.assertEqual(topic["e2e_processing_latency"], {"count": 0, "percentiles": None})
            for channel in topic["channels"]:
                for key in chan_ints:
                    self.assertIs(type(channel[key]), int, key)
                self.assertEqual(channel["client_count"], len(channel["clients"]))
                for c in channel["clients"]:
                    for key in client_ints:
                        self.assertIs(type(c[key]), int, key)
                    for key in client_strs:
                        self.assertIs(type(c[key]), str, key)
                    for key in client_bools:
                        self.assertIs(type(c[key]), bool, key)
        for key, value in data["memory"].items():
            self.assertIs(type(value), int, key)
        self.assertTrue(all(p["pub_counts"] for p in data["producers"]))

    def test_snapshot_direct(self) -> None:
        """stats.snapshot is usable without HTTP (statsd): same keys as /stats JSON."""
        nsqd, _ = make_nsqd()
        snap = snapshot(nsqd, include_mem=False)
        self.assertEqual(list(snap), ["version", "health", "start_time", "topics", "producers"])
        self.assertEqual(snap["topics"], [])

    def test_go_duration(self) -> None:
        """Durations print as Go's time.Duration.String()."""
        cases = {0: "0s", 1: "1ns", 1500: "1.5\u00b5s", 2_500_000: "2.5ms", 6_885_709_869: "6.885709869s",
                 65_000_000_000: "1m5s", 3_600_000_000_000: "1h0m0s", -1_000_000_000: "-1s"}
        for ns, text in cases.items():
            self.assertEqual(go_duration(ns), text)

    def test_go_json_escapes(self) -> None:
        """Strings escape like Go's encoding/json (HTML-safe, \\u00XX for controls, bad UTF-8)."""
        self.assertEqual(go_json({"a": "<&>\b\x01\n\u2028"}), b'{"a":"\\u003c\\u0026\\u003e\\u0008\\u0001\\n\\u2028"}')
        self.assertEqual(go_json(b"\xff".decode("utf-8", "surrogateescape")), b'"\\ufffd"')
        self.assertEqual(go_json([1.0, 0.99, 1e21, 1e-7]), b"[1,0.99,1e+21,1e-7]")



class RequestTargetTests(SynchronousTestCase):
    """What a request does when twisted.web's private request target is missing
    (tests/unit/test_twisted_privates.py checks that it is there)."""

    def test_missing_path_falls_back_to_largest_limit(self) -> None:
        """Without ``_path`` a request still gets a body limit large enough for every route."""
        from twisted.internet.testing import StringTransport
        from twisted.web.http import HTTPChannel

        client = Client(self)
        channel = HTTPChannel()
        channel.site = client.api.site().request_site()
        channel.makeConnection(StringTransport())
        self.assertFalse(hasattr(channel, "_path"))
        request = BoundedRequest(channel)
        self.assertEqual(request._limit(), int(client.nsqd.options.max_body_size) + 1)


class HostileIdentityTests(SynchronousTestCase):
    def test_lone_surrogates_in_identify_do_not_break_stats_text(self) -> None:
        """IDENTIFY strings with unpaired \\udXXX escapes become U+FFFD, as Go's JSON decoder makes them:
        /stats?format=text answers 200 (it answered 500, UnicodeEncodeError) and JSON stays valid."""
        client = Client(self)
        proto, transport = connect(client.nsqd, client.clock)
        proto.dataReceived(encode_command(
            b"IDENTIFY", body=b'{"hostname": "\\udfff", "client_id": "a\\ud800b", "user_agent": "\\udc80"}'))
        proto.dataReceived(b"SUB t c\n")
        self.assertEqual(take_frames(transport)[-1], (0, b"OK"))
        text = client("GET", "/stats?format=text")
        self.assertEqual(text.code, 200)
        as_json = client("GET", "/stats?format=json")
        [c] = json.loads(as_json.body)["topics"][0]["channels"][0]["clients"]
        self.assertEqual((c["hostname"], c["client_id"], c["user_agent"]), ("\ufffd", "a\ufffdb", "\ufffd"))


class GoHTTPChannelTests(SynchronousTestCase):
    """twisted.web's parser held to Go net/http's limits, driven over a StringTransport.

    These also guard the twisted.web internals GoHTTPChannel relies on: if a
    Twisted release renames them, the answers below change and these fail.
    """

    def _channel(self) -> tuple[Any, StringTransport]:
        client = Client(self)
        site = client.api.site()
        channel = site.buildProtocol(None)
        transport = StringTransport()
        channel.makeConnection(transport)
        return channel, transport

    def test_an_answer_is_written_while_corked_and_sent_once(self) -> None:
        """Over a transport that corks (nsqtw.net.eager), a request's head and body writes leave together.

        twisted.web writes a response's status line and headers, then its
        body, in separate writes; the channel corks around the input it
        handles, so the eager transport sends them as one segment.
        """

        class Corking(StringTransport):
            corked = False
            writes_while_corked = 0
            uncorks = 0

            def cork(self) -> None:
                self.corked = True

            def uncork(self) -> None:
                self.corked = False
                self.uncorks += 1

            def write(self, data: bytes) -> None:
                self.writes_while_corked += self.corked
                super().write(data)

            def writeSequence(self, data: Any) -> None:
                self.writes_while_corked += self.corked
                super().writeSequence(data)

        client = Client(self)
        channel = client.api.site().buildProtocol(None)
        transport = Corking()
        channel.makeConnection(transport)
        channel.dataReceived(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 200 OK\r\n"))
        self.assertTrue(transport.value().endswith(b"\r\n\r\nOK"))
        self.assertGreaterEqual(transport.writes_while_corked, 2)  # head, then body
        self.assertEqual((transport.corked, transport.uncorks), (False, 1))

    def test_headers_up_to_a_mebibyte_are_read(self) -> None:
        """A 200 KB header and 600 headers are fine for Go; twisted's defaults hang up at 16 KiB / 500."""
        channel, transport = self._channel()
        headers = b"".join(b"X-H%d: v\r\n" % i for i in range(600))
        channel.dataReceived(b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n"
                             + headers + b"\r\n")
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 200 OK\r\n"), transport.value()[:200])
        self.assertFalse(transport.disconnecting)

    def test_headers_past_the_limit_get_gos_431(self) -> None:
        from nsqtw.http.base import MAX_HEADER_BYTES

        for head in (b"GET /ping HTTP/1.1\r\nX-Big: " + b"a" * MAX_HEADER_BYTES,  # one endless line
                     b"GET /ping HTTP/1.1\r\n" + b"X-A: " + b"a" * 700_000 + b"\r\nX-B: "
                     + b"b" * 700_000 + b"\r\n\r\n"):  # lines each short enough, together too long
            channel, transport = self._channel()
            channel.dataReceived(head)
            self.assertEqual(transport.value(),
                             b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; "
                             b"charset=utf-8\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large")
            self.assertTrue(transport.disconnecting)

    def test_malformed_request_gets_gos_400_text(self) -> None:
        channel, transport = self._channel()
        channel.dataReceived(b"GET /ping HTTP/1.1\r\nno colon here\r\n\r\n")
        self.assertEqual(transport.value(),
                         b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                         b"Connection: close\r\n\r\n400 Bad Request")

    def test_raw_non_ascii_query_is_read_as_go_reads_it(self) -> None:
        """``/pub?topic=t&x=\\xff`` publishes (Go: 200 OK); twisted alone refuses the request line."""
        channel, transport = self._channel()
        channel.dataReceived(b"POST /pub?topic=rawq&x=\xff\xfe HTTP/1.1\r\nContent-Length: 1\r\n\r\nm")
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 200 OK\r\n"), transport.value()[:200])
        self.assertTrue(transport.value().endswith(b"\r\n\r\nOK"))

    def test_declared_oversize_body_is_answered_before_it_arrives(self) -> None:
        """Content-Length far past max-msg-size: 413 at once, the connection closes, nothing is read."""
        channel, transport = self._channel()
        channel.dataReceived(b"POST /pub?topic=big HTTP/1.1\r\nContent-Length: 100000000\r\n\r\n")
        self.assertIn(b" 413 ", transport.value().split(b"\r\n", 1)[0])
        self.assertTrue(transport.value().endswith(b'{"message":"MSG_TOO_BIG"}'))
        self.assertTrue(transport.disconnecting)

    def test_endless_chunked_body_is_cut_off(self) -> None:
        """A chunked body is read only until it is well past the limit; then 413 and close."""
        from nsqtw.http.base import DISCARD_LIMIT

        channel, transport = self._channel()
        channel.dataReceived(b"POST /pub?topic=big HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
        limit = 1024 * 1024 + 1 + DISCARD_LIMIT
        sent = 0
        while not transport.value() and sent < 4 * limit:
            channel.dataReceived(chunk)
            sent += 65536
        self.assertLessEqual(sent, limit + 65536)
        self.assertIn(b" 413 ", transport.value().split(b"\r\n", 1)[0])
        self.assertTrue(transport.disconnecting)
        channel.dataReceived(chunk)  # more of the upload after the answer: ignored, no error


class EncodedClientsTests(SynchronousTestCase):
    """``/stats?format=json`` encodes clients from a cached template (V2Protocol.stats_json) and
    splices them into each topic: the bytes must be exactly those of the dict path."""

    NASTY = {"client_id": 'a{0}"state":8000000000000000000,}<&>\u2028"', "hostname": "h{}\\",
             "user_agent": "ua \udc80 \"ready_count\":1"}

    def test_stats_json_equals_go_dumps_of_go_stats_as_the_client_changes(self) -> None:
        from nsqtw._go.json import go_dumps
        client = Client(self)
        proto, transport = connect(client.nsqd, client.clock)

        def same() -> None:
            self.assertEqual(proto.stats_json(), go_dumps(proto.go_stats()))

        same()
        body = json.dumps(self.NASTY).encode()
        proto.dataReceived(encode_command(b"IDENTIFY", body=body))
        same()
        client("POST", "/mpub?topic=t", b"1\n2\n3")
        proto.dataReceived(b"SUB t c\nRDY 2\n")
        settle(client.clock)
        self.assertEqual(proto.in_flight_count, 2)
        same()  # the counters moved: the cached template is filled with the new ones
        [frame_type, payload] = take_frames(transport)[-1]
        proto.dataReceived(b"FIN " + payload[10:26] + b"\n")
        settle(client.clock)
        same()
        proto.hostname = "changed"  # any shown field changing remakes the template
        same()
        self.assertIn('"hostname":"changed"', proto.stats_json())
        producer, _ = connect(client.nsqd, client.clock)
        producer.dataReceived(encode_command(b"PUB", b"t", body=b"x"))
        self.assertEqual(producer.stats_json("t"), go_dumps(producer.go_stats("t")))
        self.assertIn('"pub_counts"', producer.stats_json())

    def test_every_shown_field_set_remakes_the_cached_text(self) -> None:
        """Setting any field /stats shows, Shown or compared, gives the new text at the next call."""
        from nsqtw._go.json import go_dumps
        from nsqtw.protocol.auth import AuthState
        client = Client(self)
        proto, _ = connect(client.nsqd, client.clock)
        changes = {"identifier": "id2", "hostname": "h2", "remote_address": "10.0.0.9:1", "user_agent": "ua2",
                   "connect_ts": 7, "sample_rate": 42, "tls": True, "snappy": True, "deflate": True,
                   "_tls_info": {"tls_version": "TLS1.3", "tls_cipher_suite": "X"}}
        for name, value in changes.items():
            proto.stats_json()
            setattr(proto, name, value)
            self.assertEqual(proto.stats_json(), go_dumps(proto.go_stats()), name)
        proto.auth.state = AuthState(60, "alice", "https://id/alice", [], client.clock.seconds() + 60)
        self.assertEqual(proto.stats_json(), go_dumps(proto.go_stats()))
        self.assertIn('"auth_identity":"alice"', proto.stats_json())

    def test_encoded_snapshot_gives_the_same_bytes(self) -> None:
        """The whole /stats JSON written straight equals the JSON of the plain snapshot, for the
        reference scene plus clients with hostile identities, with and without a topic filter."""
        from nsqtw.observe.stats import run_to_end
        from nsqtw.observe.stats_json import stats_json_steps
        client = Client(self, msg_timeout=2.0)
        stats_state(client)
        for _ in range(3):
            proto, _t = connect(client.nsqd, client.clock)
            proto.dataReceived(encode_command(b"IDENTIFY", body=json.dumps(self.NASTY).encode()))
            proto.dataReceived(b"SUB ref_t ch2\n")
        settle(client.clock)
        for topic, channel in (("", ""), ("ref_t", ""), ("ref_t", "ch2"), ("ref_msg", "")):
            plain = go_json(snapshot(client.nsqd, topic, channel, include_mem=False))
            encoded = run_to_end(stats_json_steps(client.nsqd, topic, channel, include_mem=False))
            self.assertEqual(encoded, plain, (topic, channel))
            if not topic:
                whole = plain
        self.assertIn(b'"client_id":"a{0}\\"state\\":8000000000000000000,}\\u003c', whole)
        self.assertEqual(client("GET", "/stats?format=json&include_mem=false").body,
                         go_json(snapshot(client.nsqd, include_mem=False)))


def _one_turn(clock: Any) -> None:
    """Run the calls a reactor turn would run: those due now, not the ones they schedule."""
    for call in list(clock.getDelayedCalls()):
        if call.getTime() <= clock.seconds() and call.active():
            clock.calls.remove(call)
            call.called = 1
            call.func(*call.args, **call.kw)


class DirectRouteTests(SynchronousTestCase):
    """A plain GET of a direct route is answered without twisted.web's Request, with the same bytes.

    Every request below is sent twice to a fresh channel: once as it comes
    (the direct answer where it qualifies) and once with the channel told it
    has already parsed input (twisted.web's Request, Klein's route). The
    bytes written, and whether the connection closes, must be the same.
    """

    VARIANTS = [
        b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET /ping HTTP/1.1\r\nhost: x\r\nconnection: Keep-Alive Close\r\n\r\n",
        b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close,keep-alive\r\n\r\n",  # twisted: not "close"
        b"GET /ping HTTP/1.1\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n",  # the first counts
        b"GET /ping HTTP/1.1\r\n\r\n",
        b"GET /ping HTTP/1.0\r\n\r\n",
        b"GET /ping HTTP/1.0\r\nConnection: keep-alive\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n",
        b"GET /ping HTTP/1.1\r\nX-Empty:\r\nX-Tab:\tv\r\n\r\n",
        b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\nGET /ping HTTP/1.1\r\nHost: x\r\n\r\n",  # pipelined
        # not plain: twisted.web's way, the same answers
        b"GET /ping?x=1 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /ping/ HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET //ping HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HEAD /ping HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /ping HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        b"GET /ping HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        b"GET /ping HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"GET /ping HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n",
        b"GET /ping HTTP/1.1\r\nno colon\r\n\r\n",
        b"GET /ping HTTP/1.1\r\n folded: x\r\n\r\n",
        b"GET /ping HTTP/1.1\nHost: x\n\n",  # twisted.web waits for CRLF: nothing, both ways
        b"GET /ping HTTP/2.0\r\nHost: x\r\n\r\n",
        b"GET  /ping HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /ping HTTP/1.1\r\nX-Raw: \xff\r\n\r\n",
        b"GET /info HTTP/1.1\r\nHost: x\r\n\r\n",
    ]

    def setUp(self) -> None:
        from unittest import mock

        # both paths stamp the same Date
        for where in ("nsqtw.http.direct.datetimeToString", "twisted.web.server.datetimeToString"):
            patcher = mock.patch(where, return_value=b"Tue, 24 Nov 2026 12:00:00 GMT")
            patcher.start()
            self.addCleanup(patcher.stop)
        cache = mock.patch("nsqtw.http.direct._date_cache", (0, b""))  # a Date formatted before the patch
        cache.start()
        self.addCleanup(cache.stop)

    def _answer(self, api: Any, data: bytes, direct: bool) -> tuple[bytes, bool, bool]:
        """What a fresh channel writes for ``data``, whether it closed, and whether it answered directly."""
        from twisted.internet.task import Clock

        site = api.site(reactor=Clock())
        channel = site.buildProtocol(None)
        transport = StringTransport()
        channel.makeConnection(transport)
        if not direct:
            channel._pristine = False
        answered = []
        real = channel._answer_directly
        channel._answer_directly = lambda d: answered.append(real(d)) or answered[-1]
        channel.dataReceived(data)
        return transport.value(), bool(transport.disconnecting), any(answered)

    def _apis(self) -> list[tuple[str, Any]]:
        from nsqtw.lookupd.http import LookupdHTTPAPI
        from tests.helpers import make_lookupd

        nsqd, _ = make_nsqd(broadcast_address="127.0.0.1")
        lookupd, _ = make_lookupd()
        return [("nsqd", HTTPAPI(nsqd)), ("nsqlookupd", LookupdHTTPAPI(lookupd))]

    def test_both_paths_give_the_same_bytes(self) -> None:
        for name, api in self._apis():
            for data in self.VARIANTS:
                with self.subTest(api=name, request=data):
                    direct = self._answer(api, data, True)
                    generic = self._answer(api, data, False)
                    self.assertEqual(direct[:2], generic[:2])

    def test_the_plain_cases_are_answered_directly(self) -> None:
        """The first ten variants qualify; the rest go twisted.web's way."""
        _, api = self._apis()[0]
        taken = [self._answer(api, data, True)[2] for data in self.VARIANTS]
        self.assertEqual(taken, [True] * 10 + [False] * (len(self.VARIANTS) - 10))

    def test_an_unhealthy_node_answers_500_directly(self) -> None:
        """nsqd's NOK text and 500 come the direct way too, the same as twisted.web's."""
        nsqd, _ = make_nsqd(broadcast_address="127.0.0.1")
        nsqd.set_health("disk", "failed to write")  # as a failing backend reports it
        api = HTTPAPI(nsqd)
        data = self.VARIANTS[0]
        direct, generic = self._answer(api, data, True), self._answer(api, data, False)
        self.assertEqual(direct, (generic[0], generic[1], True))
        self.assertTrue(direct[0].startswith(b"HTTP/1.1 500 Internal Server Error\r\n"), direct[0])
        self.assertTrue(direct[0].endswith(b"NOK - failed to write"), direct[0])

    def test_keep_alive_answers_one_request_after_another(self) -> None:
        """On a kept connection every plain request is answered directly; then a non-plain one goes the long way."""
        from twisted.internet.task import Clock

        nsqd, _ = make_nsqd(broadcast_address="127.0.0.1")
        channel = HTTPAPI(nsqd).site(reactor=Clock()).buildProtocol(None)
        transport = StringTransport()
        channel.makeConnection(transport)
        for _ in range(3):
            channel.dataReceived(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertEqual(transport.value().count(b"HTTP/1.1 200 OK\r\n"), 3)
        self.assertTrue(channel._pristine)
        channel.dataReceived(b"GET /info HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertFalse(channel._pristine)
        self.assertIn(b'"version":', transport.value())
        channel.dataReceived(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")  # twisted.web's now: still answered
        self.assertEqual(transport.value().count(b"HTTP/1.1 200 OK\r\n"), 5)
        self.assertFalse(transport.disconnecting)

    def test_request_site_is_made_when_a_request_first_needs_it(self) -> None:
        """A channel answers a plain /ping without twisted.web's server side; the first request that
        needs a Request makes the request site, once, and channels made after it join it at once."""
        from twisted.internet.task import Clock

        nsqd, _ = make_nsqd(broadcast_address="127.0.0.1")
        site = HTTPAPI(nsqd).site(reactor=Clock())
        first = site.buildProtocol(None)
        transport = StringTransport()
        first.makeConnection(transport)
        first.dataReceived(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertTrue(transport.value().endswith(b"\r\n\r\nOK"))
        self.assertIsNone(getattr(first, "site", None))
        first.dataReceived(b"GET /info HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertIn(b'"version":', transport.value())
        made = site.request_site()
        self.assertIsInstance(made, RequestSite)
        self.assertIs(first.site, made)
        self.assertIs(made.api, site.api)
        self.assertIs(site.request_site(), made)
        later = site.buildProtocol(None)
        self.assertIs(later.site, made)
        self.assertIs(later.requestFactory, BoundedRequest)

    def _channel(self) -> tuple[Any, StringTransport, Any]:
        from twisted.internet.task import Clock

        nsqd, _ = make_nsqd(broadcast_address="127.0.0.1")
        clock = Clock()
        channel = HTTPAPI(nsqd).site(reactor=clock).buildProtocol(None)
        transport = StringTransport()
        channel.makeConnection(transport)
        return channel, transport, clock

    def test_pipelined_pings_are_answered_a_bounded_number_per_turn(self) -> None:
        """1,000 pipelined GET /ping in one read: DIRECT_PER_TURN answered a turn, reading paused between; in order."""
        from nsqtw.http.base import DIRECT_PER_TURN

        channel, transport, clock = self._channel()
        channel.dataReceived(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n" * 1000)
        self.assertEqual(transport.value().count(b"HTTP/1.1 200 OK\r\n"), DIRECT_PER_TURN)
        self.assertEqual(transport.producerState, "paused")
        turns = 1
        while transport.value().count(b"HTTP/1.1 200 OK\r\n") < 1000 and turns < 100:
            self.assertLessEqual(transport.value().count(b"HTTP/1.1 200 OK\r\n"), turns * DIRECT_PER_TURN)
            _one_turn(clock)
            turns += 1
        answers = transport.value().split(b"HTTP/1.1 ")[1:]
        self.assertEqual(len(answers), 1000)
        self.assertTrue(all(a.startswith(b"200 OK\r\n") and a.endswith(b"\r\n\r\nOK") for a in answers))
        self.assertEqual(turns, -(-1000 // DIRECT_PER_TURN))
        self.assertEqual(transport.producerState, "producing")
        self.assertTrue(channel._pristine)
        self.assertFalse(transport.disconnecting)

    def test_pipelined_pings_then_another_route_keep_their_order(self) -> None:
        """Pings, a /info, a ping, a close: answered in that order, the first pings directly, then twisted.web."""
        channel, transport, clock = self._channel()
        ping = b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"
        channel.dataReceived(ping * 100 + b"GET /info HTTP/1.1\r\nHost: x\r\n\r\n" + ping
                             + b"GET /ping HTTP/1.1\r\nConnection: close\r\n\r\n" + ping)
        for _ in range(10):
            clock.advance(0)
        answers = transport.value().split(b"HTTP/1.1 ")[1:]
        self.assertEqual(len(answers), 103)  # the ping after the close is dropped
        self.assertTrue(all(a.endswith(b"\r\n\r\nOK") for a in answers[:100]))
        self.assertIn(b'"version":', answers[100])
        self.assertTrue(answers[101].endswith(b"\r\n\r\nOK") and answers[102].endswith(b"\r\n\r\nOK"))
        self.assertIn(b"Connection: close", answers[102])
        self.assertFalse(channel._pristine)
        self.assertTrue(transport.disconnecting)

    def test_a_head_cut_between_reads_is_still_answered_directly(self) -> None:
        """A ping cut anywhere between two reads waits for its end and is answered directly."""
        data = b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n" * 2
        for cut in range(1, len(data)):
            with self.subTest(cut=cut):
                channel, transport, _ = self._channel()
                channel.dataReceived(data[:cut])
                channel.dataReceived(data[cut:])
                self.assertEqual(transport.value().count(b"HTTP/1.1 200 OK\r\n"), 2)
                self.assertTrue(channel._pristine)

    def test_pipelined_pings_wait_for_a_client_that_does_not_read(self) -> None:
        """While the transport says its buffer is full, no more answers are made; they resume with it."""
        from nsqtw.http.base import DIRECT_PER_TURN

        channel, transport, clock = self._channel()
        channel.dataReceived(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n" * 300)
        channel.pauseProducing()  # what the transport calls when its write buffer is full
        for _ in range(10):
            clock.advance(0)
        self.assertEqual(transport.value().count(b"HTTP/1.1 200 OK\r\n"), DIRECT_PER_TURN)
        channel.resumeProducing()
        for _ in range(10):
            clock.advance(0)
        self.assertEqual(transport.value().count(b"HTTP/1.1 200 OK\r\n"), 300)

    def test_tls_required_is_not_skipped(self) -> None:
        """With --tls-required on plain HTTP, /ping gets _Root's 403 TLS_REQUIRED, never the direct answer."""
        nsqd, _ = make_nsqd(broadcast_address="127.0.0.1")
        api = HTTPAPI(nsqd)
        api.tls_required = True
        value, _, direct = self._answer(api, self.VARIANTS[0], True)
        self.assertFalse(direct)
        self.assertIn(b" 403 ", value.split(b"\r\n", 1)[0])
