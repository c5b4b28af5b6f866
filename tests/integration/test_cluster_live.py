"""A real cluster on loopback: nsqtw-lookupd and two nsqtw nodes, driven by pynsq and HTTP."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from tests import helpers
from tests.daemon import Daemon
from tests.integration.pynsq_driver import consume, publish

DEADLINE = 30.0


def http(address: str, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://{address}{path}", data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def get(address: str, path: str) -> Any:
    code, body = http(address, "GET", path)
    return json.loads(body) if code == 200 else {"status": code, **json.loads(body)}


def post(address: str, path: str) -> None:
    code, body = http(address, "POST", path)
    assert code == 200, (path, code, body)


def wait_for(what: str, check: Callable[[], Any], timeout: float = DEADLINE) -> Any:
    return helpers.wait_for(check, timeout, what)


def ports(lookup: dict[str, Any]) -> set[tuple[int, int]]:
    return {(p["tcp_port"], p["http_port"]) for p in lookup.get("producers", [])}


def node_ports(*nodes: Daemon) -> set[tuple[int, int]]:
    return {(n.tcp[1], n.http[1]) for n in nodes}


def debug_producers(lookupd: Daemon, key: str) -> set[int]:
    """http ports of the producers /debug shows under ``category:key:subkey``."""
    return {p["http_port"] for p in get(lookupd.http_address, "/debug").get(key, [])}


@pytest.fixture
def cluster(daemon_factory, lookupd_factory) -> tuple[Daemon, Daemon, Daemon]:
    lookupd = lookupd_factory("--broadcast-address=127.0.0.1")
    nodes = [daemon_factory("--broadcast-address=127.0.0.1",
                            f"--lookupd-tcp-address={lookupd.tcp_address}") for _ in range(2)]
    for n in nodes:
        post(n.http_address, "/topic/create?topic=t")
        post(n.http_address, "/channel/create?topic=t&channel=c")
    wait_for("both nodes in /lookup",
             lambda: ports(get(lookupd.http_address, "/lookup?topic=t")) == node_ports(*nodes))
    return lookupd, nodes[0], nodes[1]


def test_lookup_lists_both_nodes(cluster) -> None:
    """/lookup, /nodes and /topics list both nodes with the ports they listen on."""
    lookupd, a, b = cluster
    got = get(lookupd.http_address, "/lookup?topic=t")
    assert got["channels"] == ["c"]
    assert {p["broadcast_address"] for p in got["producers"]} == {"127.0.0.1"}
    assert ports(got) == node_ports(a, b)
    assert {p["version"] for p in got["producers"]} == {"1.3.0"}
    nodes = get(lookupd.http_address, "/nodes")["producers"]
    assert {(n["tcp_port"], n["http_port"]) for n in nodes} == node_ports(a, b)
    assert all(n["topics"] == ["t"] and n["tombstones"] == [False] for n in nodes)
    assert get(lookupd.http_address, "/topics") == {"topics": ["t"]}
    # each node logged the lookupd's IDENTIFY answer the way nsqd does
    a.wait_output(re.escape(f"LOOKUPD({lookupd.tcp_address}): peer info {{TCPPort:{lookupd.tcp[1]} "))


def test_reader_finds_both_nodes_through_lookupd(cluster) -> None:
    """A pynsq Reader given only lookupd's HTTP address gets the messages published to each node."""
    lookupd, a, b = cluster
    assert publish(a.tcp_address, "t", [b"a%d" % i for i in range(10)], mpub=True) == [b"OK"]
    assert publish(b.tcp_address, "t", [b"b%d" % i for i in range(10)], mpub=True) == [b"OK"]
    got = consume(None, "t", "c", 20, timeout=DEADLINE, max_in_flight=10,
                  lookupd_http_addresses=[f"http://{lookupd.http_address}"],
                  lookupd_poll_interval=1)
    assert sorted(m.body for m in got) == sorted([b"a%d" % i for i in range(10)]
                                                 + [b"b%d" % i for i in range(10)])


