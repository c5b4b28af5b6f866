"""Channels without clients share their topic's log (nsqtw.core.parking): the same messages, in the
same order, the same counts and bounds as when each held its own copies; no per-channel work per batch.

Socket-free: a task.Clock and the topic's real pump.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from nsqtw.core import handoff
from nsqtw.core.channel import Channel
from nsqtw.core.message import Message
from nsqtw.core.nsqd import NSQD
from nsqtw.core.topic import Topic
from nsqtw.interfaces import IConsumer
from nsqtw.storage.diskqueue import DiskQueue
from nsqtw.storage.executor import SynchronousDiskExecutor
from nsqtw.storage.segments import nsqd_msg_size_limits
from tests.helpers import EPOCH, make_options

_ids = itertools.count(1)


@implementer(IConsumer)
class Reader:
    """A subscribed client that takes up to ``rdy`` messages and keeps them."""

    msg_timeout = 60.0
    sample_rate = 0

    def __init__(self, rdy: int = 0) -> None:
        self.client_id = next(_ids)
        self.rdy = rdy
        self.got: list[Message] = []
        self.deleted = False

    @classmethod
    def subscribe(cls, channel: Channel, rdy: int = 0) -> Reader:
        reader = cls(rdy)
        channel.add_client(reader)
        return reader

    def ready_capacity(self) -> int:
        return self.rdy - len(self.got)

    def deliver(self, messages: list[Any]) -> None:
        self.got.extend(messages)

    def messages_finished(self, count: int) -> None:
        pass

    def message_requeued(self) -> None:
        pass

    def message_timed_out(self) -> None:
        pass

    def in_flight_emptied(self) -> None:
        pass

    def channel_deleted(self) -> None:
        self.deleted = True


class ParkingTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(EPOCH)

    def build(self, **options: Any) -> tuple[NSQD, Topic]:
        self.nsqd = NSQD(make_options(**options), self.clock)
        return self.nsqd, self.nsqd.get_topic("t")

    def build_on_disk(self, **overrides: Any) -> Topic:
        """Topic ``t`` of a node whose queues overflow to real disk queues (synchronous disk jobs)."""
        path = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, path)
        options = make_options(**overrides)
        lo, hi = nsqd_msg_size_limits(options.max_msg_size)
        self.nsqd = NSQD(options, self.clock, lambda name: DiskQueue(
            name, path, 1 << 20, lo, hi, options.sync_every, 0, self.clock, SynchronousDiskExecutor(),
            unwritten=self.nsqd.unwritten))
        return self.nsqd.get_topic("t")

    def settle(self) -> None:
        for _ in range(10):
            self.clock.advance(0)

    def publish(self, *bodies: bytes) -> None:
        for body in bodies:  # one PUB each, as separate reactor turns
            self.nsqd.publish("t", [body])
            self.settle()

    def read_all(self, channel: Channel) -> list[bytes]:
        """Subscribe a reader with room for everything; what it gets, in order."""
        reader = Reader.subscribe(channel, rdy=100_000)
        for _ in range(5):  # (a disk queue writes within 5 ms, and reads back over a few turns)
            channel.wake()
            self.clock.advance(0.01)
            self.settle()
        return [m.body for m in reader.got]

    def test_a_pub_to_channels_without_clients_costs_no_step_per_channel(self) -> None:
        """500 channels without clients, all parked: each PUB reaches all of them at once, in the
        publish call, with no pump step at all (HANDOFF_CHANNELS is 7 here, so each channel taken
        one by one would need 72), and each counts it."""
        self.patch(handoff, "HANDOFF_CHANNELS", 7)
        nsqd, topic = self.build()
        channels = [topic.get_channel(f"c{i}") for i in range(500)]
        self.settle()
        steps = []
        drain = topic._pump._drain

        def counted() -> bool:
            steps.append(1)
            return drain()
        topic._pump._drain = counted
        for body in (b"a", b"b", b"c"):
            nsqd.publish("t", [body])
            self.assertEqual({c.depth() for c in channels}, {1 + b"abc".index(body)})  # before any turn
        self.settle()
        self.assertEqual(len(steps), 0)
        self.assertEqual({c.depth() for c in channels}, {3})
        self.assertEqual({c.message_count for c in channels}, {3})
        self.assertEqual({c.stats_counts()["depth"] for c in channels}, {3})
        self.assertEqual(len(topic._parking), 500)
        self.assertEqual({len(c.memory) for c in channels}, {0})  # no copy of their own yet
        for channel in channels[:3]:
            self.assertEqual(self.read_all(channel), [b"a", b"b", b"c"])

    def test_a_publish_goes_to_the_log_at_once_only_when_the_pump_has_nothing_else(self) -> None:
        """Straight to the parked channels' log in the publish call, except while the pump would
        do something else first: a paused topic holds it in memory (and what follows, behind it),
        a channel with a client takes it from the pump's hand-off. Order and counts hold."""
        nsqd, topic = self.build()
        a, b = topic.get_channel("a"), topic.get_channel("b")
        self.settle()
        topic.pause()
        nsqd.publish("t", [b"1"])
        self.settle()
        self.assertEqual((a.depth(), topic.depth()), (0, 1))  # held by the paused topic
        topic.unpause()
        nsqd.publish("t", [b"2"])  # memory is not empty: behind "1", through the pump
        self.assertEqual(a.depth(), 0)
        self.settle()
        self.assertEqual((a.depth(), topic.depth()), (2, 0))
        nsqd.publish("t", [b"3"])
        self.assertEqual(a.depth(), 3)  # at once
        reader = Reader.subscribe(b, rdy=100)
        nsqd.publish("t", [b"4"])
        self.assertEqual(a.depth(), 3)  # b is not parked now: the pump's hand-off
        self.settle()
        self.assertEqual([m.body for m in reader.got], [b"1", b"2", b"3", b"4"])
        self.assertEqual((a.depth(), a.message_count, b.message_count), (4, 4, 4))
        self.assertEqual(self.read_all(a), [b"1", b"2", b"3", b"4"])

    def test_order_across_parking_and_a_client(self) -> None:
        """Messages queued before the channel parked, shared while parked, and given after a
        client came, are delivered in publish order; the count goes on."""
        nsqd, topic = self.build()
        a = topic.get_channel("a")
        b = topic.get_channel("b")
        reader = Reader.subscribe(a)  # RDY 0: a keeps its own copies
        self.publish(b"1", b"2")
        self.assertEqual(len(a.memory), 2)
        a.remove_client(reader)  # a parks at the next batch, with 2 of its own
        self.publish(b"3", b"4")
        self.assertTrue(topic._parking.is_parked(a))
        self.assertEqual((a.depth(), a.message_count), (4, 4))
        self.assertEqual(self.read_all(a), [b"1", b"2", b"3", b"4"])
        self.assertFalse(topic._parking.is_parked(a))
        self.publish(b"5")
        self.assertEqual(a.message_count, 5)
        self.assertEqual(self.read_all(b), [b"1", b"2", b"3", b"4", b"5"])

    def test_every_channel_delivers_its_own_objects(self) -> None:
        """The log holds one object per message for every parked channel; each channel that
        delivers gets copies of its own (attempts and in-flight state are per channel)."""
        nsqd, topic = self.build()
        channels = [topic.get_channel(f"c{i}") for i in range(4)]
        self.publish(b"x", b"y")
        readers = [Reader.subscribe(c, rdy=10) for c in channels]
        for c in channels:
            c.wake()
        self.settle()
        objects = [id(m) for r in readers for m in r.got]
        self.assertEqual(len(objects), 8)
        self.assertEqual(len(set(objects)), 8)

    def test_the_memory_bound_holds_and_the_rest_goes_to_disk(self) -> None:
        """--mem-queue-size=5: a parked channel holds 5 (its share), then is unparked and writes the
        rest to its disk queue, as a channel with its own copies does; nothing is lost or doubled."""
        topic = self.build_on_disk(mem_queue_size=5)
        channels = [topic.get_channel(f"c{i}") for i in range(3)]
        self.publish(b"1", b"2", b"3")
        self.assertEqual(len(topic._parking), 3)
        self.publish(b"4", b"5", b"6", b"7")
        self.clock.advance(handoff.SPILL_INTERVAL)  # (the copies that only go to disk gather for it)
        self.settle()
        self.assertEqual(len(topic._parking), 0)  # full: each holds its own 5 and writes the rest
        self.assertEqual({len(c.memory) for c in channels}, {5})
        self.assertEqual({c.backend.depth() for c in channels}, {2})
        self.assertEqual({c.message_count for c in channels}, {7})
        for c in channels:
            self.assertEqual(sorted(self.read_all(c)), [b"%d" % i for i in range(1, 8)])

    def test_the_log_keeps_only_what_a_parked_channel_shares(self) -> None:
        """The log is trimmed to the oldest parked channel's share, and emptied with the last."""
        nsqd, topic = self.build()
        a = topic.get_channel("a")
        self.publish(b"1", b"2")
        b = topic.get_channel("b")  # parks at the next batch: shares from there on
        self.publish(b"3")
        parking = topic._parking
        self.assertEqual((parking.share(a), parking.share(b)), (3, 1))
        self.assertEqual(len(parking._log), 3)
        self.read_all(a)
        self.assertEqual(len(parking._log), 1)
        topic.delete_channel("b")
        self.settle()
        self.assertEqual((len(parking), len(parking._log)), (0, 0))
        self.publish(b"4")
        self.assertEqual(len(parking._log), 0)  # nobody parked: nothing kept

    def test_empty_and_delete_drop_only_that_channels_share(self) -> None:
        nsqd, topic = self.build()
        a, b, c = (topic.get_channel(n) for n in "abc")
        self.publish(b"1", b"2")
        a.empty()
        topic.delete_channel("c")
        self.settle()
        self.assertEqual((a.depth(), b.depth(), c.depth()), (0, 2, 0))
        self.assertEqual(a.message_count, 2)  # nsqd's count is of messages given, emptied or not
        self.publish(b"3")  # a parks again and shares what comes next
        self.assertTrue(topic._parking.is_parked(a))
        self.assertEqual(a.message_count, 3)
        self.assertEqual(self.read_all(a), [b"3"])
        self.assertEqual(self.read_all(b), [b"1", b"2", b"3"])

    def test_a_dpub_is_deferred_on_each_parked_channel(self) -> None:
        """A batch with a DPUB delay cannot wait in the log: the parked channels take it the usual way."""
        nsqd, topic = self.build()
        channels = [topic.get_channel(f"c{i}") for i in range(3)]
        self.publish(b"now")
        self.nsqd.publish("t", [b"later"], defer=5.0)
        self.settle()
        self.assertEqual({len(c.deferred) for c in channels}, {1})
        self.assertEqual({c.message_count for c in channels}, {2})
        self.publish(b"next")  # and they park again at the next batch
        self.assertEqual(len(topic._parking), 3)
        self.clock.advance(5.0)
        self.settle()
        self.assertEqual({c.message_count for c in channels}, {3})
        self.assertEqual(self.read_all(channels[0]), [b"now", b"next", b"later"])

    def test_a_graceful_stop_writes_every_parked_channels_share(self) -> None:
        topic = self.build_on_disk()
        channels = [topic.get_channel(f"c{i}") for i in range(5)]
        self.publish(b"1", b"2", b"3")
        self.assertEqual(len(topic._parking), 5)
        topic.close()
        self.settle()
        self.assertEqual([c.backend.depth() for c in channels], [3] * 5)

    def test_a_channel_with_a_client_is_not_parked(self) -> None:
        nsqd, topic = self.build()
        a = topic.get_channel("a")
        Reader.subscribe(a)
        self.publish(b"1")
        self.assertFalse(topic._parking.is_parked(a))
        self.assertEqual(len(a.memory), 1)
