"""nsqtw-admin shows replication (``--replicas=2``) in a real headless Chromium.

nsqtw-lookupd, nodes A and B with ``--replicas=2`` and node C without it (as
Go nsqd or ``--replicas=1``: its ``/stats`` has no replication fields), all
registered with the lookupd, and nsqtw-admin over the lookupd. Topic
``orders`` with channel ``billing`` is published to on A (until A's
``/stats`` says the topic's replica is in sync) and on C. Then:

- the topic page's Replica column shows A's peer (B) and ``in sync``, and
  nothing in C's row;
- B's node page lists the standby it holds for A (owner, topic, messages
  still unfinished) and its counters; C's node page has no replication;
- B killed, A's row turns ``under-replicated``, in red.

Screenshots go under ``tests/artifacts/admin/`` (``replica-*.png``) as in
``test_admin_browser.py``; docs/img/admin-replica.png and admin-replica-node.png
are copies of ``replica-topic.png`` and ``replica-node.png``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.admin_reference import get_json, http
from tests.daemon import AdminDaemon, Daemon, LookupdDaemon, Started

# skipped where Debian's chromium and its driver are missing
from tests.integration.browser import ARTIFACTS, By, open_page, wait_until  # isort: skip

TOPIC = "orders"
MESSAGES = 3


@dataclass
class Cluster:
    lookupd: Daemon
    a: Daemon
    b: Daemon
    c: Daemon
    admin: Daemon

    def url(self, path: str) -> str:
        return f"http://{self.admin.http_address}{path}"


def _replica(node: Daemon) -> Any:
    stats = get_json(f"http://{node.http_address}/stats?format=json&topic={TOPIC}")
    return next(t for t in stats["topics"] if t["topic_name"] == TOPIC).get("replica")


def _standbys(node: Daemon) -> Any:
    return get_json(f"http://{node.http_address}/stats?format=json").get("standby")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = Started(str(tmp_path_factory.mktemp("admin-replica")))
    folder = started.folder
    try:
        lookupd = started.start(LookupdDaemon(folder("lookupd")))
        common = (f"--lookupd-tcp-address={lookupd.tcp_address}", "--broadcast-address=127.0.0.1")
        a = started.start(Daemon(folder("a"), *common, "--node-id=1", "--replicas=2"))
        b = started.start(Daemon(folder("b"), *common, "--node-id=2", "--replicas=2"))
        c = started.start(Daemon(folder("c"), *common, "--node-id=3"))
        admin = started.start(AdminDaemon(folder("admin"), f"--lookupd-http-address={lookupd.http_address}",
                                          "--history-interval=0", "--http-client-request-timeout=2s"))
        wait_until(lambda: len(get_json(f"http://{lookupd.http_address}/nodes")["producers"]) == 3,
                   what="three nodes on the lookupd")
        for node in (a, c):
            for path in (f"topic/create?topic={TOPIC}", f"channel/create?topic={TOPIC}&channel=billing"):
                assert http("POST", f"http://{node.http_address}/{path}")[0] == 200, path
        # A answers a publish once B holds its copy: the first ones wait for A to find B
        for i in range(MESSAGES):
            status, _, body = http("POST", f"http://{a.http_address}/pub?topic={TOPIC}", b"order %d" % i)
            assert status == 200, body
        http("POST", f"http://{c.http_address}/pub?topic={TOPIC}", b"order c")
        wait_until(lambda: (_replica(a) or {}).get("state") == "in_sync", what="A's replica in sync")
        # B's topic is a real one too (B holds A's copies of it, and lookupd lists B as its producer):
        # B places it on A, whose link comes up a moment after A's to B
        wait_until(lambda: (_replica(b) or {}).get("state") == "in_sync", what="B's replica in sync")
        wait_until(lambda: [s["messages"] for s in _standbys(b) or () if s["topic"] == TOPIC] == [MESSAGES],
                   what="B's standby for A")
        wait_until(lambda: len(get_json(f"http://{lookupd.http_address}/lookup?topic={TOPIC}")["producers"]) >= 2,
                   what="the topic's producers on the lookupd")
        yield Cluster(lookupd, a, b, c, admin)
    finally:
        started.stop_all()


def _open(driver: Any, c: Cluster, path: str) -> None:
    open_page(driver, c.url(path))
    assert not driver.find_elements(By.CSS_SELECTOR, "#error"), driver.find_element(By.ID, "main").text


def _text(driver: Any, css: str) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def test_topic_page_shows_each_nodes_replica(browser: Any, cluster: Cluster) -> None:
    """A's row: its peer (B) and ``in sync`` with the lag; C's row (no replication): an empty cell."""
    replica = _replica(cluster.a)
    assert (replica["peer"], replica["state"]) == (cluster.b.http_address, "in_sync")
    assert _replica(cluster.c) is None
    _open(browser, cluster, f"/topics/{TOPIC}")
    heads = [e.get_attribute("textContent") for e in browser.find_elements(By.CSS_SELECTOR, "#nodes thead th")]
    assert "Replica" in heads, heads
    row = f'#nodes tr[data-node="{cluster.a.http_address}"] td[data-field="replica"]'
    text = _text(browser, row)
    assert text.startswith(f"{cluster.b.http_address} · in sync"), text
    assert "lag " in text
    peer = browser.find_element(By.CSS_SELECTOR, f"{row} [data-field=replica_peer] a")
    assert peer.get_attribute("href").endswith(f"/nodes/{cluster.b.http_address.replace(':', '%3A')}")
    assert _text(browser, f'#nodes tr[data-node="{cluster.c.http_address}"] td[data-field="replica"]') == ""
    assert _text(browser, '#nodes tr[data-total] td[data-field="replica"]') == "all in sync"
    browser.save_screenshot(str(ARTIFACTS / "replica-topic.png"))


def test_node_page_lists_standbys(browser: Any, cluster: Cluster) -> None:
    """B's page: the standby it holds for A's topic with its unfinished messages, and its counters;
    A's: its topic's replica; C's (no replication): no replication section. (B has the topic too,
    made there for A's copies so that lookupd lists B, and A a standby of B's, empty: not checked.)"""
    _open(browser, cluster, f"/nodes/{cluster.b.http_address}")
    (standby,) = [s for s in _standbys(cluster.b) if s["topic"] == TOPIC]
    row = f'#standbys tr[data-standby="{cluster.a.http_address}/{TOPIC}"]'
    assert _text(browser, f'{row} td[data-field="owner"]') == cluster.a.http_address
    assert _text(browser, f'{row} td[data-field="topic"]') == TOPIC
    assert int(_text(browser, f'{row} td[data-field="messages"]')) == standby["messages"] == MESSAGES
    assert int(_text(browser, f'{row} td[data-field="bytes"]').replace(",", "")) == standby["bytes"] > 0
    assert _text(browser, f'{row} td[data-field="taken_over"]') == "no"
    for field in ("replica_refused", "unreplicated", "takeovers"):
        assert _text(browser, f'#replication [data-field="{field}"]') == "0", field
    browser.save_screenshot(str(ARTIFACTS / "replica-node.png"))

    _open(browser, cluster, f"/nodes/{cluster.a.http_address}")
    assert _text(browser, f'#node-topics tbody[data-topic="{TOPIC}"] [data-field="replica"]').startswith(
        f"replica {cluster.b.http_address} · in sync")

    _open(browser, cluster, f"/nodes/{cluster.c.http_address}")
    assert browser.find_elements(By.CSS_SELECTOR, f'#node-topics tbody[data-topic="{TOPIC}"]')
    assert not browser.find_elements(By.CSS_SELECTOR, "#replication, #standbys, [data-field=replica]")


def test_a_lost_replica_shows_under_replicated_in_red(browser: Any, cluster: Cluster) -> None:
    """B killed: A's topic is no longer in sync, and its row says ``under-replicated`` in red."""
    cluster.b.kill()
    wait_until(lambda: (_replica(cluster.a) or {}).get("state") != "in_sync", what="A's replica lost")

    def shown() -> bool:
        _open(browser, cluster, f"/topics/{TOPIC}")
        return "under-replicated" in _text(
            browser, f'#nodes tr[data-node="{cluster.a.http_address}"] td[data-field="replica"]')

    wait_until(shown, what="under-replicated on the topic page")
    state = browser.find_element(
        By.CSS_SELECTOR, f'#nodes tr[data-node="{cluster.a.http_address}"] [data-field="replica_state"]')
    assert state.value_of_css_property("color") == "rgba(155, 28, 28, 1)"
    assert "under-replicated" in _text(browser, '#nodes tr[data-total] td[data-field="replica"]')
    browser.save_screenshot(str(ARTIFACTS / "replica-lost.png"))
