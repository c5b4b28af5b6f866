"""Cross-site requests against nsqtw-admin in a real headless Chromium: refused, while its own page still acts.

A small HTTP server plays another site's pages: one auto-submits a
``<form enctype="text/plain" method="POST">`` whose body is the JSON of a
pause, one sends an empty with ``fetch(..., {mode: "no-cors"})``. Both are
requests a browser sends cross-site without asking (no CORS preflight). They
are served from ``localhost`` (another site than the admin's ``127.0.0.1``)
and from ``127.0.0.1`` on another port (same site, another origin). The real
node's state is checked afterwards, and the admin's log shows it refused
them. Where Go nsqadmin v1.3.0 is on the machine, the same pages against it
do pause and empty (proving the pages are real attacks). The admin's own
page's Pause button still works. The browser session comes from
tests/integration/test_admin_browser.py.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.admin_reference import free_port, get_json, http
from tests.daemon import AdminDaemon, Daemon, LookupdDaemon, Started
from tests.integration.browser import click_confirmed, open_page, wait_until
from tests.integration.test_admin_trust import GO_BIN
from tests.rawclient import pub

#: another site's page: a text/plain form whose body is JSON, submitted as soon as it loads
FORM_PAGE = """<!doctype html><html><body>
<form id="f" method="POST" enctype="text/plain" action="http://{admin}/api/topics/{topic}">
<input type="hidden" name='{{"action":"pause","pad":"' value='"}}'></form>
<script>document.getElementById("f").submit();</script></body></html>"""

#: another site's page: a no-cors fetch (asking for a JSON content type it may not send)
FETCH_PAGE = """<!doctype html><html><head><title>loading</title></head><body><script>
fetch("http://{admin}/api/topics/{topic}/{channel}", {{method: "POST", mode: "no-cors",
      headers: {{"Content-Type": "application/json"}}, body: JSON.stringify({{action: "empty"}})}})
  .then(() => {{ document.title = "sent"; }}, (e) => {{ document.title = "failed " + e; }});
</script></body></html>"""


class _Site(BaseHTTPRequestHandler):
    """The other site: /form?admin=&topic= and /fetch?admin=&topic=&channel=."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        url = urlsplit(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        page = {"/form": FORM_PAGE, "/fetch": FETCH_PAGE}.get(url.path)
        if page is None:
            self.send_error(404)
            return
        body = page.format(**q).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return None


