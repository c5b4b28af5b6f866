"""Every link nsqtw-admin's pages draw opens its page: a click-through in a real headless Chromium.

One cluster: nsqtw-lookupd, node A on 127.0.0.1 and node B reached over IPv6
loopback (``[::1]``, where the machine has it; 127.0.0.1 otherwise), the
topic ``orders`` on both with ``billing`` and the ephemeral channel
``tmp#ephemeral``, the ephemeral topic ``live#ephemeral``, ``logs`` (with
channel ``tail``) tombstoned for A on the lookupd, so that no node produces
it by the lookupd's account, and consumers connected so the client rows
(and their node links) are drawn. Starting at the admin's front page, the
crawl collects every same-origin ``<a href>`` each page draws once its script
has rendered it, and clicks each one (selenium's click, breadth first, each
link once, at most :data:`MAX_PAGES`), from the page where it was first seen.
Each page a click opens must show its own heading and content, no 404 view, no
error or warning, no failed request in the console, and show the same after a
reload of its URL (what a bookmark or a pasted link gets).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from tests.admin_reference import get_json, http, wait_for
from tests.daemon import AdminDaemon, Daemon, LookupdDaemon, Started
from tests.integration.test_admin_trust import _ipv6_loopback
from tests.rawclient import Client, pub

# skipped where Debian's chromium and its driver are missing
from tests.integration.browser import By, WebDriverWait  # isort: skip

from selenium.common.exceptions import StaleElementReferenceException, TimeoutException  # noqa: E402

#: the most pages the crawl opens (the cluster below draws about fifteen)
MAX_PAGES = 60
#: the second admin's --base-path: every link and route lives under it
BASE_PATH = "/nsq/admin"


IPV6 = _ipv6_loopback()


@dataclass
class Cluster:
    lookupd: Daemon
    a: Daemon
    b: Daemon
    admin: Daemon
    based: Daemon
    clients: list[Client] = field(default_factory=list)

    def node_name(self, node: Daemon) -> str:
        """The node as the admin names it: its broadcast address (bracketed for IPv6) and HTTP port."""
        return f"[::1]:{node.http[1]}" if node is self.b and IPV6 else node.http_address


def _consumer(tcp: str, topic: str, channel: str, name: str) -> Client:
    client = Client(tcp)
    client.identify(client_id=name, hostname=name, user_agent="links-test/1.0", feature_negotiation=True,
                    heartbeat_interval=60_000)  # the longest: the test never answers one
    client.sub(topic, channel, rdy=1)
    return client


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = Started(str(tmp_path_factory.mktemp("admin-links")))
    start, folder = started.start, started.folder
    c: Cluster | None = None
    try:
        lookupd = start(LookupdDaemon(folder("lookupd"), "--broadcast-address=127.0.0.1",
                                      "--tombstone-lifetime=1h"))
        a = start(Daemon(folder("a"), f"--lookupd-tcp-address={lookupd.tcp_address}",
                         "--broadcast-address=127.0.0.1"))
        # B's clients connect over 127.0.0.1; the admin reaches its HTTP API over [::1]
        b = start(Daemon(folder("b"), f"--lookupd-tcp-address={lookupd.tcp_address}",
                         f"--broadcast-address={'::1' if IPV6 else '127.0.0.1'}"),
                  **({"http": "[::1]:0"} if IPV6 else {}))
        admins = [start(AdminDaemon(folder(name), f"--lookupd-http-address={lookupd.http_address}", *args))
                  for name, args in (("admin", ()), ("based", (f"--base-path={BASE_PATH}",)))]
        c = Cluster(lookupd, a, b, *admins)
        for node in (a, b):
            http("POST", f"http://{node.http_address}/topic/create?topic=orders")
            http("POST", f"http://{node.http_address}/channel/create?topic=orders&channel=billing")
        pub(a.tcp_address, "orders", b"a0", b"a1")
        pub(b.tcp_address, "orders", b"b0")
        http("POST", f"http://{a.http_address}/topic/create?topic=logs")
        http("POST", f"http://{a.http_address}/channel/create?topic=logs&channel=tail")
        c.clients = [_consumer(a.tcp_address, "orders", "tmp#ephemeral", "eph-a"),
                     _consumer(b.tcp_address, "orders", "billing", "billing-b"),
                     _consumer(b.tcp_address, "live#ephemeral", "watch", "watch-b")]
        look = f"http://{lookupd.http_address}"
        wait_for(lambda: len(get_json(f"{look}/lookup?topic=orders")["producers"]) == 2
                 and get_json(f"{look}/lookup?topic=logs")["producers"]
                 and get_json(f"{look}/lookup?topic=live%23ephemeral")["producers"]
                 and "tmp#ephemeral" in get_json(f"{look}/channels?topic=orders")["channels"],
                 what="every registration")
        http("POST", f"{look}/topic/tombstone?topic=logs&node={a.http_address}")
        yield c
    finally:
        for client in c.clients if c else ():
            client.close()
        started.stop_all()


#: every same-origin link of the page: [href as written, the absolute URL]
_LINKS_JS = """
return Array.from(document.querySelectorAll('a[href]'))
  .filter((a) => a.origin === location.origin)
  .map((a) => [a.getAttribute('href'), a.href]);
