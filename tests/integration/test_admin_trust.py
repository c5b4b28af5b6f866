"""nsqtw-admin over registrations nobody vouches for: odd addresses are one node's warning, never a 500.

nsqlookupd takes any ``broadcast_address`` a peer IDENTIFYs with, so raw V1
clients here register fake nodes for the topic with every kind of odd
address (underscores, IPv6 literals with and without a zone, a trailing
colon, unresolvable, very long and non-ASCII names, characters no URL host
may hold, ports out of range), and one that answers ``/stats`` with numbers
no node can hold (``1e999``, ``NaN``), next to real, healthy nsqtw nodes (one
over IPv4 and, where the machine has IPv6 loopback, one registered as ``::1``).
Every API route must answer 200 with the healthy nodes' data and a warning
naming each odd node, and an action must reach the healthy nodes and say per
node what happened. Run against nsqtw-lookupd and against Go nsqlookupd
v1.3.0 (skipped where neither $NSQTW_GO_BIN nor ../shared/anchor/bin has them), where Go nsqadmin is
asked the same and must answer 200 too.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote

import pytest

from tests.admin_reference import free_port, get_json, http, wait_for
from tests.daemon import ROOT, AdminDaemon, Daemon, LookupdDaemon, Started
from tests.rawclient import pub, register_with_lookupd

#: Go NSQ v1.3.0's programs: $NSQTW_GO_BIN, or ../shared/anchor/bin beside the checkout (or its folder)
GO_BIN = next((d for d in (os.environ.get("NSQTW_GO_BIN", ""), os.path.join(ROOT, "..", "shared", "anchor", "bin"),
                           os.path.join(ROOT, "..", "..", "shared", "anchor", "bin"))
               if d and os.access(os.path.join(d, "nsqlookupd"), os.X_OK)), None)

TOPIC, CHANNEL = "orders", "billing"
_J = {"Content-Type": "application/json"}


def _fake(address: str, tcp_port: int, http_port: int) -> dict[str, Any]:
    return {"broadcast_address": address, "hostname": f"fake-{tcp_port}", "tcp_port": tcp_port,
            "http_port": http_port, "version": "1.3.0"}


#: (what it is, IDENTIFY of the fake node, the text its warning must hold)
ODD = [
    ("underscore", _fake("NSQ-Host-01_prod", 7001, 7101), "NSQ-Host-01_prod"),
    ("underscore, lower case", _fake("my_host", 7002, 7102), "my_host"),
    ("IPv6 loopback, nothing there", _fake("::1", 7003, free_port()), "[::1]"),
    ("IPv6 with a zone", _fake("fe80::1%eth0", 7004, 7104), "[fe80::1%eth0]"),
    ("trailing colon", _fake("nsq-1.example:", 7005, 7105), "nsq-1.example:"),
    ("unresolvable", _fake("nsq-9.invalid", 7006, 7106), "nsq-9.invalid"),
    ("very long name", _fake("n" * 300 + ".invalid", 7007, 7107), "n" * 300),
    ("non-ASCII name", _fake("ünïcode.invalid", 7008, 7108), "ünïcode.invalid"),
    ("not a host", _fake("bad host/x?y#z", 7009, 7109), "bad host/x?y#z"),
    ("port out of range", _fake("127.0.0.1", 7010, 70000), "127.0.0.1:70000"),
    ("negative port", _fake("127.0.0.2", 7011, -1), "127.0.0.2:-1"),
]


class _NonFiniteNode(BaseHTTPRequestHandler):
    """A node whose answers hold numbers past float64 and NaN; it hangs up on actions."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body = (b'{"version":"1.3.0","broadcast_address":"127.0.0.1","hostname":"nan","http_port":1,'
                b'"topics":[{"topic_name":"orders","depth":1e999,"message_count":NaN,"channels":[]}]}')
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802 - hangs up without an answer
        self.close_connection = True

    def log_message(self, *args: Any) -> None:
        return None


