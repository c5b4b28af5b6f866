"""nsqtw-admin in memory: node URLs checked, names dialled as is, actions told per node, cross-site refused."""

from __future__ import annotations

import json
from typing import Any

from treq.testing import StubTreq
from twisted.internet import error
from twisted.internet.defer import ensureDeferred
from twisted.internet.interfaces import IResolutionReceiver
from twisted.internet.testing import MemoryReactorClock, SynchronousResolver
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.admin.client import AdminHTTPClient, UpstreamError, _target, decode_json
from nsqtw.admin.cluster import ActionReport, ClusterInfo, producer_http_address
from nsqtw.admin.http import AdminHTTPAPI, cross_site_refusal
from nsqtw.admin.options import parse_args

#: URL built from an odd registration -> what the agent is given, or the error (Go's words where Go has them)
TARGETS = {
    "http://127.0.0.1:4151/stats?format=json": b"http://127.0.0.1:4151/stats?format=json",
    "http://NSQ-Host-01_prod:4151/info": b"http://NSQ-Host-01_prod:4151/info",
    "http://my_host:4151/info": b"http://my_host:4151/info",
    "http://[::1]:4151/info": b"http://[::1]:4151/info",
    "http://[fe80::1%eth0]:4151/info": b"http://[fe80::1%eth0]:4151/info",
    "http://ünïcode.example:4151/info": b"http://xn--ncode-cta3g.example:4151/info",
    "http://host:4151/render?target=a b&x=é": b"http://host:4151/render?target=a%20b&x=%C3%A9",
    "http://host/info": b"http://host/info",
    "http://[nsq-1.example:]:4151/info": 'Get "http://[nsq-1.example:]:4151/info": dial tcp: lookup'
                                         " nsq-1.example:: no such host",
    "http://::1:4151/info": 'Get "http://::1:4151/info": dial tcp: address ::1:4151: too many colons'
                            " in address",
    "http://bad host/x?y:4151/info": 'parse "http://bad host/x?y:4151/info": invalid character " " in'
                                     " host name",
    "http://127.0.0.1:70000/info": 'Get "http://127.0.0.1:70000/info": dial tcp: address 70000: invalid port',
    "http://127.0.0.1:0/info": 'Get "http://127.0.0.1:0/info": dial tcp: address 0: invalid port',
    "http://127.0.0.2:-1/info": 'parse "http://127.0.0.2:-1/info": invalid port ":-1" after host',
    "http://h:abc/info": 'parse "http://h:abc/info": invalid port ":abc" after host',
    "http://:4151/info": 'Get "http://:4151/info": http: no Host in request URL',
    "http://" + "n" * 64 + ".example:1/x": f'Get "http://{"n" * 64}.example:1/x": dial tcp: lookup'
                                           f' {"n" * 64}.example: no such host',
    "http://" + "n." * 130 + "x:1/x": f'Get "http://{"n." * 130}x:1/x": dial tcp: lookup {"n." * 130}x:'
                                      " no such host",
    "http://a..b:1/x": 'Get "http://a..b:1/x": dial tcp: lookup a..b: no such host',
    "http://u:p@h:1/x": 'parse "http://u:p@h:1/x": invalid character "@" in host name',
    "ftp://h:1/x": 'Get "ftp://h:1/x": unsupported protocol scheme "ftp"',
}


class TargetTests(SynchronousTestCase):
    def test_every_odd_address(self) -> None:
        """Each URL an odd registration makes is taken as it is or refused with its own error, never raising else."""
        for url, want in TARGETS.items():
            if isinstance(want, bytes):
                self.assertEqual(_target("Get", url).uri, want, url)
            else:
                with self.assertRaises(UpstreamError, msg=url) as caught:
                    _target("Get", url)
                self.assertEqual(str(caught.exception), want)

    def test_node_addresses_are_joined_as_go_joins_them(self) -> None:
        """A producer's address brackets an IPv6 broadcast address (Go's net.JoinHostPort)."""
        self.assertEqual(producer_http_address({"broadcast_address": "::1", "http_port": 4151}), "[::1]:4151")
        self.assertEqual(producer_http_address({"broadcast_address": "my_host", "http_port": 1}), "my_host:1")