class Setup:
    def __init__(self, node: Daemon, admin: Daemon, go_admin: str | None, site_port: int) -> None:
        self.node, self.admin, self.go_admin, self.site_port = node, admin, go_admin, site_port

    def url(self, path: str) -> str:
        return f"http://{self.admin.http_address}{path}"

    def channel(self, topic: str) -> dict[str, Any]:
        stats = get_json(f"http://{self.node.http_address}/stats?format=json&topic={topic}")
        return dict(stats["topics"][0]["channels"][0])

    def topic_paused(self, topic: str) -> bool:
        stats = get_json(f"http://{self.node.http_address}/stats?format=json&topic={topic}")
        return bool(stats["topics"][0]["paused"])


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    started = Started(str(tmp_path_factory.mktemp("admin-csrf")))
    start, folder = started.start, started.folder
    procs: list[subprocess.Popen[bytes]] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        lookupd = start(LookupdDaemon(folder("lookupd")))
        node = start(Daemon(folder("node"), f"--lookupd-tcp-address={lookupd.tcp_address}",
                            "--broadcast-address=127.0.0.1"))
        for topic in ("orders", "control"):
            http("POST", f"http://{node.http_address}/topic/create?topic={topic}")
            http("POST", f"http://{node.http_address}/channel/create?topic={topic}&channel=billing")
        admin = start(AdminDaemon(folder("admin"), f"--lookupd-http-address={lookupd.http_address}",
                                  "--history-interval=0"))
        go_admin = None
        if GO_BIN is not None:
            port = free_port()
            procs.append(subprocess.Popen(
                [os.path.join(GO_BIN, "nsqadmin"), f"--http-address=127.0.0.1:{port}",
                 f"--lookupd-http-address={lookupd.http_address}"],
                cwd=started.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            go_admin = f"127.0.0.1:{port}"
            wait_until(lambda: http("GET", f"http://{go_admin}/ping")[0] == 200, what="Go nsqadmin")
        wait_until(lambda: len(get_json(f"http://{lookupd.http_address}/lookup?topic=control")["producers"]) == 1,
                   what="lookupd registrations")
        yield Setup(node, admin, go_admin, server.server_address[1])
    finally:
        server.shutdown()
        for p in procs:
            p.terminate()
            p.wait(10)
        started.stop_all()


def _attack(driver: Any, site: str, page: str, admin: str, topic: str) -> None:
    """Load the other site's page and wait until its request has gone (and was answered)."""
    driver.get(f"http://{site}/{page}?admin={admin}&topic={topic}&channel=billing")
    if page == "form":
        wait_until(lambda: driver.current_url.startswith(f"http://{admin}/"), what="the form's POST")
    else:
        wait_until(lambda: driver.title == "sent", what="the no-cors fetch")


@pytest.mark.parametrize("site", ["localhost", "127.0.0.1"], ids=["cross-site", "same-site"])
def test_a_cross_site_form_cannot_pause_a_topic(browser: Any, setup: Setup, site: str) -> None:  # noqa: F811
    """An auto-submitting text/plain form on another site's page: the topic stays unpaused, the admin says why."""
    admin = setup.admin.http_address
    _attack(browser, f"{site}:{setup.site_port}", "form", admin, "orders")
    assert "CROSS_ORIGIN_REQUEST" in browser.page_source
    wait_until(lambda: "refused POST /api/topics/orders as cross-site" in setup.admin.read_output(),
               what="the admin's log line")
    assert setup.topic_paused("orders") is False


def test_a_no_cors_fetch_cannot_empty_a_channel(browser: Any, setup: Setup) -> None:  # noqa: F811
    """fetch(mode: 'no-cors') of an empty from another site: the channel keeps its messages."""
    pub(setup.node.tcp_address, "orders", b"keep", b"these")
    wait_until(lambda: setup.channel("orders")["depth"] >= 2, what="messages")
    before = setup.channel("orders")["depth"]
    _attack(browser, f"localhost:{setup.site_port}", "fetch", setup.admin.http_address, "orders")
    wait_until(lambda: "refused POST /api/topics/orders/billing as cross-site" in setup.admin.read_output(),
               what="the admin's log line")
    assert setup.channel("orders")["depth"] == before


def test_the_same_pages_do_attack_go_nsqadmin(browser: Any, setup: Setup) -> None:  # noqa: F811
    """Side by side: against Go nsqadmin v1.3.0 the same two pages pause the topic and empty the channel."""
    if setup.go_admin is None:
        pytest.skip("Go nsqadmin v1.3.0 (../shared/anchor/bin) is not on this machine")
    pub(setup.node.tcp_address, "control", b"lost", b"too")
    wait_until(lambda: setup.channel("control")["depth"] >= 2, what="messages")
    _attack(browser, f"localhost:{setup.site_port}", "form", setup.go_admin, "control")
    wait_until(lambda: setup.topic_paused("control"), what="Go nsqadmin to pause the topic")
    _attack(browser, f"localhost:{setup.site_port}", "fetch", setup.go_admin, "control")
    wait_until(lambda: setup.channel("control")["depth"] == 0, what="Go nsqadmin to empty the channel")


def test_the_admins_own_page_still_pauses(browser: Any, setup: Setup) -> None:  # noqa: F811
    """The admin's own topic page: Pause (confirmed) pauses the topic on the node, Unpause undoes it."""
    http("POST", f"http://{setup.node.http_address}/topic/unpause?topic=orders")
    open_page(browser, setup.url("/topics/orders"))
    click_confirmed(browser, "pause")
    wait_until(lambda: setup.topic_paused("orders"), what="the page's pause")
    open_page(browser, setup.url("/topics/orders"))
    click_confirmed(browser, "unpause")
    wait_until(lambda: not setup.topic_paused("orders"), what="the page's unpause")
