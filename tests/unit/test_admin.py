"""nsqtw-admin's socket-free parts: flags, nsqadmin's JSON shapes and sums, the history window."""

from __future__ import annotations

import os
import tempfile

from twisted.internet.defer import ensureDeferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nsqtw._go.flags import OptionsError
from nsqtw.admin.aggregate import (
    counter_stats,
    node_replication,
    node_topic_entry,
    sum_channel,
    sum_topic,
)
from nsqtw.admin.cluster import ClusterInfo
from nsqtw.admin.history import MAX_SERIES, History
from nsqtw.admin.options import defaults, normalize_base_path, parse_args
from nsqtw.admin.routes import decode_struct, match_route


class OptionsTests(SynchronousTestCase):
    def test_defaults_are_nsqadmins(self) -> None:
        """The defaults nsqadmin v1.3.0's -help lists."""
        d = defaults()
        self.assertEqual((d.http_address, d.statsd_interval, d.http_client_connect_timeout,
                          d.http_client_request_timeout, d.allow_config_from_cidr, d.acl_http_header,
                          d.base_path, d.log_prefix, d.statsd_prefix),
                         ("0.0.0.0:4171", 60.0, 2.0, 5.0, "127.0.0.1/8", "X-Forwarded-User", "/",
                          "[nsqadmin] ", "nsq.%s"))

    def test_repeatable_flags_and_go_syntax(self) -> None:
        """-flag value, --flag=value and repeats of --lookupd-http-address and --admin-user."""
        opts = parse_args(["-lookupd-http-address", "a:1", "--lookupd-http-address=b:2",
                           "--admin-user=x", "-admin-user", "y", "--statsd-interval=10s"])
        self.assertEqual(opts.lookupd_http_address, ("a:1", "b:2"))
        self.assertEqual(opts.admin_user, ("x", "y"))
        self.assertEqual(opts.statsd_interval, 10.0)

    def test_config_file_uses_nsqadmins_keys(self) -> None:
        """The TOML keys are nsqadmin's cfg names (nsqlookupd_http_addresses, admin_users); flags win."""
        with tempfile.NamedTemporaryFile("w", suffix=".cfg", delete=False) as f:
            f.write('nsqlookupd_http_addresses = ["l:4161"]\nadmin_users = ["ann"]\n'
                    'http_address = "127.0.0.1:9"\nbase_path = "/x"\n')
        self.addCleanup(os.unlink, f.name)
        opts = parse_args([f"--config={f.name}", "--http-address=127.0.0.1:8"])
        self.assertEqual((opts.lookupd_http_address, opts.admin_user, opts.http_address, opts.base_path),
                         (("l:4161",), ("ann",), "127.0.0.1:8", "/x"))

    def test_start_up_checks(self) -> None:
        """nsqadmin's New() refuses no addresses, both kinds, and a cert without its key."""
        for argv, text in (([], "required"),
                           (["--lookupd-http-address=a:1", "--nsqd-http-address=b:1"], "not both"),
                           (["--nsqd-http-address=b:1", "--http-client-tls-key=k"], "--http-client-tls-cert"),
                           (["--nsqd-http-address=b:1", "--graphite-url=nourl"], "--graphite-url")):
            with self.assertRaises(OptionsError) as e:
                parse_args(argv)
            self.assertIn(text, str(e.exception))

    def test_base_path(self) -> None:
        """Base paths are rooted and have no trailing slash, as nsqadmin's path.Join makes them."""
        self.assertEqual([normalize_base_path(p) for p in ("/", "", "adm", "/adm/", "a//b/")],
                         ["/", "/", "/adm", "/adm", "/a/b"])


def _node(node: str, host: str, topic: dict[str, object]) -> dict[str, object]:
    return node_topic_entry(node, host, topic, now=1000.0)


def _raw_topic(depth: int, channels: list[dict[str, object]], **extra: object) -> dict[str, object]:
    return {"topic_name": "t", "depth": depth, "backend_depth": 1, "message_count": depth * 2,
            "channels": channels, "paused": False, "e2e_processing_latency": {"count": 0, "percentiles": None},
            **extra}


def _raw_channel(name: str, depth: int, clients: int = 0, **extra: object) -> dict[str, object]:
    return {"channel_name": name, "depth": depth, "backend_depth": 0, "in_flight_count": 1,
            "deferred_count": 0, "message_count": depth, "requeue_count": 0, "timeout_count": 0,
            "client_count": clients, "paused": False,
            "clients": [{"client_id": f"c{i}", "hostname": f"h{i}", "remote_address": f"1.1.1.1:{i}",
                         "connect_ts": 990, "user_agent": "ua"} for i in range(clients)],
            "e2e_processing_latency": {"count": 0, "percentiles": None}, **extra}