class DecodeTests(SynchronousTestCase):
    def test_numbers_no_node_can_hold_are_errors(self) -> None:
        """NaN, Infinity and 1e999 in a node's answer fail that answer (Go's decoder refuses them too)."""
        for body in (b'{"depth": 1e999}', b'{"depth": NaN}', b'{"depth": Infinity}', b'{"d": -Infinity}'):
            self.assertRaises(ValueError, decode_json, body)
        self.assertEqual(decode_json(b'{"a": 1.5, "b": 10000000000000000000000}'),
                         {"a": 1.5, "b": 10**22})


class _Resolver(SynchronousResolver):
    """Resolves every name to 127.0.0.1 and remembers the names asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def resolveHostName(self, resolutionReceiver: IResolutionReceiver, hostName: str,
                        *args: Any, **kwargs: Any) -> Any:
        self.asked.append(hostName)
        return super().resolveHostName(resolutionReceiver, hostName, *args, **kwargs)


class ClientTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        self.resolver = _Resolver()
        self.reactor.installNameResolver(self.resolver)
        self.client = AdminHTTPClient(self.reactor, 2.0, 5.0)

    def test_a_name_with_an_underscore_is_dialled_as_it_is(self) -> None:
        """``my_host`` is resolved and connected to (Twisted's own endpoint refuses it as bad IDNA)."""
        d = ensureDeferred(self.client.get_json("http://my_host:6000/stats"))
        self.assertEqual(self.resolver.asked, ["my_host"])
        host, port, factory = self.reactor.tcpClients[0][:3]
        self.assertEqual((host, port), ("127.0.0.1", 6000))
        factory.clientConnectionFailed(None, Failure(error.ConnectionRefusedError()))
        self.reactor.advance(1)
        self.assertEqual(str(self.failureResultOf(d, UpstreamError).value),
                         'Get "http://my_host:6000/stats": dial tcp my_host:6000: connect: connection refused')

    def test_an_ipv6_node_is_dialled_in_brackets(self) -> None:
        """``[::1]:6000`` is dialled as the address ::1, port 6000."""
        ensureDeferred(self.client.get_json("http://[::1]:6000/stats"))
        self.assertEqual(self.resolver.asked, ["::1"])
        self.assertEqual(self.reactor.tcpClients[0][1], 6000)

    def test_a_bad_address_starts_nothing(self) -> None:
        """An address no URL can hold fails that one request at once: no lookup, no connection."""
        for url in ("http://bad host/x?y:1/stats", "http://127.0.0.1:70000/stats", "http://[nope]:1/x"):
            self.failureResultOf(ensureDeferred(self.client.post(url)), UpstreamError)
        self.assertEqual((self.resolver.asked, self.reactor.tcpClients), ([], []))


class _FakeClient:
    """nsqlookupd and nodes as answers by URL; POSTs recorded, those to ``broken`` hosts failing."""

    def __init__(self, answers: dict[str, Any], broken: tuple[str, ...] = ()) -> None:
        self.answers = answers
        self.broken = broken
        self.posted: list[str] = []

    async def get_json(self, url: str, headers: Any = None) -> Any:
        if url not in self.answers:
            raise UpstreamError(f'Get "{url}": dial tcp: lookup: no such host')
        return self.answers[url]

    async def post(self, url: str, body: Any = None, headers: Any = None) -> None:
        if any(b in url for b in self.broken):
            raise UpstreamError(f'Post "{url}": dial tcp: lookup: no such host')
        self.posted.append(url)


_PRODUCERS = {"producers": [
    {"broadcast_address": "127.0.0.1", "hostname": "a", "tcp_port": 4150, "http_port": 4151, "version": "1.3.0"},
    {"broadcast_address": "my_host", "hostname": "odd", "tcp_port": 1, "http_port": 2, "version": "1.3.0"},
]}


class ActionReportTests(SynchronousTestCase):
    def test_pause_reports_each_node(self) -> None:
        """A pause reaches the healthy node and reports the odd one's failure, each as a result."""
        client = _FakeClient({"http://L:1/lookup?topic=t": _PRODUCERS}, broken=("my_host",))
        cluster = ClusterInfo(client, MemoryReactorClock())  # type: ignore[arg-type]
        report = self.successResultOf(ensureDeferred(
            cluster.topic_channel_action("pause", "t", "", ["L:1"], [])))
        self.assertEqual(client.posted, ["http://127.0.0.1:4151/topic/pause?topic=t"])
        self.assertEqual([(r["node"], r["ok"]) for r in report.results],
                         [("127.0.0.1:4151", True), ("my_host:2", False)])
        self.assertEqual(report.errors, [report.results[1]["error"]])
        self.assertIn("my_host", report.errors[0])

    def test_tombstone_stands_when_the_node_cannot_be_asked(self) -> None:
        """The lookupd's tombstone is reported done and the node's /info failure reported, not raised."""
        client = _FakeClient({})
        cluster = ClusterInfo(client, MemoryReactorClock())  # type: ignore[arg-type]
        report = self.successResultOf(ensureDeferred(
            cluster.tombstone_node_for_topic("t", "my_host:2", ["L:1"])))
        self.assertEqual(client.posted, ["http://L:1/topic/tombstone?topic=t&node=my_host%3A2"])
        self.assertEqual([(r["node"], r["request"], r["ok"]) for r in report.results],
                         [("L:1", "topic/tombstone", True), ("my_host:2", "info", False)])


    def test_create_reports_a_failed_lookup_after_the_creations(self) -> None:
        """The lookupds' creations are reported done when the topic's producers cannot be looked up after."""
        client = _FakeClient({})
        cluster = ClusterInfo(client, MemoryReactorClock())  # type: ignore[arg-type]
        report = self.successResultOf(ensureDeferred(cluster.create_topic_channel("t", "c", ["L:1"])))
        self.assertEqual([(r["request"], r["ok"]) for r in report.results],
                         [("topic/create", True), ("channel/create", True)])
        self.assertEqual(len(report.errors), 1)
        self.assertIn("failed to query any nsqlookupd", report.errors[0])


ADMIN = "127.0.0.1:4171"
_JSON = {"Content-Type": "application/json"}


class CrossSiteTests(SynchronousTestCase):
    def check(self, headers: dict[str, str], method: str = "POST", api: bool = True,
              allowed: frozenset[str] = frozenset()) -> tuple[int, str] | None:
        refusal = cross_site_refusal(method, api, {k.lower(): v for k, v in headers.items()}, allowed)
        return None if refusal is None else (refusal.code, refusal.text)

    def test_scripts_and_the_admins_own_page_pass(self) -> None:
        """curl with a JSON body or X-Requested-With, and the page's own fetch, are let through."""
        own = {"Host": ADMIN, "Origin": f"http://{ADMIN}", **_JSON}
        for headers in (_JSON, {"Content-Type": "application/json; charset=utf-8"},
                        {"X-Requested-With": "XMLHttpRequest"}, own,
                        {**own, "Sec-Fetch-Site": "same-origin"}):
            for method in ("POST", "DELETE"):
                self.assertIsNone(self.check(headers, method), headers)

    def test_reads_are_never_checked(self) -> None:
        """GET and HEAD change nothing and are answered whatever their origin."""
        for method in ("GET", "HEAD"):
            self.assertIsNone(self.check({"Origin": "http://evil", "Sec-Fetch-Site": "cross-site"}, method))

    def test_another_origin_is_refused(self) -> None:
        """Sec-Fetch-Site other than same-origin, or an Origin other than the admin's, is 403."""
        refused = (403, "CROSS_ORIGIN_REQUEST")
        for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                        {"Host": ADMIN, "Origin": "http://localhost:8000"},
                        {"Host": ADMIN, "Origin": "http://127.0.0.1:8000"},
                        {"Host": ADMIN, "Origin": "null"}):
            self.assertEqual(self.check({**headers, **_JSON}), refused, headers)
            self.assertEqual(self.check(headers, "PUT", api=False), refused, headers)
            self.assertEqual(self.check(headers, "DELETE"), refused, headers)

    def test_an_allowed_origin_passes(self) -> None:
        """--allow-origin lets that origin's pages act (a proxy that rewrites Host)."""
        headers = {"Host": ADMIN, "Origin": "https://admin.example", **_JSON}
        self.assertEqual(self.check(headers), (403, "CROSS_ORIGIN_REQUEST"))
        self.assertIsNone(self.check(headers, allowed=frozenset({"https://admin.example"})))

    def test_an_api_action_must_be_json_or_say_x_requested_with(self) -> None:
        """A body a form or no-cors fetch can send (text/plain, form, none) is 415 on /api/, even same-origin."""
        want = (415, "JSON_CONTENT_TYPE_REQUIRED")
        for ctype in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                      "multipart/form-data; boundary=x", None):
            headers = {"Content-Type": ctype} if ctype else {}
            self.assertEqual(self.check(headers), want, ctype)
            self.assertEqual(self.check(headers, "DELETE"), want, ctype)
            self.assertIsNone(self.check(headers, "PUT", api=False), ctype)  # /config: curl -X PUT -d warn


