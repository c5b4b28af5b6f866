"""nsqtw-admin's pages in a real headless Chromium (Debian's chromium + chromedriver, via selenium).

One browser session and one cluster (nsqtw-lookupd, two nsqtw nodes,
nsqtw-admin polling history every second) for the module. Every page is
loaded and its numbers checked against the nodes' own ``/stats``; pause and
empty are clicked (through the confirmation) and the nodes checked to have
changed; a killed node leaves the pages rendering with its error shown.
Screenshots of every page are saved under ``tests/artifacts/admin/`` (or
``$NSQTW_ARTIFACTS``), ignored by git; docs/img/ holds a copy (``node-b.png``
is docs/img/admin-node.png).

Beside that cluster, ``test_pages_show_what_go_nsqadmin_shows`` runs Go
nsqlookupd, two Go nsqd, Go nsqadmin v1.3.0 and nsqtw-admin over one
cluster in the same scenario, and checks that every row and cell of Go's
pages is on ours (``go-*.png`` and ``side-by-side-*.png`` are the two
sides). It is skipped where Go's programs are not found
(``$NSQTW_GO_BIN`` or ``../shared/anchor/bin``).

``.ci/run`` installs chromium and chromium-driver; without them (a developer
machine) the module is skipped with the apt-get line to run.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from tests.admin_reference import get_json, http
from tests.daemon import ROOT, AdminDaemon, Daemon, LookupdDaemon
from tests.integration.browser import ARTIFACTS, By, WebDriverWait, click_confirmed, open_page, wait_until
from tests.rawclient import Client, pub


class Cluster:
    def __init__(self, lookupd: Daemon, a: Daemon, b: Daemon, admin: Daemon) -> None:
        self.lookupd, self.a, self.b, self.admin = lookupd, a, b, admin
        self.clients: list[Client] = []

    def url(self, path: str) -> str:
        return f"http://{self.admin.http_address}{path}"

    def stats(self, node: Daemon) -> Any:
        return get_json(f"http://{node.http_address}/stats?format=json")


def _channel(stats: Any, topic: str, channel: str) -> dict[str, Any]:
    for t in stats["topics"]:
        if t["topic_name"] == topic:
            for c in t["channels"]:
                if c["channel_name"] == channel:
                    return dict(c)
    raise KeyError(f"{topic}/{channel}")


def _all_finished(node: str, topic: str, channel: str, count: int) -> bool:
    """The node's channel has had ``count`` messages and holds none in flight."""
    c = _channel(get_json(f"http://{node}/stats?format=json"), topic, channel)
    return bool(c["message_count"] == count and c["in_flight_count"] == 0)


#: the nodes keep end-to-end latency percentiles, which the topic and channel pages show
E2E = ("--e2e-processing-latency-percentile=0.99", "--e2e-processing-latency-percentile=0.5")


def populate(lookupd_http: str, a: tuple[str, str], b: tuple[str, str]) -> list[Client]:
    """The scenario every page is looked at in, on nodes A and B (each ``(tcp, http)``), left still.

    orders on both nodes with billing on both and audit (paused) on B, 7 and 5 messages;
    logs on B, tombstoned on the lookupd; metrics on both, 10 messages each consumed and
    finished through channel agg (end-to-end latencies, with the nodes'
    --e2e-processing-latency-percentile). On A a consumer of billing holds 2 messages in flight
    (for 10 minutes); on B one took 3 of billing's, requeued one, deferred one for 10 minutes
    and let the third time out, then stopped (RDY 0). Nothing changes for minutes after.
    """
    for _, node in (a, b):
        http("POST", f"http://{node}/topic/create?topic=orders")
        http("POST", f"http://{node}/channel/create?topic=orders&channel=billing")
    http("POST", f"http://{b[1]}/channel/create?topic=orders&channel=audit")
    http("POST", f"http://{b[1]}/channel/pause?topic=orders&channel=audit")
    http("POST", f"http://{b[1]}/topic/create?topic=logs")
    pub(a[0], "orders", *[b"a%d" % i for i in range(7)])
    pub(b[0], "orders", *[b"b%d" % i for i in range(5)])
    pub(b[0], "logs", b"l0")
    for tcp, address in (a, b):
        http("POST", f"http://{address}/channel/create?topic=metrics&channel=agg")
        pub(tcp, "metrics", *[b"m%d" % i for i in range(10)])
        reader = Client(tcp)
        reader.sub("metrics", "agg", rdy=10)
        for m in reader.messages(10, timeout=10):
            reader.fin(m)
        wait_until(lambda n=address: _all_finished(n, "metrics", "agg", 10), what="metrics finished")
        reader.close()
    consumer = Client(a[0])
    consumer.identify(client_id="browser-test", hostname="tester", user_agent="browser-test/1.0",
                      feature_negotiation=True, msg_timeout=600_000)
    consumer.sub("orders", "billing", rdy=2)
    consumer.messages(2, timeout=10)
    worker = Client(b[0])
    worker.identify(client_id="worker-b", hostname="worker2", user_agent="pynsq/0.9",
                    feature_negotiation=True, msg_timeout=1000)
    worker.sub("orders", "billing", rdy=3)
    taken = worker.messages(3, timeout=10)
    worker.cmd("RDY", 0)
    worker.send(b"REQ " + taken[0].id + b" 0\n")
    worker.send(b"REQ " + taken[1].id + b" 600000\n")
    wait_until(lambda: get_json(f"http://{lookupd_http}/lookup?topic=logs")["producers"]
               and len(get_json(f"http://{lookupd_http}/lookup?topic=orders")["producers"]) == 2
               and "audit" in get_json(f"http://{lookupd_http}/channels?topic=orders")["channels"],
               what="lookupd registrations")
    http("POST", f"http://{lookupd_http}/topic/tombstone?topic=logs&node=127.0.0.1:{b[1].rsplit(':', 1)[1]}")
    # the third message times out after the worker's 1s msg_timeout
    wait_until(lambda: _channel(get_json(f"http://{b[1]}/stats?format=json"), "orders", "billing")
               ["timeout_count"] == 1, what="the timed-out message")
    return [consumer, worker]