class AggregateTests(SynchronousTestCase):
    def test_per_node_entries_have_nsqadmins_fields(self) -> None:
        """A node's topic: memory depth is depth minus backend; clients get node and connected (ns)."""
        entry = _node("n:1", "h", _raw_topic(5, [_raw_channel("c", 3, clients=1)]))
        self.assertEqual(list(entry), ["node", "hostname", "topic_name", "depth", "memory_depth",
                                       "backend_depth", "message_count", "nodes", "channels", "paused",
                                       "e2e_processing_latency"])
        self.assertEqual(entry["memory_depth"], 4)
        client = entry["channels"][0]["clients"][0]  # type: ignore[index]
        self.assertEqual((client["node"], client["connected"]), ("n:1", 10 * 10**9))

    def test_topic_sums_and_channel_totals(self) -> None:
        """Sums over nodes; a channel on two nodes is a '*' total listing both, on one node that node's entry."""
        a = _node("a:1", "h", _raw_topic(2, [_raw_channel("both", 3)]))
        b = _node("b:1", "h", _raw_topic(4, [_raw_channel("both", 5), _raw_channel("only", 7)]))
        total = sum_topic("t", [b, a])
        self.assertEqual((total["node"], total["depth"], total["message_count"]), ("*", 6, 12))
        self.assertEqual([n["node"] for n in total["nodes"]], ["a:1", "b:1"])
        both, only = total["channels"]
        self.assertEqual((both["node"], both["depth"], [n["node"] for n in both["nodes"]]),
                         ("*", 8, ["a:1", "b:1"]))
        self.assertIsNone(both["clients"])
        self.assertIs(only, b["channels"][1])  # type: ignore[index]
        # the per-node entries keep their own numbers
        self.assertEqual(a["channels"][0]["depth"], 3)  # type: ignore[index]

    def test_channel_total_gathers_clients(self) -> None:
        """The channel answer lists every node's clients, sorted by hostname, and sums client counts."""
        a = _node("a:1", "h", _raw_topic(0, [_raw_channel("c", 1, clients=2)]))["channels"][0]  # type: ignore[index]
        b = _node("b:1", "h", _raw_topic(0, [_raw_channel("c", 1, clients=1)]))["channels"][0]  # type: ignore[index]
        total = sum_channel("t", "c", [a, b])
        self.assertEqual(total["client_count"], 3)
        self.assertEqual([c["hostname"] for c in total["clients"]], ["h0", "h0", "h1"])

    def test_latency_percentiles_merge_as_nsqadmin(self) -> None:
        """Percentiles by quantile: counts summed, averages weighted, keys sorted (Go's map order)."""
        def topic(count: int, value: float) -> dict[str, object]:
            return _raw_topic(0, [], e2e_processing_latency={
                "count": count, "percentiles": [{"quantile": 0.99, "value": value}]})

        total = sum_topic("t", [_node("a:1", "h", topic(1, 100.0)), _node("b:1", "h", topic(3, 200.0))])
        (p,) = total["e2e_processing_latency"]["percentiles"]
        self.assertEqual(list(p), ["average", "count", "max", "min", "quantile"])
        self.assertEqual((p["count"], p["max"], p["average"]), (4.0, 200.0, 175.0))

    def test_counter_keys(self) -> None:
        """/api/counter: topic:channel:node keys, sorted."""
        entries = [_node("b:1", "h", _raw_topic(0, [_raw_channel("z", 2)])),
                   _node("a:1", "h", _raw_topic(0, [_raw_channel("z", 3)]))]
        stats = counter_stats(entries)
        self.assertEqual(list(stats), ["t:z:a:1", "t:z:b:1"])
        self.assertEqual(stats["t:z:a:1"]["message_count"], 3)


