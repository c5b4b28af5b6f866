"""nsqlookupd's HTTP API in memory: StubTreq against LookupdHTTPAPI, time driven by task.Clock."""

from __future__ import annotations

import json
from typing import Any

from treq.testing import StubTreq
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.lookupd.http import ROUTES, LookupdHTTPAPI
from nsqtw.lookupd.wire import identify
from tests.helpers import make_lookupd, reference
from tests.unit.test_lookupd_protocol import Conn

REF_HTTP = reference("nsqlookupd-1.3.0-responses.json")["http"]
#: the node registered when the reference answers were recorded
REF_NODE = {"broadcast_address": "127.0.0.1", "hostname": "vm", "tcp_port": 37343,
            "http_port": 37791, "version": "1.3.0"}
REF_REMOTE_PORT = 54818
REF_LAST_UPDATE = 1795341387813844550


class Client:
    def __init__(self, test: SynchronousTestCase, **options: Any) -> None:
        self.test = test
        self.lookupd, self.clock = make_lookupd(**options)
        self.stub = StubTreq(LookupdHTTPAPI(self.lookupd).resource())

    def __call__(self, method: str, url: str) -> tuple[int, str | None, bytes, Any]:
        d = self.stub.request(method, "http://127.0.0.1" + url, allow_redirects=False)
        self.stub.flush()
        r = self.test.successResultOf(d)
        body = self.test.successResultOf(r.content())
        types = r.headers.getRawHeaders("content-type")
        return r.code, types[0] if types else None, body, r.headers

    def node(self, port: int, commands: bytes = b"", **fields: Any) -> Conn:
        conn = Conn(self.lookupd, port)
        conn.send(identify(json.dumps({**REF_NODE, **fields}).encode()) + commands)
        return conn


class ReferenceReplayTests(SynchronousTestCase):
    def test_http_answers_byte_for_byte(self) -> None:
        """Every recorded request gets Go nsqlookupd's status, content type and exact body."""
        client = Client(self)
        conn = client.node(REF_REMOTE_PORT, b"REGISTER lk_t lk_c\n")
        assert conn.proto.peer is not None
        conn.proto.peer.last_update = REF_LAST_UPDATE
        client.clock.advance(REF_LAST_UPDATE / 1e9 - client.clock.seconds() + 1)
        for case in REF_HTTP:
            method, url = case["request"].split(" ", 1)
            code, content_type, body, headers = client(method, url)
            self.assertEqual((code, content_type, body.decode()),
                             (case["status"], case["content_type"], case["body"]), case["request"])
            if method != "GET" or url != "/ping":
                self.assertEqual(headers.getRawHeaders("x-nsq-content-type"), ["nsq; version=1.0"])