class _Cluster:
    """ClusterInfo's actions, recorded."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def topic_channel_action(self, action: str, topic: str, channel: str, *args: Any) -> ActionReport:
        self.calls.append(f"{action} {topic}")
        report = ActionReport()
        report.add("127.0.0.1:4151", "topic/pause", None)
        report.add("my_host:2", "topic/pause", 'Post "http://my_host:2/topic/pause?topic=t": no such host')
        return report


class APITests(SynchronousTestCase):
    def setUp(self) -> None:
        self.cluster = _Cluster()
        options = parse_args(["--lookupd-http-address=127.0.0.1:4161", "--history-interval=0"])
        api = AdminHTTPAPI(options, None, self.cluster, None, MemoryReactorClock(),  # type: ignore[arg-type]
                           hostname="h")
        self.stub = StubTreq(api.resource())

    def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
        d = self.stub.post(f"http://{ADMIN}/api/topics/t", data=body, headers=headers)
        self.stub.flush()
        response = self.successResultOf(d)
        content = self.successResultOf(self.stub.content(response))
        return response.code, json.loads(content)

    def test_a_cross_site_form_never_reaches_the_cluster(self) -> None:
        """A text/plain cross-site POST of a valid pause is refused before anything is asked."""
        code, answer = self.post(b'{"action":"pause","pad":"="}',
                                 {"Content-Type": "text/plain", "Origin": "http://evil.example",
                                  "Sec-Fetch-Site": "cross-site"})
        self.assertEqual((code, answer, self.cluster.calls), (403, {"message": "CROSS_ORIGIN_REQUEST"}, []))
        code, answer = self.post(b'{"action":"pause"}', {"Content-Type": "text/plain"})
        self.assertEqual((code, answer, self.cluster.calls),
                         (415, {"message": "JSON_CONTENT_TYPE_REQUIRED"}, []))

    def test_an_action_answers_with_each_nodes_result(self) -> None:
        """A JSON pause answers 200: nsqadmin's warning plus nsqtw's results, one per node."""
        code, answer = self.post(b'{"action":"pause"}', _JSON)
        self.assertEqual((code, self.cluster.calls), (200, ["pause t"]))
        self.assertEqual(answer["message"], 'WARNING: Post "http://my_host:2/topic/pause?topic=t": no such host')
        self.assertEqual([(r["node"], r["ok"]) for r in answer["results"]],
                         [("127.0.0.1:4151", True), ("my_host:2", False)])