class Daemons:
    """Daemons started in folders of one scratch directory, all stopped (last first) at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.started: list[Daemon] = []

    def start(self, daemon: Daemon) -> Daemon:
        self.started.append(daemon)
        return daemon.start()

    def folder(self, name: str) -> str:
        (self.root / name).mkdir()
        return str(self.root / name)

    def stop(self) -> None:
        for d in reversed(self.started):
            d.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    daemons = Daemons(tmp_path_factory.mktemp("admin-browser"))
    start, folder = daemons.start, daemons.folder
    try:
        lookupd = start(LookupdDaemon(folder("lookupd"), "--tombstone-lifetime=1h"))
        a, b = (start(Daemon(folder(n), f"--lookupd-tcp-address={lookupd.tcp_address}",
                             "--broadcast-address=127.0.0.1", *E2E)) for n in ("a", "b"))
        admin = start(AdminDaemon(folder("admin"), f"--lookupd-http-address={lookupd.http_address}",
                                  "--history-interval=1s", "--http-client-request-timeout=1s"))
        c = Cluster(lookupd, a, b, admin)
        c.clients = populate(lookupd.http_address, (a.tcp_address, a.http_address),
                             (b.tcp_address, b.http_address))
        yield c
        for client in c.clients:
            client.close()
    finally:
        daemons.stop()


def _open(driver: Any, c: Cluster, path: str) -> None:
    open_page(driver, c.url(path))


def _text(driver: Any, css: str) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def _number(driver: Any, css: str) -> int:
    return int(_text(driver, css).replace(",", ""))


def _shot(driver: Any, name: str) -> None:
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def _traffic(c: Cluster, seconds: float) -> None:
    """Publish to orders on both nodes at a changing rate for a while, so the charts have a shape."""
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        i += 1
        burst = 1 + (i % 8)
        pub(c.a.tcp_address, "orders", *[b"t%d" % i] * burst)
        pub(c.b.tcp_address, "orders", *[b"t%d" % i] * (burst // 2 + 1))
        time.sleep(0.05)


def _depths(c: Cluster, topic: str = "") -> tuple[int, int]:
    """(topic depth, channel backlog) over both nodes: the topics' own queues, their channels'."""
    topics = [t for n in (c.a, c.b) for t in c.stats(n)["topics"] if not topic or t["topic_name"] == topic]
    return sum(t["depth"] for t in topics), sum(ch["depth"] for t in topics for ch in t["channels"])


def _chart_title(driver: Any, field: str) -> str:
    return _text(driver, f'#charts [data-chart="{field}"] .chart-title')


def test_topics_page_lists_topics_and_charts_the_cluster(browser: Any, cluster: Cluster) -> None:
    """/topics lists every topic and charts the cluster's rate, topic depth and channel backlog, each named."""
    _traffic(cluster, 4.0)
    _open(browser, cluster, "/topics")
    wait_until(lambda: (_open(browser, cluster, "/topics"),
                        browser.find_elements(By.CSS_SELECTOR, '#charts [data-chart="rate"] polyline'))[1],
               what="the rate chart")
    assert _text(browser, '#topics tr[data-topic="orders"] a') == "orders"
    depth, backlog = _depths(cluster)
    assert backlog > depth  # the two are told apart: each chart shows its own
    wait_until(lambda: (_open(browser, cluster, "/topics"),
                        (_number(browser, '[data-field="depth-last"]'),
                         _number(browser, '[data-field="backlog-last"]')) == (depth, backlog))[1],
               what="the depth and backlog charts")
    assert (_chart_title(browser, "rate"), _chart_title(browser, "depth"), _chart_title(browser, "backlog")) == \
        ("topic message rate", "topic depth", "channel backlog")
    assert "not yet copied to channels" in _text(browser, '#charts [data-chart="depth"] .about')
    assert browser.find_elements(By.CSS_SELECTOR, '#charts svg polyline')
    _shot(browser, "topics")