def test_unregister_on_delete(cluster) -> None:
    """Deleting a channel or topic on a node unregisters that node (ephemeral channels vanish)."""
    lookupd, a, b = cluster
    la = lookupd.http_address
    post(a.http_address, "/channel/create?topic=t&channel=only_a")
    wait_for("only_a registered", lambda: debug_producers(lookupd, "channel:t:only_a") == {a.http[1]})
    post(a.http_address, "/channel/delete?topic=t&channel=only_a")
    wait_for("only_a unregistered", lambda: not debug_producers(lookupd, "channel:t:only_a"))
    # a durable channel stays known to lookupd (as with Go nsqlookupd); an ephemeral one goes
    assert "only_a" in get(la, "/channels?topic=t")["channels"]
    post(a.http_address, "/channel/create?topic=t&channel=e%23ephemeral")
    wait_for("ephemeral registered", lambda: "e#ephemeral" in get(la, "/channels?topic=t")["channels"])
    post(a.http_address, "/channel/delete?topic=t&channel=e%23ephemeral")
    wait_for("ephemeral gone", lambda: "e#ephemeral" not in get(la, "/channels?topic=t")["channels"])
    post(b.http_address, "/topic/delete?topic=t")
    wait_for("b gone from t", lambda: ports(get(la, "/lookup?topic=t")) == node_ports(a))
    assert b.http[1] not in debug_producers(lookupd, "channel:t:c")


def test_killed_node_drops_out(cluster) -> None:
    """A node killed with SIGKILL leaves /lookup and /nodes as soon as its connection closes."""
    lookupd, a, b = cluster
    b.kill()
    wait_for("b gone", lambda: ports(get(lookupd.http_address, "/lookup?topic=t")) == node_ports(a))
    assert len(get(lookupd.http_address, "/nodes")["producers"]) == 1


def test_tombstone_hides_node(cluster) -> None:
    """/topic/tombstone hides one node from /lookup of that topic; /nodes marks it."""
    lookupd, a, b = cluster
    post(lookupd.http_address, f"/topic/tombstone?topic=t&node=127.0.0.1:{b.http[1]}")
    assert ports(get(lookupd.http_address, "/lookup?topic=t")) == node_ports(a)
    nodes = {n["http_port"]: n for n in get(lookupd.http_address, "/nodes")["producers"]}
    assert nodes[b.http[1]]["tombstones"] == [True]
    assert nodes[a.http[1]]["tombstones"] == [False]


def test_lookupd_restart_reregisters_everything(cluster, lookupd_factory) -> None:
    """After lookupd restarts on the same ports, both nodes reconnect and register it all again."""
    lookupd, a, b = cluster
    post(a.http_address, "/topic/create?topic=second")
    wait_for("second registered", lambda: "second" in get(lookupd.http_address, "/topics")["topics"])
    lookupd.kill()
    lookupd.start(tcp=lookupd.tcp_address, http=lookupd.http_address)
    wait_for("both re-registered",
             lambda: ports(get(lookupd.http_address, "/lookup?topic=t")) == node_ports(a, b))
    assert get(lookupd.http_address, "/lookup?topic=t")["channels"] == ["c"]
    assert ports(get(lookupd.http_address, "/lookup?topic=second")) == node_ports(a)


def test_runtime_lookupd_address_change(cluster, lookupd_factory) -> None:
    """PUT /config/nsqlookupd_tcp_addresses moves a node to another lookupd at run time."""
    old, a, b = cluster
    new = lookupd_factory("--broadcast-address=127.0.0.1")
    code, body = http(a.http_address, "PUT", "/config/nsqlookupd_tcp_addresses",
                      json.dumps([new.tcp_address]).encode())
    assert (code, json.loads(body)) == (200, [new.tcp_address])
    wait_for("a on the new lookupd",
             lambda: ports(get(new.http_address, "/lookup?topic=t")) == node_ports(a))
    wait_for("a off the old lookupd",
             lambda: ports(get(old.http_address, "/lookup?topic=t")) == node_ports(b))