@dataclass
class Cluster:
    lookupd_http: str
    healthy: list[Daemon]
    admin: str
    go_admin: str | None
    odd: list[tuple[str, dict[str, Any], str]]

    @staticmethod
    def node_address(node: Daemon) -> str:
        """How the node is named in the admin's answers (its broadcast address and HTTP port)."""
        return f"[::1]:{node.http[1]}" if node.http[0] in ("::1", "[::1]") else node.http_address

    def healthy_names(self) -> set[str]:
        return {self.node_address(n) for n in self.healthy}


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.fixture(scope="module", params=["nsqtw", "go"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A lookupd (nsqtw's or Go's), healthy nsqtw nodes, nsqtw-admin (and Go nsqadmin) and the odd peers."""
    if request.param == "go" and GO_BIN is None:
        pytest.skip("Go nsqlookupd/nsqadmin v1.3.0 (../shared/anchor/bin) are not on this machine")
    started = Started(str(tmp_path_factory.mktemp(f"admin-trust-{request.param}")))
    start, folder = started.start, started.folder
    procs: list[subprocess.Popen[bytes]] = []
    socks: list[socket.socket] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NonFiniteNode)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    odd = [*ODD, ("non-finite numbers", _fake("127.0.0.1", 7012, port), f"127.0.0.1:{port}")]

    def go(name: str, *args: str) -> None:
        procs.append(subprocess.Popen([os.path.join(GO_BIN or "", name), *args], cwd=started.root,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    try:
        if request.param == "go":
            lt, lh = free_port(), free_port()
            go("nsqlookupd", f"--tcp-address=127.0.0.1:{lt}", f"--http-address=127.0.0.1:{lh}",
               "--broadcast-address=127.0.0.1")
            lookupd_tcp, lookupd_http = f"127.0.0.1:{lt}", f"127.0.0.1:{lh}"
            wait_for(lambda: http("GET", f"http://{lookupd_http}/ping")[0] == 200, what="Go nsqlookupd")
        else:
            lookupd = start(LookupdDaemon(folder("lookupd"), "--broadcast-address=127.0.0.1"))
            lookupd_tcp, lookupd_http = lookupd.tcp_address, lookupd.http_address
        healthy = [start(Daemon(folder("a"), f"--lookupd-tcp-address={lookupd_tcp}",
                                "--broadcast-address=127.0.0.1"))]
        if _ipv6_loopback():
            healthy.append(start(Daemon(folder("six"), f"--lookupd-tcp-address={lookupd_tcp}",
                                        "--broadcast-address=::1"), http="[::1]:0"))
        for node in healthy:
            http("POST", f"http://{node.http_address}/topic/create?topic={TOPIC}")
            http("POST", f"http://{node.http_address}/channel/create?topic={TOPIC}&channel={CHANNEL}")
        admin = start(AdminDaemon(folder("admin"), f"--lookupd-http-address={lookupd_http}",
                                  "--http-client-request-timeout=3s", "--history-interval=1s"))
        go_admin = None
        if request.param == "go":
            ah = free_port()
            go("nsqadmin", f"--http-address=127.0.0.1:{ah}", f"--lookupd-http-address={lookupd_http}",
               "--http-client-request-timeout=3s")
            go_admin = f"127.0.0.1:{ah}"
            wait_for(lambda: http("GET", f"http://{go_admin}/ping")[0] == 200, what="Go nsqadmin")
        for _, info, _ in odd:
            socks.append(register_with_lookupd(lookupd_tcp, info, TOPIC, CHANNEL))
        want = len(healthy) + len(odd)
        wait_for(lambda: len(get_json(f"http://{lookupd_http}/lookup?topic={TOPIC}")["producers"]) == want,
                 what="every registration")
        yield Cluster(lookupd_http, healthy, admin.http_address, go_admin, odd)
    finally:
        server.shutdown()
        for s in socks:
            s.close()
        started.stop_all()
        for p in procs:
            p.terminate()
            p.wait(10)


def _get(admin: str, path: str) -> tuple[int, Any]:
    status, _, body = http("GET", f"http://{admin}{path}")
    return status, json.loads(body)


def _assert_warns_of_every_odd_node(answer: dict[str, Any], cluster: Cluster) -> None:
    message = answer["message"]
    assert message.startswith("WARNING: "), message
    for what, _, text in cluster.odd:
        assert text in message, what


def _paused(node: Daemon, channel: str = "") -> bool:
    stats = get_json(f"http://{node.http_address}/stats?format=json&topic={TOPIC}")
    topic = stats["topics"][0]
    if not channel:
        return bool(topic["paused"])
    return bool(next(c for c in topic["channels"] if c["channel_name"] == channel)["paused"])


def test_every_read_route_answers_with_the_healthy_nodes_and_a_warning(cluster: Cluster) -> None:
    """Topic, channel and counter answer 200 with every healthy node's numbers and each odd node named."""
    pub(cluster.healthy[0].tcp_address, TOPIC, b"one", b"two")
    status, topic = _get(cluster.admin, f"/api/topics/{TOPIC}")
    assert status == 200, topic
    assert {n["node"] for n in topic["nodes"]} == cluster.healthy_names()
    assert topic["message_count"] >= 2
    _assert_warns_of_every_odd_node(topic, cluster)
    status, channel = _get(cluster.admin, f"/api/topics/{TOPIC}/{CHANNEL}")
    assert status == 200, channel
    assert {n["node"] for n in channel["nodes"]} == cluster.healthy_names()
    _assert_warns_of_every_odd_node(channel, cluster)
    status, counter = _get(cluster.admin, "/api/counter")
    assert status == 200, counter
    assert {v["node"] for v in counter["stats"].values()} == cluster.healthy_names()
    _assert_warns_of_every_odd_node(counter, cluster)


def test_lists_and_one_node_answer_200(cluster: Cluster) -> None:
    """/api/topics, /api/nodes (odd nodes listed as data) and a healthy node's page answer 200."""
    status, topics = _get(cluster.admin, "/api/topics")
    assert (status, topics["topics"]) == (200, [TOPIC])
    assert _get(cluster.admin, "/api/topics?inactive=true")[0] == 200
    status, nodes = _get(cluster.admin, "/api/nodes")
    assert status == 200
    listed = {n["broadcast_address"] for n in nodes["nodes"]}
    assert {info["broadcast_address"] for _, info, _ in cluster.odd} <= listed
    for node in cluster.healthy:
        name = cluster.node_address(node)
        status, answer = _get(cluster.admin, f"/api/nodes/{quote(name)}")
        assert status == 200, answer
        assert answer["node"] == name and answer["topics"][0]["topic_name"] == TOPIC


def test_history_keeps_polling_the_healthy_nodes(cluster: Cluster) -> None:
    """The charts' poll gets the healthy nodes' numbers every second despite the odd nodes."""
    pub(cluster.healthy[0].tcp_address, TOPIC, b"charted")
    points = wait_for(lambda: [p for p in _get(cluster.admin, f"/api/history?topic={TOPIC}")[1]["points"]
                               if p.get("messages")], what="history points")
    assert points[-1]["messages"] >= 1
    status, history = _get(cluster.admin, "/api/history")
    assert (status, history["error"]) == (200, "")


def test_one_odd_node_alone_is_an_upstream_error_not_a_crash(cluster: Cluster) -> None:
    """Asking for an odd node's own page is 502 UPSTREAM_ERROR naming it (as Go nsqadmin), never a 500."""
    status, answer = _get(cluster.admin, f"/api/nodes/{quote('my_host:7102')}")
    assert status == 502, answer
    assert answer["message"].startswith("UPSTREAM_ERROR: ") and "my_host" in answer["message"]


def _results(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["node"]: r for r in answer["results"]}


def test_pause_reaches_the_healthy_nodes_and_says_so_per_node(cluster: Cluster) -> None:
    """Pause and unpause of the topic: done on every healthy node, each odd node's failure reported."""
    for action, want in (("pause", True), ("unpause", False)):
        status, _, body = http("POST", f"http://{cluster.admin}/api/topics/{TOPIC}",
                               json.dumps({"action": action}).encode(), _J)
        answer = json.loads(body)
        assert status == 200, answer
        _assert_warns_of_every_odd_node(answer, cluster)
        results = _results(answer)
        for node in cluster.healthy:
            assert results[cluster.node_address(node)] == {
                "node": cluster.node_address(node), "request": f"topic/{action}", "ok": True, "error": ""}
            assert _paused(node) is want
        failed = [r for r in answer["results"] if not r["ok"]]
        assert len(failed) == len(cluster.odd) and all(r["error"] for r in failed)


def test_empty_channel_reaches_the_healthy_nodes(cluster: Cluster) -> None:
    """Emptying the channel drops the healthy nodes' messages while the odd nodes are reported."""
    for node in cluster.healthy:
        pub(node.tcp_address, TOPIC, b"x", b"y")
    wait_for(lambda: all(get_json(f"http://{n.http_address}/stats?format=json&topic={TOPIC}")["topics"][0]
                         ["channels"][0]["depth"] > 0 for n in cluster.healthy), what="messages")
    status, _, body = http("POST", f"http://{cluster.admin}/api/topics/{TOPIC}/{CHANNEL}",
                           b'{"action":"empty"}', _J)
    answer = json.loads(body)
    assert status == 200, answer
    _assert_warns_of_every_odd_node(answer, cluster)
    for node in cluster.healthy:
        assert _results(answer)[cluster.node_address(node)]["ok"] is True
        channel = get_json(f"http://{node.http_address}/stats?format=json&topic={TOPIC}")["topics"][0][
            "channels"][0]
        assert channel["depth"] == 0


def test_tombstone_of_an_odd_node_reports_each_step(cluster: Cluster) -> None:
    """Tombstoning an odd node (even one named without a port): the tombstone stands, the node's failure is told."""
    for node in ("my_host:7102", "NSQ-Host-01_prod"):
        status, _, body = http("DELETE", f"http://{cluster.admin}/api/nodes/{quote(node)}",
                               json.dumps({"topic": TOPIC}).encode(), _J)
        answer = json.loads(body)
        assert status == 200, answer
        results = answer["results"]
        assert results[0] == {"node": cluster.lookupd_http, "request": "topic/tombstone", "ok": True,
                              "error": ""}
        assert (results[1]["node"], results[1]["request"], results[1]["ok"]) == (node, "info", False)
        assert node.split(":")[0] in answer["message"]


def test_go_nsqadmin_answers_200_too(cluster: Cluster) -> None:
    """Side by side: Go nsqadmin v1.3.0 answers the same routes with 200 and warnings; its tombstone is a 502."""
    if cluster.go_admin is None:
        pytest.skip("Go nsqadmin runs beside the Go lookupd only")
    for path in (f"/api/topics/{TOPIC}", f"/api/topics/{TOPIC}/{CHANNEL}", "/api/counter", "/api/nodes"):
        ours, go = _get(cluster.admin, path), _get(cluster.go_admin, path)
        assert (ours[0], go[0]) == (200, 200), path
        assert bool(ours[1]["message"]) == bool(go[1]["message"]), path
    # Go tombstones the node on the lookupd, then answers 502 because the node cannot be asked
    status, _, body = http("DELETE", f"http://{cluster.go_admin}/api/nodes/{quote('NSQ-Host-01_prod:7101')}",
                           json.dumps({"topic": TOPIC}).encode(), _J)
    assert status == 502 and b"UPSTREAM_ERROR" in body, body