def _hostname(c: Cluster, node: Daemon) -> str:
    """The node's hostname as the lookupd has it (nsqadmin's pages show it)."""
    producers = get_json(f"http://{c.lookupd.http_address}/nodes")["producers"]
    return next(str(p["hostname"]) for p in producers if p["http_port"] == node.http[1])


def test_topic_page_matches_every_node_stats(browser: Any, cluster: Cluster) -> None:
    """/topics/orders: each node as ``hostname:port (address)`` with its numbers, a Total row, every
    channel's sums, and headline and charts that name topic depth and channel backlog apart."""
    _open(browser, cluster, "/topics/orders")
    stats = {n.http_address: cluster.stats(n) for n in (cluster.a, cluster.b)}
    for node in (cluster.a, cluster.b):
        topic = next(t for t in stats[node.http_address]["topics"] if t["topic_name"] == "orders")
        row = f'#nodes tr[data-node="{node.http_address}"]'
        assert _text(browser, f'{row} td[data-field="node"]') == \
            f"{_hostname(cluster, node)}:{node.http[1]} ({node.http_address})"
        assert _number(browser, f'{row} td[data-field="message_count"]') == topic["message_count"]
        assert _number(browser, f'{row} td[data-field="channels"]') == len(topic["channels"])
        assert _text(browser, f'{row} td[data-field="memory_disk"]') == \
            f"{topic['depth'] - topic['backend_depth']} + {topic['backend_depth']}"
    topics = [t for s in stats.values() for t in s["topics"] if t["topic_name"] == "orders"]
    total = "#nodes tr[data-total]"
    assert _text(browser, f"{total} td") == "Total:"
    assert _number(browser, f'{total} td[data-field="depth"]') == sum(t["depth"] for t in topics)
    assert _number(browser, f'{total} td[data-field="message_count"]') == sum(t["message_count"] for t in topics)
    assert _number(browser, f'{total} td[data-field="channels"]') == 2
    for channel in ("billing", "audit"):
        per_node = [_channel(s, "orders", channel) for s in stats.values()
                    if any(ch["channel_name"] == channel for t in s["topics"] for ch in t["channels"])]
        row = f'#channels tr[data-channel="{channel}"]'
        for field in ("depth", "in_flight_count", "deferred_count", "requeue_count", "timeout_count",
                      "message_count", "client_count"):
            assert _number(browser, f'{row} td[data-field="{field}"]') == sum(c[field] for c in per_node), field
    assert _number(browser, '#channels tr[data-channel="billing"] td[data-field="deferred_count"]') == 1
    assert _number(browser, '#channels tr[data-channel="billing"] td[data-field="timeout_count"]') >= 1
    assert "paused" in _text(browser, '#channels tr[data-channel="audit"] td')
    assert _number(browser, '#totals [data-field="message_count"]') == sum(t["message_count"] for t in topics)
    depth, backlog = _depths(cluster, "orders")
    assert _number(browser, '#totals [data-field="depth"]') == depth
    assert _number(browser, '#totals [data-field="backlog"]') == backlog
    assert "topic depth" in _text(browser, "#totals") and "channel backlog" in _text(browser, "#totals")
    # the charts say which depth they draw, and draw the numbers the headline shows
    wait_until(lambda: (_open(browser, cluster, "/topics/orders"),
                        (_number(browser, '[data-field="depth-last"]'),
                         _number(browser, '[data-field="backlog-last"]')) == (depth, backlog))[1],
               what="the topic's charts")
    assert (_chart_title(browser, "depth"), _chart_title(browser, "backlog")) == ("topic depth", "channel backlog")
    _shot(browser, "topic")



