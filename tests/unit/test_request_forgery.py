"""Requests a web page makes a browser send: nsqd refuses those that change state, nsqadmin those for other hosts.

nsqd's rule (``nsqtw.http.origin.browser_refusal``, applied by
``nsqtw.http.base._Root`` ahead of every route, HTTP and HTTPS): a request
other than GET, HEAD or OPTIONS that carries ``Origin`` is refused with 403
``CROSS_ORIGIN_REQUEST`` unless ``--http-allow-origin`` names that origin;
one with only ``Sec-Fetch-Site`` is refused unless it says ``none``. curl
and NSQ's clients send neither header. nsqadmin's (``ServedHosts``): a
request that changes state must name in ``Host`` an IP address, localhost,
the machine's hostname, the ``--http-address`` name or an ``--allow-host``;
else 403 ``HOST_NOT_ALLOWED``. Socket-free: StubTreq and a StringTransport.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from typing import Any

from treq.testing import StubTreq
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.admin.http import AdminHTTPAPI, cross_site_refusal
from nsqtw.admin.options import parse_args as admin_args
from nsqtw.admin.routes import served_hosts
from nsqtw.http.origin import ServedHosts, browser_refusal, host_name, is_origin, origin_of
from nsqtw.nsqd.http import HTTPAPI
from tests.unit.test_http_api import Client, Response, settle

EVIL = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"}
REFUSED = (403, {"message": "CROSS_ORIGIN_REQUEST"})

#: every request of nsqd's API that changes state, with a body where it takes one
STATE_CHANGING: list[tuple[str, str, bytes | None]] = [
    ("POST", "/pub?topic=t", b"m"),
    ("POST", "/pub?topic=t&defer=10", b"m"),
    ("POST", "/mpub?topic=t", b"a\nb\n"),
    ("POST", "/mpub?topic=t&binary=true", b"\x00\x00\x00\x01\x00\x00\x00\x01m"),
    ("POST", "/topic/create?topic=fresh", None),
    ("POST", "/topic/empty?topic=t", None),
    ("POST", "/topic/pause?topic=t", None),
    ("POST", "/topic/unpause?topic=paused", None),
    ("POST", "/channel/create?topic=t&channel=fresh", None),
    ("POST", "/channel/empty?topic=t&channel=c", None),
    ("POST", "/channel/pause?topic=t&channel=c", None),
    ("POST", "/channel/unpause?topic=paused&channel=c", None),
    ("POST", "/channel/delete?topic=t&channel=c", None),
    ("PUT", "/config/log_level", b"debug"),
    ("PUT", "/config/nsqlookupd_tcp_addresses", b'["evil.example:4160"]'),
    ("POST", "/topic/delete?topic=t", None),
]


class Node:
    """An nsqd API in memory with topic ``t`` (channel ``c``, 2 messages) and a paused topic and channel."""

    def __init__(self, test: SynchronousTestCase, tls_enabled: bool = False, **options: Any) -> None:
        self.client = Client(test, **options)
        if tls_enabled:
            api = HTTPAPI(self.client.nsqd, tls_enabled=True)
            self.client.api, self.client.stub = api, StubTreq(api.resource())
        for method, url, body in (("POST", "/topic/create?topic=t", None), ("POST", "/topic/create?topic=paused", None),
                                  ("POST", "/channel/create?topic=t&channel=c", None),
                                  ("POST", "/pub?topic=t", b"one"), ("POST", "/pub?topic=t", b"two"),
                                  ("POST", "/channel/create?topic=paused&channel=c", None),
                                  ("POST", "/topic/pause?topic=paused", None),
                                  ("POST", "/channel/pause?topic=paused&channel=c", None)):
            assert self(method, url, body).code == 200, url

    def __call__(self, method: str, url: str, body: bytes | None = None,
                 headers: dict[str, str] | None = None) -> Response:
        return self.client(method, url, data=body, headers=headers)

    def state(self) -> Any:
        """Everything a refused request could have changed: topics, channels, depths, pauses, runtime config."""
        stats = self("GET", "/stats?format=json").json()
        nsqd: Any = self.client.nsqd
        return ([(t["topic_name"], t["depth"], t["message_count"], t["paused"],
                  [(c["channel_name"], c["depth"], c["paused"]) for c in t["channels"]]) for t in stats["topics"]],
                nsqd.runtime_log_level, nsqd.runtime_lookupd_tcp_addresses)


def answer(r: Response) -> tuple[int, Any]:
    return r.code, r.json() if r.body else None


class NSQDTests(SynchronousTestCase):
    def test_every_state_changing_route_refuses_another_sites_page(self) -> None:
        """A text/plain POST (or PUT) from another site to each route: 403 CROSS_ORIGIN_REQUEST, nothing changed."""
        node = Node(self)
        before = node.state()
        for method, url, body in STATE_CHANGING:
            r = node(method, url, body, EVIL)
            self.assertEqual(answer(r), REFUSED, url)
            self.assertEqual(r.content_type, "application/json; charset=utf-8")
            self.assertEqual(r.headers.getRawHeaders("x-nsq-content-type"), ["nsq; version=1.0"])
        self.assertEqual(node.state(), before)

    def test_scripts_and_clients_are_not_affected(self) -> None:
        """Without Origin and Sec-Fetch-Site (curl, NSQ clients), or with Sec-Fetch-Site: none, every route acts."""
        for headers in ({}, {"Sec-Fetch-Site": "none"}, {"Content-Type": "text/plain", "User-Agent": "curl/8"}):
            node = Node(self)
            before = node.state()
            for method, url, body in STATE_CHANGING:
                self.assertEqual(node(method, url, body, headers).code, 200, (url, headers))
            self.assertNotEqual(node.state(), before)

    def test_any_page_is_refused_same_site_same_origin_and_the_nodes_own(self) -> None:
        """nsqd serves no page: same-site, same-origin, its own Host's origin (DNS rebinding) and null are refused."""
        node = Node(self)
        for headers in ({"Origin": "http://127.0.0.1:8000", "Sec-Fetch-Site": "same-site"},
                        {"Origin": "http://127.0.0.1", "Sec-Fetch-Site": "same-origin"},  # the Host it was sent
                        {"Origin": "http://evil.test:4151", "Sec-Fetch-Site": "same-origin"},
                        {"Origin": "null"}, {"Origin": ""}, {"Origin": "http://evil.example"},
                        {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                        {"Sec-Fetch-Site": "same-origin"}, {"Origin": "http://evil.example", "Sec-Fetch-Site": "none"}):
            for method, url, body in (("POST", "/pub?topic=t", b"m"),
                                      ("POST", "/channel/empty?topic=t&channel=c", None),
                                      ("POST", "/topic/delete?topic=t", None)):
                self.assertEqual(answer(node(method, url, body, headers)), REFUSED, (url, headers))

    def test_an_allowed_origin_passes(self) -> None:
        """--http-allow-origin: that origin's pages act (any case, default port or not); others stay refused."""
        node = Node(self, http_allow_origin=("https://dash.example", "http://[::1]:8080"))
        for origin in ("https://dash.example", "HTTPS://Dash.Example:443", "http://[::1]:8080"):
            headers = {"Origin": origin, "Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"}
            self.assertEqual(node("POST", "/pub?topic=t", b"m", headers).code, 200, origin)
        for origin in ("http://dash.example", "https://dash.example:8443", "https://evil.dash.example", "null"):
            self.assertEqual(answer(node("POST", "/pub?topic=t", b"m", {"Origin": origin})), REFUSED, origin)

    def test_reads_are_answered_whatever_their_origin(self) -> None:
        """GET, HEAD and OPTIONS change nothing and are answered as before (a page cannot read the answers)."""
        node = Node(self)
        for method, url in (("GET", "/stats"), ("GET", "/info"), ("GET", "/ping"), ("GET", "/config/log_level"),
                            ("OPTIONS", "/pub"), ("HEAD", "/stats")):
            self.assertNotEqual(node(method, url, headers=EVIL).code, 403, url)
        self.assertEqual(node("OPTIONS", "/pub", headers=EVIL).headers.getRawHeaders("allow"), ["OPTIONS, POST"])

    def test_unrouted_redirected_and_wrong_method_requests_are_checked_first(self) -> None:
        """A page's POST to a path the router would redirect (307, which a browser follows), 404 or 405: 403."""
        node = Node(self)
        for method, url in (("POST", "/pub/?topic=t"), ("POST", "//pub?topic=t"), ("POST", "/PUB?topic=t"),
                            ("POST", "/nope"), ("POST", "/stats"), ("DELETE", "/topic/delete?topic=t"),
                            ("PATCH", "/pub?topic=t")):
            self.assertEqual(answer(node(method, url, b"m", EVIL)), REFUSED, url)
        self.assertEqual(node("POST", "/pub/?topic=t", b"m").code, 307)  # without the headers: the router's

    def test_https_refuses_the_same(self) -> None:
        """The HTTPS listener's API (tls_enabled) applies the same rule."""
        node = Node(self, tls_enabled=True)
        before = node.state()
        for method, url, body in STATE_CHANGING:
            self.assertEqual(answer(node(method, url, body, EVIL)), REFUSED, url)
        self.assertEqual(node.state(), before)

    def test_tls_required_answers_first(self) -> None:
        """With --tls-required, plain HTTP is TLS_REQUIRED for everyone, pages included, as before."""
        from tests.certs import make_certs

        # tempfile rather than mktemp(): mktemp leaves directories behind under pytest
        folder = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, folder)
        certs = make_certs(folder)
        node = Client(self, tls_cert=certs.server_cert, tls_key=certs.server_key, tls_required=1)
        r = node("POST", "/pub?topic=t", b"m", EVIL)
        self.assertEqual((r.code, r.json()["message"]), (403, "TLS_REQUIRED"))

    def test_a_refusal_is_logged_with_the_headers(self) -> None:
        """The node's log says what it refused and how to allow an origin."""
        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        Node(self)("POST", "/pub?topic=t", b"m", EVIL)
        said = [formatEvent(e) for e in events if "refused" in (e.get("log_format") or "")]
        self.assertEqual(said, ["refused POST /pub?topic=t from a web page (its Origin is not one"
                                " --http-allow-origin names): Origin http://evil.example, Sec-Fetch-Site cross-site;"
                                " --http-allow-origin names the origins allowed"])

    def test_the_connection_itself_never_bypasses_the_check(self) -> None:
        """Raw bytes on a fresh connection (where direct routes answer GETs): a page's POST /pub is still 403."""
        client = Client(self)
        channel = client.api.site().buildProtocol(None)
        transport = StringTransport()
        channel.makeConnection(transport)
        channel.dataReceived(b"POST /pub?topic=t HTTP/1.1\r\nHost: 127.0.0.1:4151\r\nOrigin: http://evil.example\r\n"
                             b"Content-Type: text/plain\r\nContent-Length: 1\r\n\r\nm")
        settle(client.clock)
        head, _, body = transport.value().partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 403 "), head)
        self.assertEqual(json.loads(body), REFUSED[1])
        self.assertIsNone(client.nsqd.get_existing_topic("t"))