"""

#: the first link whose href is written as arguments[0]
_FIND_JS = ("return Array.from(document.querySelectorAll('a[href]'))"
            ".find((a) => a.getAttribute('href') === arguments[0]);")


def _loaded_since(driver: Any, since: float, path: str) -> bool:
    """The page shows ``path`` and has drawn itself (#main's data-loaded) after ``since`` (the page's clock)."""
    loaded = driver.execute_script(
        "const m = document.getElementById('main');"
        "return location.pathname === arguments[0] && m && m.dataset.loaded ? Number(m.dataset.loaded) : 0;",
        path)
    return bool(loaded and loaded >= since)


def _now(driver: Any) -> float:
    return float(driver.execute_script("return Date.now();"))


def _wait_drawn(driver: Any, since: float, path: str, what: str) -> None:
    WebDriverWait(driver, 20, poll_frequency=0.05).until(lambda d: _loaded_since(d, since, path),
                                                         message=f"{what}: {path} never drew")


def _not_drawn(driver: Any, since: float, path: str) -> list[str]:
    """Nothing, once the page shows ``path`` drawn after ``since``; else what it shows instead."""
    try:
        WebDriverWait(driver, 10, poll_frequency=0.05).until(lambda d: _loaded_since(d, since, path))
        return []
    except TimeoutException:
        return [f"{path} never drew: the browser shows {driver.current_url}"]


def _failed_requests(driver: Any) -> list[str]:
    """Console errors since the last call (a request answered 4xx/5xx, a script error).

    A topic no node produces is nsqadmin's 502 ``failed to query any nsqd`` (Go's answer too); a page
    that shows it as such (#no-producers) expects that one."""
    expected = driver.find_elements(By.ID, "no-producers")
    return [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"
            and not (expected and "/api/topics/" in e["message"] and "status of 502" in e["message"])]


def _problems(driver: Any, path: str) -> list[str]:
    """What is wrong with the page now shown for ``path`` (under the base path): its heading and
    content, or an error view."""
    found: list[str] = []
    for css, what in (("#not-found", "a 404 view"), ("#error", "an error"), (".alert.error", "an error alert"),
                      ("#warning", "a warning")):
        for el in driver.find_elements(By.CSS_SELECTOR, css):
            if el.is_displayed():
                found.append(f"{what}: {el.text!r}")
    title = driver.title
    if title.startswith("404") or "not found" in title.lower():
        found.append(f"title {title!r}")
    heads = driver.find_elements(By.CSS_SELECTOR, "#main h1")
    head = heads[0].text if heads else ""
    parts = [unquote(p) for p in path.split("/") if p]

    def has(css: str) -> bool:
        return bool(driver.find_elements(By.CSS_SELECTOR, css))

    if not parts or parts == ["topics"]:
        ok = head == "Topics" and has("#topics tr[data-topic]")
    elif parts[0] == "topics" and len(parts) == 2:
        ok = head.startswith("Topic ") and _text(driver, "#topic-name") == parts[1] and (
            has("#nodes tr[data-node]") or has("#no-producers"))
    elif parts[0] == "topics" and len(parts) == 3:
        ok = head.startswith("Channel ") and _text(driver, "#channel-name") == parts[2] and (
            has("#nodes tr[data-node]") or has("#no-producers"))
    elif parts == ["nodes"]:
        ok = head.startswith("Nodes (") and has("#nodes tr[data-node]")
    elif parts[0] == "nodes" and len(parts) == 2:
        ok = head.startswith("Node ") and parts[1] in _text(driver, "#node-name") and has("#node-topics tbody.topic")
    elif parts == ["lookup"]:
        ok = head == "Lookup" and has("#producers tr[data-topic]")
    elif parts == ["counter"]:
        ok = head == "Messages processed" and has("#counter")
    else:
        ok = False
    if not ok:
        found.append(f"not the page's own heading and content (h1 {head!r})")
    return found


def _text(driver: Any, css: str) -> str:
    els = driver.find_elements(By.CSS_SELECTOR, css)
    return str(els[0].text) if els else ""


def _click(driver: Any, href: str) -> None:
    """Click (selenium's real click) the link written as ``href`` on the page shown now."""
    for attempt in range(5):
        link = driver.execute_script(_FIND_JS, href)
        assert link is not None, f"no link to {href} on {driver.current_url}"
        try:
            link.click()
            return
        except StaleElementReferenceException:  # the page redrew itself (every 3s) under the click
            if attempt == 4:
                raise


@dataclass
class Visit:
    href: str
    parent: str
    problems: list[str]


def crawl(driver: Any, origin: str, base: str) -> list[Visit]:
    """Open the front page (``base``), then click every same-origin link breadth first, each href once."""
    front = base or "/"
    driver.get(origin + front)
    _wait_drawn(driver, 0, front, "the front page")
    _failed_requests(driver)
    queue: deque[tuple[str, str]] = deque()
    seen: set[str] = set()

    def collect(page: str) -> None:
        for written, absolute in driver.execute_script(_LINKS_JS):
            if urlsplit(absolute).fragment or written in seen:
                continue
            seen.add(written)
            queue.append((written, page))

    collect(front)
    visits: list[Visit] = []
    while queue and len(visits) < MAX_PAGES:
        href, parent = queue.popleft()
        if urlsplit(driver.current_url).path != parent:
            driver.get(origin + parent)
            _wait_drawn(driver, 0, parent, "the link's page")
        _failed_requests(driver)
        since = _now(driver)
        _click(driver, href)
        path = urlsplit(href).path
        assert path.startswith(front), f"{href} (on {parent}) is not under the base path {front}"
        problems = _not_drawn(driver, since, path) or _problems(driver, path[len(base):])
        problems += [f"console: {m}" for m in _failed_requests(driver)]
        collect(href)
        # the same URL loaded afresh, as a bookmark or a pasted link opens it
        since = _now(driver)
        driver.refresh()
        problems += [f"reloaded: {p}" for p in _not_drawn(driver, since, path) or _problems(driver, path[len(base):])]
        problems += [f"reloaded, console: {m}" for m in _failed_requests(driver)]
        visits.append(Visit(href, parent, problems))
    assert not queue, f"more than {MAX_PAGES} pages: {[h for h, _ in queue]}"
    return visits


@pytest.mark.parametrize("base", ["", BASE_PATH], ids=["root", "base-path"])
def test_every_link_opens_its_page(browser: Any, cluster: Cluster, base: str) -> None:
    """Clicking every link of every page, breadth first from the front page, opens a page that shows its
    own content and no error: topics, channels (ephemeral ones too), nodes over IPv4 and IPv6, lookup;
    at the root and under --base-path."""
    started = time.monotonic()
    admin = cluster.based if base else cluster.admin
    visits = crawl(browser, f"http://{admin.http_address}", base)
    broken = {v.href: (v.parent, v.problems) for v in visits if v.problems}
    assert not broken, "links that do not open their page:\n" + "\n".join(
        f"  {href} (on {parent}): {'; '.join(problems)}" for href, (parent, problems) in broken.items())
    opened = {unquote(urlsplit(v.href).path)[len(base):] or "/" for v in visits}
    want = {"/", "/topics", "/nodes", "/lookup", "/counter",
            "/topics/orders", "/topics/logs", "/topics/logs/tail", "/topics/live#ephemeral",
            "/topics/orders/billing", "/topics/orders/tmp#ephemeral", "/topics/live#ephemeral/watch",
            f"/nodes/{cluster.node_name(cluster.a)}", f"/nodes/{cluster.node_name(cluster.b)}"}
    assert want <= opened, f"never reached: {sorted(want - opened)}"
    print(f"\n{len(visits)} links clicked in {time.monotonic() - started:.1f}s"
          f"{'' if IPV6 else ' (no IPv6 loopback here: node B on 127.0.0.1)'}")


@pytest.mark.skipif(not IPV6, reason="this machine has no IPv6 loopback ([::1]) to reach a node over")
def test_ipv6_node_is_linked_bracketed(browser: Any, cluster: Cluster) -> None:
    """A node registered with an IPv6 broadcast address is linked as ``[::1]:PORT``, encoded as one path
    segment, and its page names it as nsqadmin does: ``hostname:PORT ([::1]:PORT)``."""
    browser.get(f"http://{cluster.admin.http_address}/nodes")
    _wait_drawn(browser, 0, "/nodes", "the nodes page")
    port = cluster.b.http[1]
    href = f"/nodes/%5B%3A%3A1%5D%3A{port}"
    assert href in {h for h, _ in browser.execute_script(_LINKS_JS)}
    since = _now(browser)
    _click(browser, href)
    _wait_drawn(browser, since, href, "the IPv6 node's page")
    producers = get_json(f"http://{cluster.lookupd.http_address}/nodes")["producers"]
    hostname = next(p["hostname"] for p in producers if p["http_port"] == port)
    assert _text(browser, "#node-name") == f"{hostname}:{port} ([::1]:{port})"