def test_topic_and_channel_pages_show_end_to_end_latency(browser: Any, cluster: Cluster) -> None:
    """With --e2e-processing-latency-percentile, the topic and channel pages show each quantile's
    latency per node, per channel and in the Total row, under nsqadmin's headers (99th, 50th)."""
    latency = re.compile(r"(\d+h)?(\d+m)?(\d+\.\d\ds|\d+\.\d\dms|\d+us|\d+ns)")
    _open(browser, cluster, "/topics/metrics")
    heads = [e.get_attribute("textContent")
             for e in browser.find_elements(By.CSS_SELECTOR, "#nodes thead tr:last-child th")]
    assert heads[5:7] == ["99th", "50th"], heads
    assert "E2E Processing Latency" in browser.find_element(By.CSS_SELECTOR, "#nodes thead").get_attribute(
        "textContent")
    rows = [f'#nodes tr[data-node="{n.http_address}"]' for n in (cluster.a, cluster.b)]
    for row in rows + ["#nodes tr[data-total]", '#channels tr[data-channel="agg"]']:
        for q in ("0.99", "0.5"):
            assert latency.fullmatch(_text(browser, f'{row} td[data-field="e2e-{q}"]')), (row, q)
    _open(browser, cluster, "/topics/metrics/agg")
    assert latency.fullmatch(_text(browser, '#nodes tr[data-total] td[data-field="e2e-0.99"]'))


def test_channel_page_shows_every_client(browser: Any, cluster: Cluster) -> None:
    """/topics/orders/billing lists the consumer with its user agent, RDY, in-flight count and address."""
    _open(browser, cluster, "/topics/orders/billing")
    billing = _channel(cluster.stats(cluster.a), "orders", "billing")
    client = billing["clients"][0]
    row = f'#clients tr[data-client="{client["remote_address"]}"]'
    assert "browser-test/1.0" in _text(browser, f'{row} td[data-field="user_agent"]')
    assert _number(browser, f'{row} td[data-field="ready_count"]') == client["ready_count"] == 2
    assert _number(browser, f'{row} td[data-field="in_flight_count"]') == client["in_flight_count"] == 2
    per_node = [billing, _channel(cluster.stats(cluster.b), "orders", "billing")]
    assert _number(browser, '#totals [data-field="depth"]') == sum(c["depth"] for c in per_node)
    for field in ("depth", "in_flight_count", "deferred_count", "requeue_count", "timeout_count",
                  "message_count", "client_count"):
        assert _number(browser, f'#nodes tr[data-total] td[data-field="{field}"]') == \
            sum(c[field] for c in per_node), field
    # every client, named as nsqadmin names it: hostname:port (client id)
    worker = per_node[1]["clients"][0]
    row = f'#clients tr[data-client="{worker["remote_address"]}"]'
    assert _text(browser, f'{row} td[data-field="client_host"]') == \
        f"worker2:{worker['remote_address'].rsplit(':', 1)[1]} (worker-b)"
    assert _text(browser, f'{row} td[data-field="node"]') == cluster.b.http_address
    assert _number(browser, f'{row} td[data-field="requeue_count"]') == worker["requeue_count"] == 2
    assert _text(browser, '#charts [data-chart="depth"] .chart-title') == "channel depth"
    wait_until(lambda: (_open(browser, cluster, "/topics/orders/billing"),
                        browser.find_elements(By.CSS_SELECTOR, '#charts [data-chart="in_flight"] polyline'))[1],
               what="the channel's history chart")
    _shot(browser, "channel")


def test_nodes_and_node_pages(browser: Any, cluster: Cluster) -> None:
    """/nodes lists both nodes with their ports; /nodes/<node> totals the node's messages and clients."""
    _open(browser, cluster, "/nodes")
    for node in (cluster.a, cluster.b):
        row = f'#nodes tr[data-node="{node.http_address}"]'
        assert _number(browser, f'{row} td[data-field="tcp_port"]') == node.tcp[1]
        assert "orders" in _text(browser, f'{row} td[data-field="topics"]')
    # logs is tombstoned for B on the lookupd: marked, not hidden
    assert browser.find_elements(
        By.CSS_SELECTOR, f'#nodes tr[data-node="{cluster.b.http_address}"] s[data-tombstoned="logs"]')
    assert not browser.find_elements(
        By.CSS_SELECTOR, f'#nodes tr[data-node="{cluster.a.http_address}"] [data-tombstoned]')
    count, *names = _text(browser, f'#nodes tr[data-node="{cluster.b.http_address}"] td[data-field="topics"]').split()
    assert (count, sorted(names)) == ("3", ["logs", "metrics", "orders"])
    _shot(browser, "nodes")
    _open(browser, cluster, f"/nodes/{cluster.a.http_address}")
    stats = cluster.stats(cluster.a)
    assert _number(browser, '#totals [data-field="total_messages"]') == sum(
        t["message_count"] for t in stats["topics"])
    assert _number(browser, '#totals [data-field="total_clients"]') == 1
    _shot(browser, "node")