class RuleTests(SynchronousTestCase):
    def test_browser_refusal(self) -> None:
        """Origin decides when sent (only allowed ones pass); else Sec-Fetch-Site, where only none passes."""
        allowed = frozenset({"https://dash.example"})
        for origin, site, want in ((None, None, True), (None, b"none", True), (None, b" None ", True),
                                   (b"https://dash.example", b"cross-site", True),
                                   (b"https://dash.example:443", None, True),
                                   (b"https://dash.example", None, True),
                                   (b"https://dash.example, http://evil", None, False),
                                   (b"http://dash.example", None, False), (b"null", None, False),
                                   (None, b"same-origin", False), (None, b"same-site", False),
                                   (None, b"cross-site", False), (b"http://evil", b"none", False)):
            self.assertEqual(browser_refusal(origin, site, allowed) is None, want, (origin, site))
        self.assertIsNotNone(browser_refusal(b"https://dash.example", None, frozenset()))

    def test_origins(self) -> None:
        """Origins as browsers write them; a flag value must be an origin and nothing more."""
        self.assertEqual([origin_of(u) for u in ("HTTP://A.example:80/", "https://a.example:8443",
                                                 "http://[::1]:4171", "null", "ftp://a")],
                         ["http://a.example", "https://a.example:8443", "http://[::1]:4171", "", ""])
        self.assertEqual([is_origin(u) for u in ("https://a.example", "http://a:1/", "https://a.example/x",
                                                 "https://a.example?q", "https://a.example#f", "https://u:p@a",
                                                 "a.example", "*")],
                         [True, True, False, False, False, False, False, False])

    def test_host_names(self) -> None:
        """A Host header's name: lower case, no port, no brackets, no final dot; None when it is none."""
        for host, want in (("127.0.0.1:4171", "127.0.0.1"), ("[::1]:4171", "::1"), ("[::1]", "::1"),
                           ("Admin.Example", "admin.example"), ("localhost.:80", "localhost"),
                           ("h", "h"), ("my_host:1", "my_host"), ("[fe80::1%25eth0]:1", "fe80::1%25eth0"),
                           ("::1", None), ("::1:4171", None), ("a:b", None), ("a:", None), ("", None),
                           (":4171", None), ("[::1", None), ("[::1]x", None), ("a b", None), ("a, b", None),
                           ("a/b", None), ("u@a", None)):
            self.assertEqual(host_name(host), want, host)


