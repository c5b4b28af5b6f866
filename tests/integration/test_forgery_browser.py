"""Other web pages against nsqd and nsqadmin, nsqtw's and Go's side by side, in a real headless Chromium.

A small HTTP server on port 0 plays another site: one page auto-submits a
``<form enctype="text/plain" method="POST">``, another sends a ``fetch``
with ``mode: "no-cors"``. Both are requests a browser sends to another
origin without asking it first (no CORS preflight). They are loaded from
``localhost`` (another site than the node's ``127.0.0.1``) and from
``127.0.0.1`` on another port (the same site, another origin). A page whose
name was rebound to the node's or the admin's address (DNS rebinding) is
played by Chromium's ``--host-resolver-rules="MAP evil.test 127.0.0.1"``: a
page loaded from ``http://evil.test:PORT/`` sends same-origin requests that
name ``evil.test`` in ``Host`` and ``Origin``, as the attacker's script
does once its name points at the victim.

Each test runs against nsqtw (nsqd, nsqtw-admin) and Go NSQ v1.3.0 (nsqd,
nsqadmin from ``../shared/anchor/bin`` or ``$NSQTW_GO_BIN``; skipped where
they are not found): Go's publish, empty, delete and pause; nsqtw's refuse
(nsqd: 403 ``CROSS_ORIGIN_REQUEST``; nsqtw-admin: 403 ``HOST_NOT_ALLOWED``)
and log why. The node's state is read with plain requests (no ``Origin``),
as curl sends them, which act on both, as do the admin's own pages through
every address it is reached by here. The browser's pieces come from
tests/integration/test_admin_browser.py, which skips this module where
chromium, chromedriver or selenium are missing.
"""

from __future__ import annotations

import html
import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import pytest

from tests.admin_reference import free_port, get_json, http
from tests.daemon import AdminDaemon, Daemon, LookupdDaemon, Started
from tests.integration.browser import By, WebDriverWait, click_confirmed, open_chromium, wait_until
from tests.integration.test_admin_trust import GO_BIN

#: the name a rebound page has, and a name given to nsqtw-admin with --allow-host; both map to loopback
EVIL, ALLOWED = "evil.test", "admin.test"

#: another site's page: a text/plain form POSTed to ``url`` as soon as it loads
FORM_PAGE = """<!doctype html><html><body>
<form id="f" method="POST" enctype="text/plain" action="{url}"><input type="hidden" name="msg" value="x"></form>
<script>document.getElementById("f").submit();</script></body></html>"""

#: another site's page: a no-cors POST to ``url`` (a body, no preflight); the title says when it went
FETCH_PAGE = """<!doctype html><html><head><title>loading</title></head><body><script>
fetch({url}, {{method: "POST", mode: "no-cors", body: "x"}})
  .then(() => {{ document.title = "sent"; }}, (e) => {{ document.title = "failed " + e; }});
</script></body></html>"""

#: a script run in a page's own origin: a POST (JSON when asked), answered with [status, body]
SAME_ORIGIN_POST = """const done = arguments[arguments.length - 1];
const headers = arguments[2] ? {"Content-Type": "application/json"} : {};
fetch(arguments[0], {method: "POST", headers: headers, body: arguments[1]})
  .then((r) => r.text().then((t) => done([r.status, t])), (e) => done(["failed", String(e)]));"""


class _Site(BaseHTTPRequestHandler):
    """The other site: ``/form?url=`` and ``/fetch?url=``."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        parts = urlsplit(self.path)
        url = parse_qs(parts.query).get("url", [""])[0]
        if not url:
            self.send_error(404)
            return
        if parts.path == "/form":
            page = FORM_PAGE.format(url=html.escape(url))
        elif parts.path == "/fetch":
            page = FETCH_PAGE.format(url=json.dumps(url))
        else:
            self.send_error(404)
            return
        body = page.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return None


class Side:
    """One implementation's nsqd and nsqadmin, with the admin's log where it is nsqtw's."""

    def __init__(self, name: str, nsqd_http: str, admin_port: int, admin: Daemon | None = None,
                 node: Daemon | None = None) -> None:
        self.name, self.nsqd_http, self.admin_port, self.admin, self.node = name, nsqd_http, admin_port, admin, node

    @property
    def nsqd_port(self) -> int:
        return int(self.nsqd_http.rsplit(":", 1)[1])

    def curl(self, path: str, body: bytes = b"") -> int:
        """A plain POST to the node, as curl sends it (no Origin, no Sec-Fetch-Site)."""
        return http("POST", f"http://{self.nsqd_http}{path}", body)[0]

    def topic(self, topic: str, messages: int = 0) -> None:
        assert self.curl(f"/topic/create?topic={topic}") == 200
        assert self.curl(f"/channel/create?topic={topic}&channel=c") == 200
        for i in range(messages):
            assert self.curl(f"/pub?topic={topic}", b"m%d" % i) == 200

    def stats(self, topic: str) -> dict[str, Any] | None:
        for t in get_json(f"http://{self.nsqd_http}/stats?format=json&topic={topic}")["topics"] or []:  # Go: null
            if t["topic_name"] == topic:
                return dict(t)
        return None

    def depth(self, topic: str) -> int:
        stats = self.stats(topic)
        assert stats is not None, topic
        return int(stats["channels"][0]["depth"])

    def log(self, daemon: Daemon | None, text: str) -> None:
        """Wait for ``text`` in the log of ``daemon`` (nsqtw's), which says it refused."""
        assert daemon is not None
        wait_until(lambda: text in daemon.read_output(), what=f"{text!r} in the log")