def test_node_page_shows_clients_counts_and_tombstones(browser: Any, cluster: Cluster) -> None:
    """/nodes/<B>: as nsqadmin's node page, each channel's deferred, requeued and timed-out counts, each
    client with its fields, paused channels, and the topic the lookupd holds a tombstone for marked."""
    _open(browser, cluster, f"/nodes/{cluster.b.http_address}")
    assert _text(browser, "#node-name") == f"{_hostname(cluster, cluster.b)}:{cluster.b.http[1]} " \
        f"({cluster.b.http_address})"
    stats = cluster.stats(cluster.b)
    billing = _channel(stats, "orders", "billing")
    row = '#node-topics tr[data-channel="orders/billing"]'
    for field in ("depth", "in_flight_count", "deferred_count", "requeue_count", "timeout_count",
                  "message_count", "client_count"):
        assert _number(browser, f'{row} td[data-field="{field}"]') == billing[field], field
    assert (billing["deferred_count"], billing["requeue_count"], billing["timeout_count"]) == (1, 2, 1)
    assert "paused" in _text(browser, '#node-topics tr[data-channel="orders/audit"] td')
    (client,) = billing["clients"]
    crow = f'#node-topics tbody[data-topic="orders"] tr[data-client="{client["remote_address"]}"]'
    assert _text(browser, f'{crow} td[data-field="client_host"]') == \
        f"worker2:{client['remote_address'].rsplit(':', 1)[1]} (worker-b)"
    assert _text(browser, f'{crow} td[data-field="user_agent"]').startswith("pynsq/0.9")
    for field in ("in_flight_count", "ready_count", "finish_count", "requeue_count", "message_count"):
        assert _number(browser, f'{crow} td[data-field="{field}"]') == client[field], field
    assert re.fullmatch(r"(\d+h)?(\d+m)?\d+s", _text(browser, f'{crow} td[data-field="connected"]'))
    # logs: tombstoned on the lookupd, still on the node; orders: not
    assert browser.find_elements(By.CSS_SELECTOR, '#node-topics tbody[data-topic="logs"] s[data-tombstoned="logs"]')
    assert "tombstoned" in _text(browser, '#node-topics tbody[data-topic="logs"] tr.topic')
    assert not browser.find_elements(By.CSS_SELECTOR, '#node-topics tbody[data-topic="orders"] [data-tombstoned]')
    assert browser.find_elements(
        By.CSS_SELECTOR, f'#node-topics tbody[data-topic="orders"] button[data-tombstone="{cluster.b.http_address}"]')
    _shot(browser, "node-b")


def test_lookup_and_counter_pages(browser: Any, cluster: Cluster) -> None:
    """/lookup shows which nodes produce each topic; /counter shows the running total of messages."""
    _open(browser, cluster, "/lookup")
    producers = _text(browser, '#producers tr[data-topic="orders"]')
    assert cluster.a.http_address in producers and cluster.b.http_address in producers
    assert _text(browser, f'#lookupds tr[data-lookupd="{cluster.lookupd.http_address}"]') == \
        cluster.lookupd.http_address
    assert browser.find_elements(
        By.CSS_SELECTOR, f'#producers tr[data-topic="logs"] s[data-tombstoned="{cluster.b.http_address}"]')
    _shot(browser, "lookup")
    _open(browser, cluster, "/counter")
    total = sum(ch["message_count"] for n in (cluster.a, cluster.b)
                for t in cluster.stats(n)["topics"] for ch in t["channels"])
    assert _number(browser, '#counter') == total
    pub(cluster.a.tcp_address, "orders", b"more")
    # A's orders has one channel (billing): one more message there; the page updates itself
    wait_until(lambda: _number(browser, '#counter') == total + 1, what="the live counter")
    _shot(browser, "counter")


def test_unknown_topic_shows_a_404_page(browser: Any, cluster: Cluster) -> None:
    """A topic, channel or node nobody knows gets the 404 view, not an error."""
    _open(browser, cluster, "/topics/nope")
    assert "404" in _text(browser, "#not-found")
    _open(browser, cluster, "/topics/orders/nope")
    assert "Channel orders/nope not found" in _text(browser, "#not-found")
    _shot(browser, "404")
    _open(browser, cluster, "/nodes/127.0.0.1:1")
    assert "Node 127.0.0.1:1 not found" in _text(browser, "#not-found")