class APITests(SynchronousTestCase):
    def setUp(self) -> None:
        self.client = Client(self, inactive_producer_timeout=60.0, tombstone_lifetime=30.0)

    def json(self, url: str, method: str = "GET", code: int = 200) -> Any:
        got, _, body, _ = self.client(method, url)
        self.assertEqual(got, code, (url, body))
        return json.loads(body) if body else None

    def test_errors(self) -> None:
        """Missing and invalid arguments get nsqlookupd's codes."""
        cases = [
            ("GET", "/channels", 400, "MISSING_ARG_TOPIC"),
            ("GET", "/lookup?topic=a;b", 400, "INVALID_REQUEST"),
            ("POST", "/topic/create", 400, "MISSING_ARG_TOPIC"),
            ("POST", "/topic/create?topic=bad!", 400, "INVALID_ARG_TOPIC"),
            ("POST", "/topic/delete", 400, "MISSING_ARG_TOPIC"),
            ("POST", "/topic/tombstone?topic=t", 400, "MISSING_ARG_NODE"),
            ("POST", "/channel/create?topic=t", 400, "MISSING_ARG_CHANNEL"),
            ("POST", "/channel/create?topic=t&channel=bad!", 400, "INVALID_ARG_CHANNEL"),
            ("POST", "/channel/delete?topic=bad!&channel=c", 400, "INVALID_ARG_TOPIC"),
            ("POST", "/channel/delete?topic=t&channel=c", 404, "CHANNEL_NOT_FOUND"),
            ("GET", "/nope", 404, "NOT_FOUND"),
            ("POST", "/lookup?topic=t", 405, "METHOD_NOT_ALLOWED"),
            ("GET", "/topic/create?topic=t", 405, "METHOD_NOT_ALLOWED"),
        ]
        for method, url, code, message in cases:
            self.assertEqual(self.json(url, method, code), {"message": message}, url)

    def test_router_redirects(self) -> None:
        """httprouter's fixes apply to nsqlookupd's routes too: trailing slash, case."""
        code, _, _, headers = self.client("GET", "/lookup/?topic=t")
        self.assertEqual((code, headers.getRawHeaders("location")), (301, ["/lookup?topic=t"]))
        code, _, _, headers = self.client("POST", "/Topic/Create?topic=t")
        self.assertEqual((code, headers.getRawHeaders("location")), (307, ["/topic/create?topic=t"]))
        self.assertEqual(set(ROUTES), {"/ping", "/info", "/debug", "/lookup", "/topics", "/channels",
                                       "/nodes", "/topic/create", "/topic/delete", "/channel/create",
                                       "/channel/delete", "/topic/tombstone",
                                       "/metrics"})  # the last one is nsqtw's own (docs/metrics.md)

    def test_lookup_two_nodes_and_expiry(self) -> None:
        """/lookup lists active nodes; one that stops PINGing drops out, /debug still shows it."""
        a = self.client.node(1, b"REGISTER t c\n", broadcast_address="a")
        self.client.node(2, b"REGISTER t\n", broadcast_address="b")
        got = self.json("/lookup?topic=t")
        self.assertEqual(got["channels"], ["c"])
        self.assertEqual([p["broadcast_address"] for p in got["producers"]], ["a", "b"])
        self.client.clock.advance(50)
        a.send(b"PING\n")
        self.client.clock.advance(20)
        self.assertEqual([p["broadcast_address"] for p in self.json("/lookup?topic=t")["producers"]],
                         ["a"])
        self.assertEqual(len(self.json("/nodes")["producers"]), 1)
        self.assertEqual(len(self.json("/debug")["topic:t:"]), 2)

    def test_tombstone_hides_node_from_lookup_only(self) -> None:
        """A tombstoned node is left out of /lookup for the lifetime; /nodes marks it."""
        self.client.node(1, b"REGISTER t\nREGISTER u\n", broadcast_address="a", http_port=1)
        self.client.node(2, b"REGISTER t\n", broadcast_address="b", http_port=2)
        self.json("/topic/tombstone?topic=t&node=a:1", "POST")
        self.assertEqual([p["broadcast_address"] for p in self.json("/lookup?topic=t")["producers"]],
                         ["b"])
        self.assertEqual(len(self.json("/lookup?topic=u")["producers"]), 1)
        nodes = {n["broadcast_address"]: n for n in self.json("/nodes")["producers"]}
        self.assertEqual((nodes["a"]["topics"], nodes["a"]["tombstones"]), (["t", "u"], [True, False]))
        self.assertEqual(nodes["b"]["tombstones"], [False])
        debug = self.json("/debug")
        self.assertTrue(debug["topic:t:"][0]["tombstoned"])
        self.assertEqual(debug["topic:t:"][0]["tombstoned_at"], self.client.lookupd.now_ns())
        self.client.clock.advance(31)
        self.assertEqual(len(self.json("/lookup?topic=t")["producers"]), 2)

    def test_admin_create_and_delete(self) -> None:
        """Topics and channels made over HTTP are listed without producers and can be deleted."""
        self.assertEqual(self.json("/topics"), {"topics": []})
        self.json("/channel/create?topic=t&channel=c", "POST")
        self.json("/topic/create?topic=u", "POST")
        self.assertEqual(self.json("/topics"), {"topics": ["t", "u"]})
        self.assertEqual(self.json("/lookup?topic=t"), {"channels": ["c"], "producers": []})
        self.assertEqual(self.json("/channels?topic=t"), {"channels": ["c"]})
        self.assertEqual(self.json("/channels?topic=none"), {"channels": []})
        self.json("/channel/delete?topic=t&channel=c", "POST")
        self.assertEqual(self.json("/channels?topic=t"), {"channels": []})
        self.json("/topic/delete?topic=t", "POST")
        self.json("/topic/delete?topic=never", "POST")
        self.assertEqual(self.json("/topics"), {"topics": ["u"]})
        self.assertEqual(self.json("/lookup?topic=t", code=404), {"message": "TOPIC_NOT_FOUND"})
        self.assertEqual(self.json("/debug"), {})
        self.assertEqual(self.json("/nodes"), {"producers": []})
