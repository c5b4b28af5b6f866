"""/metrics without sockets: the collectors on fake and in-memory snapshots, slicing, the fsync histogram.

The exposition is always parsed back with ``prometheus_client``'s own parsers,
so what is checked is what a Prometheus server would read.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable, Generator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families
from treq.testing import StubTreq
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.http.metrics import MetricsPage
from nsqtw.lookupd.http import LookupdHTTPAPI
from nsqtw.lookupd.metrics import LookupdMetrics
from nsqtw.nsqd.http import HTTPAPI
from nsqtw.observe.metrics import NSQDCollector, NSQDMetrics, run_in_slices
from nsqtw.observe.stats import snapshot, snapshot_steps
from nsqtw.protocol.wire import encode_command
from nsqtw.storage.fsync import FsyncLatency
from tests.helpers import connect, make_lookupd, make_nsqd, take_frames
from tests.unit.test_lookupd_http import REF_NODE
from tests.unit.test_lookupd_protocol import Conn


def at_once(fn: Callable[[], Any]) -> Deferred[Any]:
    """A 'worker thread' that runs the function now (unit tests start no threads)."""
    return succeed(fn())


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text exposition: (name, sorted labels) -> value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def families(text: str) -> dict[str, str]:
    """Family name -> type."""
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def render(collector: Any) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def fake_snapshot(per_client: bool = False) -> dict[str, Any]:
    """What snapshot_steps(extras=True) gives, plus what NSQDMetrics adds, for a made-up node."""
    client = {"client_id": 7, "hostname": "worker-1", "remote_address": "10.0.0.9:5000", "ready_count": 10,
              "in_flight_count": 2, "message_count": 40, "finish_count": 37, "requeue_count": 1}
    e2e = {"count": 12, "percentiles": [{"quantile": 0.99, "value": 2_500_000.0},
                                         {"quantile": 0.5, "value": 1_000_000.0}]}
    channel = {"channel_name": "archive", "depth": 5, "backend_depth": 3, "in_flight_count": 2,
               "deferred_count": 1, "message_count": 50, "requeue_count": 4, "timeout_count": 6,
               "client_count": 1, "clients": [client] if per_client else None, "paused": True,
               "e2e_processing_latency": e2e, "finish_count": 37}
    quiet = dict(channel, channel_name="quiet", depth=0, paused=False, clients=[] if per_client else None,
                 e2e_processing_latency={"count": 0, "percentiles": None})
    producer = {"client_id": 8, "hostname": "pub-1", "remote_address": "10.0.0.8:6000",
                "pub_counts": [{"topic": "orders", "count": 99}]}
    return {
        "version": "1.3.0",
        "health": "NOK - disk full",
        "start_time": 1000,
        "topics": [{"topic_name": "orders", "channels": [channel, quiet], "depth": 9, "backend_depth": 4,
                    "message_count": 100, "message_bytes": 2048, "paused": False,
                    "e2e_processing_latency": e2e}],
        "producers": [producer] if per_client else None,
        "nsqtw": {"disk": {"segments_set_aside": 2, "write_errors": 5, "unwritable_queues": 1},
                  "clients": 3, "producers": 1, "start_time": 1000.5, "now": 1100.5, "threads": 6,
                  "per_client": per_client,
                  "fsync": {"bounds": [0.001, 0.01], "cumulative": [3, 5, 6], "sum": 1.25}},
    }


class CollectorTests(SynchronousTestCase):
    def test_fake_snapshot(self) -> None:
        """Each snapshot figure comes out under its metric name, labels and type, e2e in seconds."""
        collector = NSQDCollector()
        collector.snapshot = fake_snapshot()
        text = render(collector)
        got = samples(text)
        types = families(text)
        ch = (("channel", "archive"), ("topic", "orders"))
        expected = {
            ("nsqd_info", (("version", "1.3.0"),)): 1.0,
            ("nsqd_healthy", ()): 0.0,
            ("nsqd_start_time_seconds", ()): 1000.5,
            ("nsqd_uptime_seconds", ()): 100.0,
            ("nsqd_topics", ()): 1.0,
            ("nsqd_channels", ()): 2.0,
            ("nsqd_clients", ()): 3.0,
            ("nsqd_producers", ()): 1.0,
            ("nsqd_threads", ()): 6.0,
            ("nsqd_disk_unwritable_queues", ()): 1.0,
            ("nsqd_disk_write_errors_total", ()): 5.0,
            ("nsqd_disk_segments_set_aside_total", ()): 2.0,
            ("nsqd_fsync_duration_seconds_bucket", (("le", "0.001"),)): 3.0,
            ("nsqd_fsync_duration_seconds_bucket", (("le", "0.01"),)): 5.0,
            ("nsqd_fsync_duration_seconds_bucket", (("le", "+Inf"),)): 6.0,
            ("nsqd_fsync_duration_seconds_count", ()): 6.0,
            ("nsqd_fsync_duration_seconds_sum", ()): 1.25,
            ("nsqd_topic_depth", (("topic", "orders"),)): 9.0,
            ("nsqd_topic_backend_depth", (("topic", "orders"),)): 4.0,
            ("nsqd_topic_channels", (("topic", "orders"),)): 2.0,
            ("nsqd_topic_paused", (("topic", "orders"),)): 0.0,
            ("nsqd_topic_messages_total", (("topic", "orders"),)): 100.0,
            ("nsqd_topic_message_bytes_total", (("topic", "orders"),)): 2048.0,
            ("nsqd_topic_e2e_processing_latency_seconds", (("quantile", "0.99"), ("topic", "orders"))): 0.0025,
            ("nsqd_topic_e2e_processing_latency_samples", (("topic", "orders"),)): 12.0,
            ("nsqd_channel_depth", ch): 5.0,
            ("nsqd_channel_backend_depth", ch): 3.0,
            ("nsqd_channel_in_flight", ch): 2.0,
            ("nsqd_channel_deferred", ch): 1.0,
            ("nsqd_channel_clients", ch): 1.0,
            ("nsqd_channel_messages_total", ch): 50.0,
            ("nsqd_channel_finished_total", ch): 37.0,
            ("nsqd_channel_requeued_total", ch): 4.0,
            ("nsqd_channel_timed_out_total", ch): 6.0,
            ("nsqd_channel_paused", ch): 1.0,
            ("nsqd_channel_e2e_processing_latency_seconds", (("channel", "archive"), ("quantile", "0.5"),
                                                             ("topic", "orders"))): 0.001,
            ("nsqd_channel_e2e_processing_latency_samples", ch): 12.0,
        }
        for key, value in expected.items():
            self.assertAlmostEqual(got.get(key, float("nan")), value, msg=str(key))
        # a channel without latency samples has no quantile series
        self.assertNotIn(("nsqd_channel_e2e_processing_latency_samples",
                          (("channel", "quiet"), ("topic", "orders"))), got)
        self.assertEqual(types["nsqd_channel_messages"], "counter")
        self.assertEqual(types["nsqd_channel_depth"], "gauge")
        self.assertEqual(types["nsqd_fsync_duration_seconds"], "histogram")
        self.assertFalse([name for name, _ in got if name.startswith("nsqd_client_")])

    def test_per_client_series(self) -> None:
        """With per-client series asked for, each consumer and producer gets its own labelled series."""
        collector = NSQDCollector()
        collector.snapshot = fake_snapshot(per_client=True)
        got = samples(render(collector))
        labels = (("channel", "archive"), ("client_id", "7"), ("hostname", "worker-1"),
                  ("remote_address", "10.0.0.9:5000"), ("topic", "orders"))
        self.assertEqual(got[("nsqd_client_ready", labels)], 10.0)
        self.assertEqual(got[("nsqd_client_in_flight", labels)], 2.0)
        self.assertEqual(got[("nsqd_client_messages_total", labels)], 40.0)
        self.assertEqual(got[("nsqd_client_finished_total", labels)], 37.0)
        self.assertEqual(got[("nsqd_client_requeued_total", labels)], 1.0)
        self.assertEqual(got[("nsqd_client_published_total", (
            ("client_id", "8"), ("hostname", "pub-1"), ("remote_address", "10.0.0.8:6000"),
            ("topic", "orders")))], 99.0)

    def test_nothing_before_the_first_snapshot(self) -> None:
        """A collector that has no snapshot yet writes nothing (rather than zeros that look real)."""
        self.assertEqual(render(NSQDCollector()), "")

    def test_in_memory_node_matches_stats(self) -> None:
        """Published, delivered and FINished messages of a real in-memory node read the same on both pages."""
        nsqd, clock = make_nsqd()
        proto, transport = connect(nsqd, clock)
        proto.dataReceived(encode_command(b"SUB", b"t", b"c") + b"RDY 5\n")
        nsqd.publish("t", [b"a", b"b", b"c"])
        for _ in range(5):
            clock.advance(0)
        frames = take_frames(transport)
        ids = [payload[10:26] for ftype, payload in frames if ftype == 2]
        self.assertEqual(len(ids), 3)
        proto.dataReceived(b"".join(encode_command(b"FIN", i) for i in ids[:2]))
        clock.advance(0)
        metrics = NSQDMetrics(nsqd, clock)
        self.successResultOf(metrics.prepare())
        got = samples(render(metrics.collector))
        stats = snapshot(nsqd)
        channel = stats["topics"][0]["channels"][0]
        ch = (("channel", "c"), ("topic", "t"))
        self.assertEqual(got[("nsqd_channel_messages_total", ch)], channel["message_count"])
        self.assertEqual(got[("nsqd_channel_in_flight", ch)], channel["in_flight_count"])
        self.assertEqual(got[("nsqd_channel_in_flight", ch)], 1)
        self.assertEqual(got[("nsqd_channel_finished_total", ch)], 2)
        self.assertEqual(got[("nsqd_channel_clients", ch)], channel["client_count"])
        self.assertEqual(got[("nsqd_topic_messages_total", (("topic", "t"),))], stats["topics"][0]["message_count"])
        self.assertEqual(got[("nsqd_clients", ())], 1)


class SliceTests(SynchronousTestCase):
    def test_steps_spread_over_turns(self) -> None:
        """Steps beyond the time budget wait for the next reactor turn; the result comes at the end."""
        turns: list[Callable[[], None]] = []

        class Turns:
            """A reactor that only records callLater(0): each recorded call is a later turn."""

            def callLater(self, delay: float, fn: Callable[[], None]) -> None:
                assert delay == 0
                turns.append(fn)

        now = [0.0]
        ran: list[int] = []

        def steps() -> Generator[None, None, str]:
            for i in range(6):
                ran.append(i)
                now[0] += 0.002  # each step "takes" 2 ms
                yield None
            return "done"

        d = run_in_slices(steps(), Turns(), budget=0.004, timer=lambda: now[0])  # type: ignore[arg-type]
        self.assertEqual(ran, [0, 1])  # the first slice runs at once
        self.assertNoResult(d)
        turns.pop(0)()
        self.assertEqual(ran, [0, 1, 2, 3])
        turns.pop(0)()
        self.assertEqual(ran, [0, 1, 2, 3, 4, 5])
        self.assertNoResult(d)  # the last step has not returned yet
        turns.pop(0)()
        self.assertEqual(self.successResultOf(d), "done")
        self.assertEqual(turns, [])

    def test_failure_reaches_the_caller(self) -> None:
        """An exception in a step fails the Deferred instead of vanishing into the reactor."""
        def steps() -> Generator[None, None, None]:
            yield None
            raise ValueError("broken")

        clock = Clock()
        d = run_in_slices(steps(), clock, budget=0.0)
        self.assertNoResult(d)
        clock.advance(0)
        self.failureResultOf(d, ValueError)

    def test_sliced_snapshot_is_the_snapshot(self) -> None:
        """Run to the end, the steps give exactly /stats' snapshot."""
        nsqd, clock = make_nsqd()
        for t in ("a", "b"):
            topic = nsqd.get_topic(t)
            for c in ("x", "y", "z"):
                topic.get_channel(c)
        nsqd.publish("a", [b"1", b"2"])
        steps = snapshot_steps(nsqd, include_mem=False)
        count = 0
        while True:
            try:
                next(steps)
                count += 1
            except StopIteration as stop:
                result = stop.value
                break
        self.assertEqual(count, 6)  # one step per channel
        self.assertEqual(result, snapshot(nsqd, include_mem=False))

    def test_channel_deleted_between_slices_is_left_out(self) -> None:
        """A channel deleted while the snapshot is half taken does not show up with stale figures."""
        nsqd, clock = make_nsqd()
        topic = nsqd.get_topic("t")
        for c in ("a", "b", "c"):
            topic.get_channel(c)
        steps = snapshot_steps(nsqd, include_mem=False, extras=True)
        next(steps)  # channel a taken
        topic.delete_channel("b")
        clock.advance(0)
        try:
            while True:
                next(steps)
        except StopIteration as stop:
            result = stop.value
        self.assertEqual([c["channel_name"] for c in result["topics"][0]["channels"]], ["a", "c"])
        self.assertEqual(result["topics"][0]["channels"][0]["finish_count"], 0)
        self.assertIn("nsqtw", result)