def test_pause_and_empty_change_the_nodes(browser: Any, cluster: Cluster) -> None:
    """Pause then Empty on the channel page, each confirmed, pause and empty billing on both nodes."""
    _open(browser, cluster, "/topics/orders/billing")
    browser.find_element(By.CSS_SELECTOR, 'button[data-action="pause"]').click()
    _shot(browser, "confirm")
    browser.find_element(By.ID, "confirm-cancel").click()
    assert not _channel(cluster.stats(cluster.a), "orders", "billing")["paused"]  # cancel did nothing
    click_confirmed(browser, "pause")
    for node in (cluster.a, cluster.b):
        wait_until(lambda n=node: _channel(cluster.stats(n), "orders", "billing")["paused"], what="paused")
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, 'button[data-action="unpause"]'), what="Unpause button")
    assert _channel(cluster.stats(cluster.b), "orders", "billing")["depth"] > 0
    click_confirmed(browser, "empty")
    for node in (cluster.a, cluster.b):
        wait_until(lambda n=node: _channel(cluster.stats(n), "orders", "billing")["depth"] == 0, what="emptied")
    wait_until(lambda: _number(browser, '#totals [data-field="depth"]') == 0, what="the page to show depth 0")
    click_confirmed(browser, "unpause")
    for node in (cluster.a, cluster.b):
        wait_until(lambda n=node: not _channel(cluster.stats(n), "orders", "billing")["paused"], what="unpaused")


def test_a_hung_node_leaves_the_page_rendering_with_its_error(browser: Any, cluster: Cluster) -> None:
    """With node B frozen (SIGSTOP: lookupd still lists it), the topic page renders node A and B's error."""
    os.kill(cluster.b.pid, signal.SIGSTOP)
    try:
        _open(browser, cluster, "/topics/orders")
        wait_until(lambda: cluster.b.http_address in _text(browser, "#warning"), what="the warning")
        assert "Client.Timeout exceeded" in _text(browser, "#warning")
        assert browser.find_elements(By.CSS_SELECTOR, f'#nodes tr[data-node="{cluster.a.http_address}"]')
        _shot(browser, "node-down")
    finally:
        os.kill(cluster.b.pid, signal.SIGCONT)


def test_graphite_graphs_with_graphite_url(browser: Any, cluster: Cluster, tmp_path: Path) -> None:
    """With --graphite-url and --proxy-graphite, topic pages show graphite's graph of nsqd's statsd counter."""
    admin = AdminDaemon(str(tmp_path), f"--lookupd-http-address={cluster.lookupd.http_address}",
                        "--graphite-url=http://127.0.0.1:9", "--proxy-graphite", "--history-interval=0")
    admin.start()
    try:
        browser.get(f"http://{admin.http_address}/topics/orders")
        WebDriverWait(browser, 20).until(lambda d: d.find_element(By.ID, "main").get_attribute("data-loaded"))
        src = browser.find_element(By.CSS_SELECTOR, "img.graphite").get_attribute("src")
        assert src.startswith(f"http://{admin.http_address}/render?")
        assert "nonNegativeDerivative(sumSeries(stats.counters.nsq.*.topic.orders.message_count.count))" in \
            unquote(src)
        assert not browser.find_elements(By.ID, "charts")  # no history without polling
    finally:
        admin.stop()


# --- side by side with Go nsqadmin v1.3.0 ---------------------------------------------------------

#: Go NSQ v1.3.0's programs: $NSQTW_GO_BIN, or ../shared/anchor/bin beside the checkout (or beside
#: the folder holding it, for a worktree)
GO_BIN = os.environ.get("NSQTW_GO_BIN") or next(
    (d for d in (os.path.join(ROOT, "..", "shared", "anchor", "bin"),
                 os.path.join(ROOT, "..", "..", "shared", "anchor", "bin")) if os.path.isdir(d)), "")


class GoDaemon(Daemon):
    """One of Go NSQ v1.3.0's programs, started and read as an nsqtw daemon is (it logs the same lines)."""

    def __init__(self, program: str, data_path: str, *args: str, listens: tuple[str, ...] = ("TCP", "HTTP")) -> None:
        super().__init__(data_path, *args)
        self.program = program
        self.listens = listens

    def address_args(self, tcp: str, http: str) -> list[str]:
        return super().address_args(tcp, http) if "TCP" in self.listens else [f"--http-address={http}"]

    def command(self, tcp: str, http: str) -> list[str]:
        extra = [f"--data-path={self.data_path}"] if self.program == "nsqd" else []
        return [os.path.join(GO_BIN, self.program), *self.address_args(tcp, http), *extra, *self.args]


class SideBySide:
    def __init__(self, go_admin: Daemon, admin: Daemon, nodes: list[Daemon]) -> None:
        self.go_admin, self.admin, self.nodes = go_admin, admin, nodes