class ReplicationTests(SynchronousTestCase):
    """--replicas=2 nodes' additions to /stats become new keys, only where a node reports them."""

    def test_topic_entry_keeps_gos_keys_without_replica(self) -> None:
        """A node without replication (Go nsqd, --replicas=1): no new key, in the topic answer neither."""
        entry = _node("a:1", "h", _raw_topic(2, []))
        self.assertNotIn("replica", entry)
        self.assertNotIn("replica", sum_topic("t", [entry])["nodes"][0])

    def test_topic_entry_carries_the_replica(self) -> None:
        """The topic's replica comes after Go's keys, on the node's entry and in the topic answer's nodes."""
        replica = {"peer": "127.0.0.1:4351", "state": "in_sync", "unacked": 2, "lag_ms": 15}
        a = _node("a:1", "h", _raw_topic(2, [], replica=replica))
        b = _node("b:1", "h", _raw_topic(2, []))
        self.assertEqual(list(a)[-1], "replica")
        self.assertEqual(a["replica"], replica)
        total = sum_topic("t", [b, a])
        self.assertEqual([n.get("replica") for n in total["nodes"]], [replica, None])
        self.assertNotIn("replica", total)
        self.assertEqual(_node("a:1", "h", _raw_topic(2, [], replica={
            "peer": None, "state": "none", "unacked": 0, "lag_ms": 0}))["replica"]["peer"], None)  # type: ignore[index]

    def test_every_state_a_node_reports_is_kept(self) -> None:
        """Each replica state nsqtw's /stats gives is the admin's too (catching_up: a new replica is
        being sent the topic's unfinished messages), not read as 'none'."""
        for state in ("in_sync", "catching_up", "connecting", "none"):
            entry = _node("a:1", "h", _raw_topic(0, [], replica={
                "peer": "127.0.0.1:4351", "state": state, "unacked": 0, "lag_ms": 0}))
            self.assertEqual(entry["replica"]["state"], state)  # type: ignore[index]

    def test_odd_replica_values_read_as_zero_values(self) -> None:
        """A node's data is not trusted: unknown states read 'none', non-numbers 0, a non-string peer None."""
        entry = _node("a:1", "h", _raw_topic(0, [], replica={
            "peer": ["<b>"], "state": "<script>", "unacked": "9", "lag_ms": True}))
        self.assertEqual(entry["replica"], {"peer": None, "state": "none", "unacked": 0, "lag_ms": 0})
        self.assertNotIn("replica", _node("a:1", "h", _raw_topic(0, [], replica="in_sync")))

    def test_node_replication(self) -> None:
        """The node's counters and standbys (sorted by owner and topic); None without any of them."""
        raw = {"version": "1.3.0", "topics": [], "replica_refused": 1, "unreplicated": 2, "takeovers": 3,
               "standby": [{"owner": "b:1", "topic": "t", "messages": 4, "bytes": 40, "disk_bytes": 64,
                            "taken_over": False},
                           {"owner": "a:1", "topic": "u", "messages": "x", "taken_over": 1}, "junk"]}
        self.assertEqual(node_replication(raw), {
            "replica_refused": 1, "unreplicated": 2, "takeovers": 3,
            "standby": [{"owner": "a:1", "topic": "u", "messages": 0, "bytes": 0, "disk_bytes": 0,
                         "taken_over": False},
                        {"owner": "b:1", "topic": "t", "messages": 4, "bytes": 40, "disk_bytes": 64,
                         "taken_over": False}]})
        self.assertEqual(node_replication({"takeovers": 0}),
                         {"replica_refused": 0, "unreplicated": 0, "takeovers": 0, "standby": []})
        self.assertIsNone(node_replication({"version": "1.3.0", "topics": [], "health": "OK"}))
        self.assertIsNone(node_replication(None))

    def test_nsqd_stats_collects_replicating_nodes_only(self) -> None:
        """ClusterInfo.nsqd_stats hands each replicating node's own replication back by its address."""
        class Client:
            async def get_json(self, url: str, headers: object = None) -> object:
                return answers[url]

        replica = {"peer": "127.0.0.1:2", "state": "connecting", "unacked": 1, "lag_ms": 5}
        answers = {
            "http://127.0.0.1:1/stats?format=json": {"topics": [_raw_topic(1, [], replica=replica)],
                                                     "replica_refused": 0, "unreplicated": 0,
                                                     "takeovers": 0, "standby": []},
            "http://127.0.0.1:2/stats?format=json": {"topics": [_raw_topic(1, [])]}}
        producers = [{"broadcast_address": "127.0.0.1", "http_port": port, "hostname": "h"} for port in (1, 2)]
        cluster = ClusterInfo(Client(), Clock())  # type: ignore[arg-type]
        replication: dict[str, dict[str, object]] = {}
        entries, errors = self.successResultOf(ensureDeferred(
            cluster.nsqd_stats(producers, replication=replication)))
        self.assertEqual(errors, [])
        self.assertEqual(list(replication), ["127.0.0.1:1"])
        self.assertEqual([e.get("replica") for e in entries], [replica, None])