class AdminHostTests(SynchronousTestCase):
    def hosts(self, *args: str, hostname: str = "vm") -> ServedHosts:
        return served_hosts(admin_args(["--lookupd-http-address=127.0.0.1:4161", *args]), hostname)

    def test_what_is_served_on_every_interface(self) -> None:
        """On 0.0.0.0 (the default) or ::: any IP address, localhost (and its subdomains), the hostname."""
        for listen in ("--http-address=0.0.0.0:4171", "--http-address=[::]:4171", "--http-address=:4171"):
            hosts = self.hosts(listen)
            for host in ("127.0.0.1:4171", "10.1.2.3:8080", "[::1]:4171", "[2001:db8::1]", "localhost:4171",
                         "LOCALHOST", "app.localhost:4171", "vm:4171", "VM", "vm.:4171", None):
                self.assertTrue(hosts.serves(host), (listen, host))
            for host in ("evil.test:4171", "vm.evil.test", "localhost.evil.test", "127.0.0.1.evil.test", "",
                         "evil.test, 127.0.0.1", "::1", "[::1"):
                self.assertFalse(hosts.serves(host), (listen, host))

    def test_the_listen_name_and_allow_host(self) -> None:
        """A name in --http-address is served; --allow-host adds names, .domain suffixes, or * for any."""
        hosts = self.hosts("--http-address=admin.internal:4171", "--allow-host=Admin.Example:8080",
                           "--allow-host=.corp.example")
        for host in ("admin.internal:4171", "admin.example", "admin.example:4171", "corp.example",
                     "nsq.corp.example:4171", "a.b.corp.example"):
            self.assertTrue(hosts.serves(host), host)
        for host in ("evil.test", "xcorp.example", "admin.example.evil.test", "internal"):
            self.assertFalse(hosts.serves(host), host)
        self.assertTrue(self.hosts("--allow-host=*").serves("evil.test:4171"))

    def test_bad_allow_host_is_refused_at_start(self) -> None:
        """--allow-host takes names; a URL or an empty name stops the admin at start."""
        from nsqtw._go.flags import OptionsError

        for bad in ("http://admin.example", "", "a b", "admin/x"):
            with self.assertRaises(OptionsError, msg=bad) as cm:
                self.hosts(f"--allow-host={bad}")
            self.assertIn("--allow-host must be a host name", str(cm.exception))

    def test_host_before_origin(self) -> None:
        """A DNS-rebinding request (same-origin, Origin matching Host, JSON) names the attacker's host: 403."""
        served = self.hosts()
        rebound = {"host": "evil.test:4171", "origin": "http://evil.test:4171", "sec-fetch-site": "same-origin",
                   "content-type": "application/json"}
        for method in ("POST", "DELETE", "PUT"):
            refusal = cross_site_refusal(method, method != "PUT", rebound, frozenset(), served)
            assert refusal is not None
            self.assertEqual((refusal.code, refusal.text), (403, "HOST_NOT_ALLOWED"))
        self.assertIsNone(cross_site_refusal("GET", True, rebound, frozenset(), served))
        for host in ("127.0.0.1:4171", "localhost:4171", "[::1]:4171", "vm:4171"):
            own = {**rebound, "host": host, "origin": f"http://{host}"}
            self.assertIsNone(cross_site_refusal("POST", True, own, frozenset(), served), host)
        curl = {"host": "evil.test:4171", "content-type": "application/json"}
        refusal = cross_site_refusal("POST", True, curl, frozenset(), served)
        assert refusal is not None
        self.assertEqual(refusal.text, "HOST_NOT_ALLOWED")  # by name: scripts use an address or --allow-host

    def test_the_api_refuses_before_asking_the_cluster(self) -> None:
        """Through the admin's resource: a rebound Host gets 403 HOST_NOT_ALLOWED, logged with the flag to add."""
        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        api = AdminHTTPAPI(admin_args(["--lookupd-http-address=127.0.0.1:4161", "--history-interval=0"]),
                           None, None, None, MemoryReactorClock(), hostname="vm")  # type: ignore[arg-type]
        stub = StubTreq(api.resource())
        d = stub.post("http://evil.test:4171/api/topics/t", data=b'{"action":"pause"}',
                      headers={"Content-Type": "application/json", "Origin": "http://evil.test:4171",
                               "Sec-Fetch-Site": "same-origin"})
        stub.flush()
        response = self.successResultOf(d)
        body = self.successResultOf(stub.content(response))
        self.assertEqual((response.code, json.loads(body)), (403, {"message": "HOST_NOT_ALLOWED"}))
        said = [formatEvent(e) for e in events if "refused" in (e.get("log_format") or "")]
        self.assertEqual(said, ["refused POST /api/topics/t: Host evil.test:4171 is not a name this admin serves"
                                " (its addresses, localhost, vm, --allow-host); if it is, add"
                                " --allow-host=evil.test"])