@pytest.fixture(scope="module")
def go_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SideBySide]:
    """Go nsqlookupd, two Go nsqd, Go nsqadmin and nsqtw-admin in front of the same cluster."""
    if not all(os.access(os.path.join(GO_BIN, p), os.X_OK) for p in ("nsqd", "nsqlookupd", "nsqadmin")):
        pytest.skip("Go NSQ v1.3.0 (../shared/anchor/bin) is not on this machine")
    daemons = Daemons(tmp_path_factory.mktemp("admin-side-by-side"))
    start, folder = daemons.start, daemons.folder
    clients: list[Client] = []
    try:
        lookupd = start(GoDaemon("nsqlookupd", folder("lookupd"), "--tombstone-lifetime=1h"))
        a, b = (start(GoDaemon("nsqd", folder(n), f"--lookupd-tcp-address={lookupd.tcp_address}",
                               "--broadcast-address=127.0.0.1", *E2E)) for n in ("a", "b"))
        go_admin = start(GoDaemon("nsqadmin", folder("go-admin"), f"--lookupd-http-address={lookupd.http_address}",
                                  listens=("HTTP",)))
        admin = start(AdminDaemon(folder("admin"), f"--lookupd-http-address={lookupd.http_address}",
                                  "--history-interval=1s"))
        clients = populate(lookupd.http_address, (a.tcp_address, a.http_address), (b.tcp_address, b.http_address))
        yield SideBySide(go_admin, admin, [a, b])
    finally:
        for client in clients:
            client.close()
        daemons.stop()


# Every table row on a page, as {header: cell text}: a row of header cells names the cells of the
# rows under it (nsqadmin's node page puts topic, channel and client headers in one table), spans
# are spread over the columns they cover, and a row's kind is its first named column.
_ROWS_JS = """
const norm = (s) => (s || "").replace(/\\u2718/g, "").replace(/\\s+/g, " ").trim();
const out = [];
document.querySelectorAll(arguments[0] + " table").forEach((table) => {
  let head = null;
  Array.from(table.rows).forEach((row) => {
    const cells = [];
    Array.from(row.cells).forEach((c) => {
      for (let i = 0; i < c.colSpan; i++) { cells.push({th: c.tagName === "TH", text: i ? "" : norm(c.textContent)}); }
    });
    if (row.cells.length && Array.from(row.cells).every((c) => c.tagName === "TH")) {
      head = cells.map((c) => c.text);
      return;
    }
    // a lone cell under several headers is a notice ("no clients"), not a row
    if (!head || (row.cells.length < 2 && head.length > 1)) { return; }
    const named = {};
    head.forEach((h, i) => { if (h && i < cells.length) { named[h] = cells[i].text; } });
    const kind = head.find((h) => h);
    out.push({kind: kind, key: named[kind].replace(/:$/, ""), cells: named});
  });
});
return out;
"""

#: cells that change from one look to the next: the connected time, and the end-to-end latency
#: percentiles (each admin reads the nodes' sliding windows at its own moment), whose cells must be
#: there and filled but need not hold the same value
_LIVE = {"Connected"}
_PERCENTILE = re.compile(r"^\d+(\.\d+)?th$", re.IGNORECASE)


def _live(header: str) -> bool:
    return header in _LIVE or bool(_PERCENTILE.match(header.strip()))


def _rows(driver: Any, url: str, scope: str, ready: Callable[[Any], Any]) -> list[dict[str, Any]]:
    driver.get(url)
    WebDriverWait(driver, 20).until(ready)
    time.sleep(0.5)  # Go's page fills its tables from several requests
    return list(driver.execute_script(_ROWS_JS, scope))


def _same_cell(go: str, ours: str) -> bool:
    """Ours shows what Go's shows, perhaps followed by more (a protocol version, a badge, a list)."""
    return ours == go or ours.startswith(go + " ")


def _same_key(go: str, ours: str) -> bool:
    # Go's node page names a client by its hostname alone; ours as its channel page: hostname:port (id)
    return _same_cell(go, ours) or ours.startswith(go + ":")


def _not_on_ours(go_rows: list[dict[str, Any]], ours: list[dict[str, Any]]) -> list[str]:
    """Each of Go's rows must have a row on ours of the same kind and key showing every cell Go shows."""
    missing = []
    for row in go_rows:
        candidates = [r for r in ours if r["kind"] == row["kind"] and _same_key(row["key"], r["key"])]
        wanted = {h: v for h, v in row["cells"].items() if not _live(h) and h != row["kind"] and v}
        filled = {h for h, v in row["cells"].items() if _live(h) and v}
        if not any(all(h in r["cells"] and _same_cell(v, r["cells"][h]) for h, v in wanted.items())
                   and all(r["cells"].get(h) for h in filled)
                   for r in candidates):
            missing.append(f"{row['kind']} {row['key']!r}: Go shows {wanted}; ours: "
                           f"{[r['cells'] for r in candidates] or 'no such row'}")
    return missing


