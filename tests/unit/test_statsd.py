"""statsd pushes: nsqd's names, types, prefix, packet packing and spreading, driven by task.Clock."""

from __future__ import annotations

from twisted.internet.defer import succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.observe.stats import snapshot
from nsqtw.observe.statsd import StatsdService, format_prefix, metrics, packets
from nsqtw.protocol.wire import encode_mpub
from tests.helpers import connect, make_nsqd


class FakeUDP:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, tuple[str, int]]] = []
        self.stopped = False

    def write(self, datagram: bytes, to: tuple[str, int]) -> None:
        self.sent.append((datagram, to))

    def stopListening(self) -> None:
        self.stopped = True


class FakeReactor(Clock):
    """A clock that also hands out UDP ports and resolves names."""

    def __init__(self) -> None:
        super().__init__()
        self.udp = FakeUDP()
        self.listened: list[str] = []

    def listenUDP(self, port: int, protocol: object, interface: str = "") -> FakeUDP:
        self.listened.append(interface)
        return self.udp

    def resolve(self, name: str):
        return succeed("127.0.0.1")


def lines(datagrams: list[bytes]) -> list[str]:
    return [ln for d in datagrams for ln in d.decode().splitlines()]


class FormatTests(SynchronousTestCase):
    def test_prefix(self) -> None:
        """%s becomes broadcast-address_port with dots and colons as underscores; a dot ends it."""
        self.assertEqual(format_prefix("nsq.%s", "host.example.com", 4151), "nsq.host_example_com_4151.")
        self.assertEqual(format_prefix("nsq.%s.", "10.0.0.1", 80), "nsq.10_0_0_1_80.")
        self.assertEqual(format_prefix("plain", "h", 1), "plain.")
        self.assertEqual(format_prefix("", "h", 1), "")

    def test_packets_never_split_a_line(self) -> None:
        """Lines are packed up to the packet size; a line longer than it goes alone."""
        items = [("a", 1, "c"), ("b", 22, "g"), ("c" * 40, 3, "g"), ("d", 4, "c")]
        out = packets("p.", items, 20)
        self.assertEqual(out, [b"p.a:1|c\np.b:22|g\n", b"p." + b"c" * 40 + b":3|g\n", b"p.d:4|c\n"])
        self.assertEqual(packets("p.", [], 20), [])

    def test_metric_names_types_and_deltas(self) -> None:
        """Counters are differences since the last push, gauges are values; e2e and mem as nsqd names them."""
        nsqd, clock = make_nsqd(e2e_processing_latency_percentile=(0.99,))
        sub, _ = connect(nsqd, clock)
        sub.dataReceived(b"SUB t c\n")
        sub2, _ = connect(nsqd, clock)
        sub2.dataReceived(b"SUB t eph#ephemeral\n")
        pub, _ = connect(nsqd, clock)
        pub.dataReceived(encode_mpub(b"t", [b"ab", b"cde"]))
        clock.advance(0)
        first = snapshot(nsqd, include_clients=False, include_mem=False)
        got = {(n, k): v for n, v, k in metrics(first, None, True, None, None)}
        self.assertEqual(got[("topic.t.message_count", "c")], 2)
        self.assertEqual(got[("topic.t.message_bytes", "c")], 5)
        self.assertEqual(got[("topic.t.depth", "g")], 0)
        self.assertEqual(got[("topic.t.channel.c.depth", "g")], 2)
        self.assertEqual(got[("topic.t.channel.c.clients", "g")], 1)
        self.assertEqual(got[("topic.t.channel.c.e2e_processing_latency_99", "g")], 0)
        self.assertEqual(got[("topic.t.e2e_processing_latency_99", "g")], 0)
        for name in ("in_flight_count", "deferred_count", "backend_depth"):
            self.assertIn((f"topic.t.channel.c.{name}", "g"), got)
        for name in ("requeue_count", "timeout_count", "message_count"):
            self.assertIn((f"topic.t.channel.c.{name}", "c"), got)
        self.assertFalse(any("ephemeral" in n for n, _ in got))
        pub.dataReceived(encode_mpub(b"t", [b"x"]))
        clock.advance(0)
        second = snapshot(nsqd, include_clients=False, include_mem=False)
        mem = {"heap_objects": 1, "heap_idle_bytes": 2, "heap_in_use_bytes": 3, "heap_released_bytes": 4,
               "gc_pause_usec_100": 5, "gc_pause_usec_99": 6, "gc_pause_usec_95": 7,
               "next_gc_bytes": 8, "gc_total_runs": 12}
        got = {(n, k): v for n, v, k in metrics(second, first, False, mem, {"gc_total_runs": 10})}
        self.assertEqual(got[("topic.t.message_count", "c")], 1)
        self.assertEqual(got[("topic.t.channel.c.message_count", "c")], 1)
        self.assertIn(("topic.t.channel.eph#ephemeral.depth", "g"), got)
        self.assertEqual(got[("mem.heap_objects", "g")], 1)
        self.assertEqual(got[("mem.gc_runs", "c")], 2)


class ServiceTests(SynchronousTestCase):
    def start(self, **options):
        reactor = FakeReactor()
        nsqd, _ = make_nsqd(statsd_address="localhost:8125", statsd_prefix="nsq.%s",
                            broadcast_address="node1", **options)
        nsqd.clock = reactor
        nsqd.http_port = 4151
        service = StatsdService(nsqd, reactor)
        service.startService()
        self.addCleanup(service.stopService)
        return reactor, nsqd, service

    def test_pushes_every_interval(self) -> None:
        """Nothing before the first interval; then one push per interval with the host-keyed prefix."""
        reactor, nsqd, _ = self.start(statsd_interval=1.0, statsd_mem_stats=False)
        nsqd.get_topic("t")
        reactor.advance(0.5)
        self.assertEqual(reactor.udp.sent, [])
        reactor.advance(0.5)
        sent = lines([d for d, _ in reactor.udp.sent])
        self.assertIn("nsq.node1_4151.topic.t.message_count:0|c", sent)
        self.assertEqual({to for _, to in reactor.udp.sent}, {("127.0.0.1", 8125)})
        count = len(reactor.udp.sent)
        reactor.advance(1.0)
        self.assertEqual(len(reactor.udp.sent), 2 * count)

    def test_packets_spread_over_the_interval(self) -> None:
        """With a 10s interval the packets go out evenly over the first 9s, the first at once."""
        reactor, nsqd, _ = self.start(statsd_interval=10.0, statsd_udp_packet_size=100,
                                      statsd_mem_stats=True)
        for i in range(5):
            nsqd.get_topic(f"topic{i}").get_channel("c")
        reactor.advance(10.0)
        first = len(reactor.udp.sent)
        self.assertEqual(first, 1)
        reactor.advance(9.0)
        total = len(reactor.udp.sent)
        self.assertGreater(total, 5)
        self.assertTrue(all(len(d) <= 100 for d, _ in reactor.udp.sent))
        self.assertTrue(any(ln.startswith("nsq.node1_4151.mem.gc_runs:") for ln in
                            lines([d for d, _ in reactor.udp.sent])))

    def test_stop_cancels_pending_packets(self) -> None:
        """Stopping the service sends nothing more and closes its UDP port."""
        reactor, nsqd, service = self.start(statsd_interval=10.0, statsd_udp_packet_size=60)
        nsqd.get_topic("t").get_channel("c")
        reactor.advance(10.0)
        sent = len(reactor.udp.sent)
        service.stopService()
        reactor.advance(30.0)
        self.assertEqual(len(reactor.udp.sent), sent)
        self.assertTrue(reactor.udp.stopped)