class HistoryTests(SynchronousTestCase):
    def _history(self, interval: float = 1.0, window: float = 3.0) -> tuple[History, Clock, list[object]]:
        clock = Clock()
        polls: list[object] = []

        async def poll() -> list[object]:
            return polls[-1]  # type: ignore[return-value]

        return History(clock, interval, window, poll), clock, polls

    def test_rates_from_message_counts(self) -> None:
        """Rate is the count's growth per second between polls; a count that drops (restart) has none."""
        h, _, _ = self._history()
        for ts, count in ((0, 0), (1, 10), (2, 30), (3, 5)):
            h.record(ts, [_node("a:1", "h", _raw_topic(0, [_raw_channel("c", count)]))])
        self.assertEqual([p["rate"] for p in h.get("t", "c")], [None, 10.0, 20.0, None])

    def test_topic_depth_and_channel_backlog_are_apart(self) -> None:
        """A topic's depth is its own queue (the topic page's headline); its channels' depths are its backlog."""
        h, _, _ = self._history()
        h.record(0, [_node("a:1", "h", _raw_topic(2, [_raw_channel("x", 5), _raw_channel("y", 7)])),
                     _node("b:1", "h", _raw_topic(3, [_raw_channel("x", 11)]))])
        (topic,) = h.get("t")
        self.assertEqual((topic["depth"], topic["backlog"], topic["in_flight"]), (5, 23, 3))
        (x,) = h.get("t", "x")
        self.assertEqual((x["depth"], x["backlog"], x["in_flight"], x["messages"]), (16, 16, 2, 16))
        (cluster,) = h.get()
        self.assertEqual((cluster["depth"], cluster["backlog"], cluster["messages"]), (5, 23, 10))

    def test_window_is_bounded_and_gone_series_dropped(self) -> None:
        """At most window/interval + 1 points; a channel no longer reported loses its series."""
        h, _, _ = self._history(interval=1.0, window=3.0)
        for ts in range(10):
            h.record(ts, [_node("a:1", "h", _raw_topic(0, [_raw_channel("c", ts)]))])
        self.assertEqual([p["ts"] for p in h.get("t", "c")], [6, 7, 8, 9])
        h.record(10, [_node("a:1", "h", _raw_topic(0, []))])
        self.assertEqual(h.get("t", "c"), [])
        self.assertEqual(len(h.get("t")), 4)

    def test_series_count_is_bounded(self) -> None:
        """No more than MAX_SERIES series, however many channels the cluster has."""
        h, _, _ = self._history()
        channels = [_raw_channel(f"c{i}", 1) for i in range(MAX_SERIES + 10)]
        h.record(0, [_node("a:1", "h", _raw_topic(0, channels))])
        self.assertEqual(len(h.series), MAX_SERIES)

    def test_loop_polls_on_the_clock(self) -> None:
        """start() polls at once and every interval; stop() ends it."""
        h, clock, polls = self._history(interval=5.0, window=60.0)
        polls.append([_node("a:1", "h", _raw_topic(3, []))])
        h.start()
        clock.advance(5)
        clock.advance(5)
        self.assertEqual(len(h.get()), 3)
        h.stop()
        clock.advance(50)
        self.assertEqual(len(h.get()), 3)


class HTTPHelperTests(SynchronousTestCase):
    def test_body_decoding_errors_are_gos(self) -> None:
        """Empty body: EOF; a cut one: unexpected EOF; fields of another type are refused."""
        for body, text in ((b"", "EOF"), (b'{"action":', "unexpected EOF"),
                           (b'{"action":1}', "cannot unmarshal"), (b"[]", "cannot unmarshal array")):
            with self.assertRaises(ValueError) as e:
                decode_struct(body, ("action",))
            self.assertIn(text, str(e.exception))
        self.assertEqual(decode_struct(b'{"Action":"pause"} trailing', ("action",)), {"action": "pause"})

    def test_route_matching(self) -> None:
        """httprouter's :params take exactly one non-empty segment."""
        self.assertTrue(match_route("/api/topics/:topic", "/api/topics/t"))
        self.assertFalse(match_route("/api/topics/:topic", "/api/topics/"))
        self.assertFalse(match_route("/api/topics/:topic", "/api/topics/t/c"))