def _go_shot(driver: Any, name: str) -> None:
    driver.save_screenshot(str(ARTIFACTS / f"go-{name}.png"))


def test_pages_show_what_go_nsqadmin_shows(browser: Any, go_cluster: SideBySide) -> None:
    """Over one Go cluster, every row and cell of Go nsqadmin's topic, channel, node, nodes, lookup and
    topics pages is on nsqtw-admin's page (hostnames, Total rows, clients with their fields, deferred,
    requeued and timed-out counts, paused channels, tombstoned topics), and the counters agree."""
    go = f"http://{go_cluster.go_admin.http_address}"
    ours = f"http://{go_cluster.admin.http_address}"
    a, b = (n.http_address for n in go_cluster.nodes)
    loaded = lambda d: d.find_element(By.ID, "main").get_attribute("data-loaded")  # noqa: E731
    pages = [("/", "/topics", "topics", 2), ("/topics/orders", "/topics/orders", "topic", 5),
             ("/topics/orders/billing", "/topics/orders/billing", "channel", 5),
             ("/topics/metrics", "/topics/metrics", "topic-e2e", 4),
             ("/topics/metrics/agg", "/topics/metrics/agg", "channel-e2e", 3),
             (f"/nodes/{a}", f"/nodes/{a}", "node-a", 3), (f"/nodes/{b}", f"/nodes/{b}", "node-b", 5),
             ("/nodes", "/nodes", "nodes", 2), ("/lookup", "/lookup", "lookup", 1)]
    for go_path, our_path, name, least in pages:
        go_rows = _rows(browser, go + go_path, "body", lambda d: d.find_elements(By.CSS_SELECTOR, "table td"))
        _go_shot(browser, name)
        our_rows = _rows(browser, ours + our_path, "#main", loaded)
        _shot(browser, f"side-by-side-{name}")
        assert len(go_rows) >= least, (name, go_rows)  # Go's page did show the scenario
        assert not _not_on_ours(go_rows, our_rows), (name, _not_on_ours(go_rows, our_rows))
        if name == "topic":  # the items Go shows that ours once lacked
            keys = {r["key"] for r in go_rows}
            assert "Total" in keys and any(re.fullmatch(r".+:\d+ \(127\.0\.0\.1:\d+\)", k) for k in keys), keys
        if name.endswith("-e2e"):  # Go shows each quantile's latency: so does ours
            assert {"99th", "50th"} <= {h for r in go_rows for h in r["cells"]}, go_rows
        if name == "node-b":
            kinds = {r["kind"] for r in go_rows}
            assert {"Topic", "Channel", "Client Host"} <= kinds, kinds
    # the node page's totals: "N Messages", "N Clients" on Go's, #totals on ours
    browser.get(f"{go}/nodes/{b}")
    WebDriverWait(browser, 20).until(lambda d: "Clients" in d.find_element(By.TAG_NAME, "body").text)
    found = re.search(r"([\d,]+) Messages\s+([\d,]+) Clients", browser.find_element(By.TAG_NAME, "body").text)
    assert found, browser.find_element(By.TAG_NAME, "body").text
    open_page(browser, f"{ours}/nodes/{b}")
    assert (_number(browser, '#totals [data-field="total_messages"]'),
            _number(browser, '#totals [data-field="total_clients"]')) == \
        tuple(int(g.replace(",", "")) for g in found.groups())
    # the lookup page's topics without producers (logs: its one producer is tombstoned)
    browser.get(f"{go}/lookup")
    WebDriverWait(browser, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, "li a[href^='/topics/']"))
    go_inactive = {e.text.strip() for e in browser.find_elements(By.CSS_SELECTOR, "li a[href^='/topics/']")
                   if "/" not in e.get_attribute("pathname")[len("/topics/"):]}
    assert go_inactive == {"logs"}
    open_page(browser, f"{ours}/lookup")
    assert {e.get_attribute("data-topic") for e in browser.find_elements(By.CSS_SELECTOR, "#inactive tr[data-topic]")} \
        == go_inactive
    # the counter: Go's flip digits, ours one number
    browser.get(f"{go}/counter")
    WebDriverWait(browser, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".numbers .number .top"))
    go_count = int("".join(e.get_attribute("textContent") for e in
                           browser.find_elements(By.CSS_SELECTOR, ".numbers .number .top")))
    open_page(browser, f"{ours}/counter")
    assert _number(browser, "#counter") == go_count > 0