class Setup:
    def __init__(self, nsqtw: Side, go: Side | None, site_port: int) -> None:
        self.nsqtw, self.go, self.site_port = nsqtw, go, site_port


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    started = Started(str(tmp_path_factory.mktemp("forgery")))
    start, folder = started.start, started.folder
    procs: list[subprocess.Popen[bytes]] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        lookupd = start(LookupdDaemon(folder("lookupd")))
        node = start(Daemon(folder("node"), f"--lookupd-tcp-address={lookupd.tcp_address}",
                            "--broadcast-address=127.0.0.1"))
        # on every interface (IPv4 and IPv6): reached below by several addresses and names
        admin = start(AdminDaemon(folder("admin"), f"--lookupd-http-address={lookupd.http_address}",
                                  "--history-interval=0", f"--allow-host={ALLOWED}"), http="[::]:0")
        nsqtw = Side("nsqtw", node.http_address, admin.http[1], admin, node)
        go = None
        if GO_BIN is not None:
            data, http_port, admin_port = folder("go-nsqd"), free_port(), free_port()
            procs.append(subprocess.Popen(
                [os.path.join(GO_BIN, "nsqd"), f"--tcp-address=127.0.0.1:{free_port()}",
                 f"--http-address=127.0.0.1:{http_port}", f"--data-path={data}", "--broadcast-address=127.0.0.1"],
                cwd=data, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_until(lambda: http("GET", f"http://127.0.0.1:{http_port}/ping")[0] == 200, what="Go nsqd")
            procs.append(subprocess.Popen(
                [os.path.join(GO_BIN, "nsqadmin"), f"--http-address=127.0.0.1:{admin_port}",
                 f"--nsqd-http-address=127.0.0.1:{http_port}"],
                cwd=started.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_until(lambda: http("GET", f"http://127.0.0.1:{admin_port}/ping")[0] == 200, what="Go nsqadmin")
            go = Side("go", f"127.0.0.1:{http_port}", admin_port)
        yield Setup(nsqtw, go, server.server_address[1])
    finally:
        server.shutdown()
        for p in procs:
            p.terminate()
            p.wait(10)
        started.stop_all()


@pytest.fixture(params=["nsqtw", "go"])
def side(request: pytest.FixtureRequest, setup: Setup) -> Side:
    if request.param == "go":
        if setup.go is None:
            pytest.skip("Go NSQ v1.3.0 (../shared/anchor/bin or $NSQTW_GO_BIN) is not on this machine")
        return setup.go
    return setup.nsqtw


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium in which evil.test and admin.test are names of 127.0.0.1."""
    driver = open_chromium(f"--host-resolver-rules=MAP {EVIL} 127.0.0.1, MAP {ALLOWED} 127.0.0.1")
    driver.set_script_timeout(20)
    yield driver
    driver.quit()


def _attack(driver: Any, site: str, page: str, url: str) -> None:
    """Load the other site's page and wait until its request has gone (and was answered)."""
    driver.get(f"http://{site}/{page}?url={quote(url, safe='')}")
    if page == "form":
        wait_until(lambda: driver.current_url.startswith(url.split("?")[0]), what="the form's POST")
    else:
        wait_until(lambda: driver.title == "sent", what="the no-cors fetch")


@pytest.mark.parametrize("site", ["localhost", "127.0.0.1"], ids=["cross-site", "same-site"])
def test_another_sites_form_publishes_only_through_go(browser: Any, setup: Setup, side: Side, site: str) -> None:
    """A text/plain form on another site's page POSTs /pub: Go's nsqd publishes it, nsqtw's answers 403."""
    topic = f"form_{site.replace('.', '_')}"
    side.topic(topic)
    _attack(browser, f"{site}:{setup.site_port}", "form", f"http://{side.nsqd_http}/pub?topic={topic}")
    if side.name == "go":
        wait_until(lambda: side.depth(topic) == 1, what="Go nsqd to publish the form's body")
        assert "OK" in browser.page_source
        return
    assert "CROSS_ORIGIN_REQUEST" in browser.page_source
    side.log(side.node, f"refused POST /pub?topic={topic} from a web page")
    assert side.depth(topic) == 0
    assert side.curl(f"/pub?topic={topic}", b"curl") == 200  # a script still publishes
    assert side.depth(topic) == 1


def test_a_no_cors_fetch_empties_and_deletes_only_through_go(browser: Any, setup: Setup, side: Side) -> None:
    """fetch(no-cors) from another site of /channel/empty and /topic/delete: Go does both, nsqtw neither."""
    kept, doomed = "fetch_kept", "fetch_doomed"
    side.topic(kept, messages=2)
    side.topic(doomed)
    site = f"localhost:{setup.site_port}"
    _attack(browser, site, "fetch", f"http://{side.nsqd_http}/channel/empty?topic={kept}&channel=c")
    _attack(browser, site, "fetch", f"http://{side.nsqd_http}/topic/delete?topic={doomed}")
    if side.name == "go":
        wait_until(lambda: side.depth(kept) == 0, what="Go nsqd to empty the channel")
        wait_until(lambda: side.stats(doomed) is None, what="Go nsqd to delete the topic")
        return
    side.log(side.node, f"refused POST /topic/delete?topic={doomed} from a web page")
    assert side.depth(kept) == 2
    assert side.stats(doomed) is not None


def test_a_rebound_page_publishes_only_through_go(browser: Any, setup: Setup, side: Side) -> None:
    """A page at http://evil.test:NSQDPORT/ (its name now the node's address) POSTs /pub same-origin."""
    topic = "rebound"
    side.topic(topic)
    browser.get(f"http://{EVIL}:{side.nsqd_port}/ping")
    answer = browser.execute_async_script(SAME_ORIGIN_POST, f"/pub?topic={topic}", "x", False)
    if side.name == "go":
        assert answer == [200, "OK"]
        assert side.depth(topic) == 1
        return
    assert answer == [403, '{"message":"CROSS_ORIGIN_REQUEST"}']
    # Chromium sends Sec-Fetch-Site only to HTTPS and loopback; Origin is on every POST
    side.log(side.node, f"Origin http://{EVIL}:{side.nsqd_port}, Sec-Fetch-Site -;")
    assert side.depth(topic) == 0


def _paused(side: Side, topic: str) -> bool:
    stats = side.stats(topic)
    return bool(stats and stats["paused"])


def test_a_rebound_page_acts_only_through_go_nsqadmin(browser: Any, setup: Setup, side: Side) -> None:
    """A page at http://evil.test:ADMINPORT/ sends the admin's own JSON pause, same-origin: Go's pauses, nsqtw's 403."""
    topic = "rebound_admin"
    side.topic(topic)
    if side.admin is not None:  # nsqtw-admin learns of the topic through the lookupd
        wait_until(lambda: get_json(f"http://127.0.0.1:{side.admin_port}/api/topics")["topics"].count(topic),
                   what="the admin to see the topic")
    browser.get(f"http://{EVIL}:{side.admin_port}/ping")
    answer = browser.execute_async_script(SAME_ORIGIN_POST, f"/api/topics/{topic}",
                                          json.dumps({"action": "pause"}), True)
    if side.name == "go":
        assert answer[0] == 200, answer
        wait_until(lambda: _paused(side, topic), what="Go nsqadmin to pause the topic")
        return
    assert answer == [403, '{"message":"HOST_NOT_ALLOWED"}']
    side.log(side.admin, f"refused POST /api/topics/{topic}: Host {EVIL}:{side.admin_port} is not a name")
    # the admin's own page, loaded by that name, shows the refusal when its Pause is clicked
    _open_url(browser, f"http://{EVIL}:{side.admin_port}/topics/{topic}")
    click_confirmed(browser, "pause")
    wait_until(lambda: "HOST_NOT_ALLOWED" in browser.find_element(By.ID, "flash").text, what="the page's flash")
    assert not _paused(side, topic)


def _open_url(driver: Any, url: str) -> None:
    driver.get(url)
    WebDriverWait(driver, 20).until(lambda d: d.find_element(By.ID, "main").get_attribute("data-loaded"))


def _local_hostname() -> list[str]:
    """The machine's hostname, where it names an address of this machine (the admin listens on all)."""
    name = socket.gethostname()
    try:
        socket.getaddrinfo(name, None)
    except OSError:
        return []
    return [name]


def test_the_admins_own_page_acts_through_every_address(browser: Any, setup: Setup) -> None:
    """nsqtw-admin on [::]: its page pauses and unpauses through 127.0.0.1, localhost, [::1], the hostname
    and an --allow-host name (admin.test)."""
    side = setup.nsqtw
    topic = "own_page"
    side.topic(topic)
    wait_until(lambda: get_json(f"http://127.0.0.1:{side.admin_port}/api/topics")["topics"].count(topic),
               what="the admin to see the topic")
    for host in ("127.0.0.1", "localhost", "[::1]", *_local_hostname(), ALLOWED):
        _open_url(browser, f"http://{host}:{side.admin_port}/topics/{topic}")
        click_confirmed(browser, "pause")
        wait_until(lambda: _paused(side, topic), what=f"the page's pause through {host}")
        wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, 'button[data-action="unpause"]'),
                   what="the Unpause button")
        click_confirmed(browser, "unpause")
        wait_until(lambda: not _paused(side, topic), what=f"the page's unpause through {host}")