class FsyncLatencyTests(SynchronousTestCase):
    def test_threads_record_without_sharing(self) -> None:
        """Durations recorded by several threads all count, each in its bucket (cumulative)."""
        latency = FsyncLatency(bounds=(0.001, 0.01))

        def work(seconds: float) -> None:
            for _ in range(1000):
                latency.record(seconds)

        threads = [threading.Thread(target=work, args=(s,)) for s in (0.0005, 0.005, 0.5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        hist = latency.histogram()
        self.assertEqual(hist.cumulative, (1000, 2000, 3000))
        self.assertEqual(hist.count, 3000)
        self.assertAlmostEqual(hist.sum, 1000 * (0.0005 + 0.005 + 0.5), places=6)

    def test_real_fsync_is_timed(self) -> None:
        """fsync of a real file is done and counted; a failing one raises and is counted too."""
        ticks = iter([1.0, 1.003, 2.0, 2.2])
        latency = FsyncLatency(bounds=(0.001, 0.01), timer=lambda: next(ticks))
        with tempfile.TemporaryFile() as f:
            f.write(b"x")
            latency.fsync(f.fileno())
        fd = os.open(os.devnull, os.O_RDONLY)
        os.close(fd)
        with self.assertRaises(OSError):
            latency.fsync(fd)  # closed descriptor: EBADF
        hist = latency.histogram()
        self.assertEqual(hist.cumulative, (0, 1, 2))
        self.assertAlmostEqual(hist.sum, 0.203)


class PageTests(SynchronousTestCase):
    def _page(self, **options: Any) -> tuple[Any, Clock, MetricsPage, StubTreq]:
        nsqd, clock = make_nsqd(**options)
        node = NSQDMetrics(nsqd, clock, bool(options.get("metrics_per_client")))
        page = MetricsPage(node.collector, node.prepare, run_in_thread=at_once)
        return nsqd, clock, page, StubTreq(HTTPAPI(nsqd, metrics=page).resource())

    def _get(self, stub: StubTreq, accept: str | None = None, method: str = "GET") -> tuple[int, str, str]:
        headers = {"Accept": accept} if accept else None
        d = stub.request(method, "http://127.0.0.1/metrics", headers=headers)
        stub.flush()
        r = self.successResultOf(d)
        body = self.successResultOf(r.content()).decode()
        return r.code, (r.headers.getRawHeaders("content-type") or [""])[0], body

    def test_prometheus_text_by_default(self) -> None:
        """GET /metrics answers the Prometheus text format 0.0.4, with process metrics of this registry."""
        nsqd, _, _, stub = self._page()
        nsqd.get_topic("t").get_channel("c")
        code, content_type, body = self._get(stub)
        self.assertEqual(code, 200)
        self.assertEqual(content_type, "text/plain; version=0.0.4; charset=utf-8")
        names = families(body)
        self.assertEqual(names["nsqd_channel_depth"], "gauge")
        self.assertIn("process_cpu_seconds", names)
        self.assertIn("python_info", names)
        self.assertIn("python_gc_objects_collected", names)

    def test_openmetrics_when_asked(self) -> None:
        """An Accept of application/openmetrics-text gets OpenMetrics, which its strict parser accepts."""
        nsqd, _, _, stub = self._page()
        nsqd.publish("t", [b"m"])
        code, content_type, body = self._get(
            stub, "application/openmetrics-text; version=1.0.0,text/plain;version=0.0.4;q=0.5")
        self.assertEqual(code, 200)
        self.assertTrue(content_type.startswith("application/openmetrics-text; version=1.0.0"), content_type)
        self.assertTrue(body.endswith("# EOF\n"))
        parsed = {f.name: f for f in parse_openmetrics(body)}
        self.assertEqual(parsed["nsqd_topic_messages"].type, "counter")
        self.assertEqual(parsed["nsqd_topic_messages"].samples[0].value, 1.0)
        self.assertEqual(parsed["nsqd"].type, "info")

    def test_only_get(self) -> None:
        """POST /metrics is a 405 like nsqd's other GET routes (httprouter's rule)."""
        _, _, _, stub = self._page()
        code, _, _ = self._get(stub, method="POST")
        self.assertEqual(code, 405)

    def test_one_scrape_at_a_time(self) -> None:
        """A second scrape waits for the first one's snapshot and formatting; both are answered."""
        started: list[Deferred[None]] = []

        def prepare() -> Deferred[None]:
            d: Deferred[None] = Deferred()
            started.append(d)
            return d

        page = MetricsPage(NSQDCollector(), prepare, run_in_thread=at_once)
        first = page.render("")
        second = page.render("")
        self.assertEqual(len(started), 1)
        started[0].callback(None)
        self.assertEqual(len(started), 2)
        self.successResultOf(first)
        started[1].callback(None)
        body, _ = self.successResultOf(second)
        self.assertIn(b"process_cpu_seconds_total", body)

    def test_registries_are_per_daemon(self) -> None:
        """Two pages never share series: each has its own registry, not prometheus_client's global one."""
        from prometheus_client import REGISTRY

        a = MetricsPage(NSQDCollector(), lambda: None, run_in_thread=at_once)
        b = MetricsPage(NSQDCollector(), lambda: None, run_in_thread=at_once)
        self.assertIsNot(a.registry, b.registry)
        self.assertIsNot(a.registry, REGISTRY)


class LookupdTests(SynchronousTestCase):
    def test_counts(self) -> None:
        """Active nodes, topics and channels; a tombstoned or silent producer does not count for its topic."""
        lookupd, clock = make_lookupd()
        import json

        from nsqtw.lookupd.wire import identify

        a = Conn(lookupd, 1)
        a.send(identify(json.dumps({**REF_NODE, "broadcast_address": "a"}).encode())
               + b"REGISTER t1 c1\nREGISTER t1 c2\nREGISTER t2\n")
        b = Conn(lookupd, 2)
        b.send(identify(json.dumps({**REF_NODE, "broadcast_address": "b", "http_port": 2}).encode())
               + b"REGISTER t1\n")
        lookupd.tombstone("t1", "b:2")
        counts = LookupdMetrics(lookupd)
        page = MetricsPage(counts.collector, counts.prepare, run_in_thread=at_once)
        stub = StubTreq(LookupdHTTPAPI(lookupd, metrics=page).resource())
        d = stub.request("GET", "http://127.0.0.1/metrics")
        stub.flush()
        got = samples(self.successResultOf(self.successResultOf(d).content()).decode())
        self.assertEqual(got[("nsqlookupd_producers", ())], 2)
        self.assertEqual(got[("nsqlookupd_topics", ())], 2)
        self.assertEqual(got[("nsqlookupd_channels", ())], 2)
        self.assertEqual(got[("nsqlookupd_topic_producers", (("topic", "t1"),))], 1)  # b is tombstoned
        self.assertEqual(got[("nsqlookupd_topic_producers", (("topic", "t2"),))], 1)
        self.assertEqual(got[("nsqlookupd_topic_channels", (("topic", "t1"),))], 2)
        self.assertEqual(got[("nsqlookupd_topic_channels", (("topic", "t2"),))], 0)
        self.assertIn(("nsqlookupd_info", (("version", "1.3.0"),)), got)
        clock.advance(lookupd.options.inactive_producer_timeout + 1)
        counts.prepare()
        later = samples(render(counts.collector))
        self.assertEqual(later[("nsqlookupd_producers", ())], 0)
        self.assertEqual(later[("nsqlookupd_topic_producers", (("topic", "t1"),))], 0)
        self.assertEqual(later[("nsqlookupd_uptime_seconds", ())], lookupd.options.inactive_producer_timeout + 1)
