"""A topic's hand-off to many channels: in bounded slices per pump step, every copy in order, each mode.

Socket-free: a task.Clock, synchronous disk jobs. The slice bound is patched
small (``HANDOFF_SLICE``) so a few dozen channels need several steps. The
channels here have a subscribed client that takes nothing (RDY 0), so each
takes its copies one by one: a channel without clients shares the topic's
(tests/unit/test_parking.py).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.core import handoff
from nsqtw.core.channel import Channel
from nsqtw.core.message import Message
from nsqtw.core.nsqd import NSQD
from nsqtw.core.topic import Topic
from nsqtw.storage.diskqueue import DiskQueue
from nsqtw.storage.durable import DurableDelivery
from nsqtw.storage.executor import SynchronousDiskExecutor
from nsqtw.storage.journal import Journal, journal_path, replay
from nsqtw.storage.segments import nsqd_msg_size_limits
from tests.helpers import EPOCH, make_options
from tests.unit.test_parking import Reader

CHANNELS = 40
MESSAGES = 30
SLICE = 200


class FanoutCase(SynchronousTestCase):
    """A node on a task.Clock with synchronous disk jobs, and what its tests ask of it."""

    def setUp(self) -> None:
        self.path = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.path)
        self.clock = Clock()
        self.clock.advance(EPOCH)
        self.patch(handoff, "HANDOFF_SLICE", SLICE)

    def disk(self, options: Any, durable: bool = False) -> Callable[[str], DiskQueue]:
        lo, hi = nsqd_msg_size_limits(options.max_msg_size)

        def backend(name: str) -> DiskQueue:
            return DiskQueue(name, self.path, 1 << 20, lo, hi, options.sync_every, 0, self.clock,
                             SynchronousDiskExecutor(), durable=durable, unwritten=self.nsqd.unwritten)
        return backend

    def build(self, mode: str) -> NSQD:
        if mode == "buffered":
            self.nsqd = NSQD(make_options(), self.clock)
        elif mode == "overflow":  # --mem-queue-size past which every channel writes to its disk
            options = make_options(mem_queue_size=7)
            self.nsqd = NSQD(options, self.clock, self.disk(options))
        elif mode == "commit-after-write":
            options = make_options(sync_every=1, mem_queue_size=0)
            self.nsqd = NSQD(options, self.clock, self.disk(options, durable=True))
        else:
            options = make_options(durable_delivery=True)

            def journal(name: str) -> Journal:
                return Journal(name, self.path, self.clock, SynchronousDiskExecutor(),
                               replay(journal_path(self.path, name)))
            self.nsqd = NSQD(options, self.clock, self.disk(options, durable=True),
                             DurableDelivery(journal, options.sync_every))
        return self.nsqd

    def settle(self) -> None:
        for _ in range(10):
            self.clock.advance(0)

    def watch_steps(self, topic: Topic) -> list[int]:
        """The channel copies each pump step of ``topic`` made, as it makes them."""
        steps: list[int] = []
        pump = topic._pump
        drain = pump._drain

        def counted() -> bool:
            before = sum(c.message_count for c in topic.channels.values())
            more = drain()
            steps.append(sum(c.message_count for c in topic.channels.values()) - before)
            return more
        pump._drain = counted
        return steps

    def first_slice(self, nsqd: NSQD) -> Topic:
        """Topic ``t`` with CHANNELS channels, MESSAGES published and only the first step handed off."""
        topic = nsqd.get_topic("t")
        for i in range(CHANNELS):
            Reader.subscribe(topic.get_channel(f"c{i}"))
        self.settle()
        nsqd.publish("t", [b"m%03d" % i for i in range(MESSAGES)])
        topic.distribute()  # the first slice only (the pump's turn has not come)
        return topic

    def drain(self, channel: Channel) -> list[Message]:
        """Everything the channel would deliver, in order."""
        out: list[Message] = []
        for _ in range(50):
            out.extend(channel.next_messages(1000))
            self.settle()
        return out

    def fan_out(self, mode: str, names: list[str], ordered: bool = True) -> tuple[list[int], dict[str, list[Message]]]:
        nsqd = self.build(mode)
        topic = nsqd.get_topic("t")
        for name in names:
            Reader.subscribe(topic.get_channel(name))
        self.settle()
        steps = self.watch_steps(topic)
        bodies = [b"m%03d" % i for i in range(MESSAGES)]
        nsqd.publish("t", bodies[:10])  # an MPUB,
        for body in bodies[10:]:  # then PUBs in the same turn
            nsqd.publish("t", [body])
        self.settle()
        got = {name: self.drain(topic.channels[name]) for name in names}
        for name, msgs in got.items():
            self.assertEqual([m.body for m in msgs] if ordered else sorted(m.body for m in msgs), bodies, name)
        return steps, got

    def check(self, mode: str, names: list[str], ordered: bool = True) -> None:
        steps, got = self.fan_out(mode, names, ordered)
        self.assertEqual(sum(steps), MESSAGES * len(names))
        self.assertLessEqual(max(steps), SLICE, steps)
        self.assertGreater(len([s for s in steps if s]), 1, steps)  # it took several steps
        # every channel delivers objects of its own (a DPUB, attempts, in-flight state are per channel)
        objects = [id(m) for msgs in got.values() for m in msgs]
        self.assertEqual(len(set(objects)), len(objects))


class FanoutTests(FanoutCase):
    def test_buffered(self) -> None:
        """Default mode: copies in slices of at most HANDOFF_SLICE per step, all of them, in order,
        on plain, ephemeral and paused channels alike."""
        names = [f"c{i}" for i in range(CHANNELS - 2)] + ["e#ephemeral", "paused"]
        nsqd = self.build("buffered")
        nsqd.get_topic("t").get_channel("paused").pause()
        self.check("buffered", names)

    def test_a_pub_reaches_at_most_handoff_channels_a_step(self) -> None:
        """One message to many channels: however few copies that is, a step reaches at most
        HANDOFF_CHANNELS channels; every channel gets every PUB once, in order."""
        self.patch(handoff, "HANDOFF_CHANNELS", 7)
        nsqd = self.build("buffered")
        topic = nsqd.get_topic("t")
        names = [f"c{i}" for i in range(CHANNELS)]
        for name in names:
            Reader.subscribe(topic.get_channel(name))
        self.settle()
        steps = self.watch_steps(topic)
        for i in range(3):
            nsqd.publish("t", [b"p%d" % i])
            self.settle()
        self.assertEqual(steps, [7, 7, 7, 7, 7, 5] * 3)
        for name in names:
            self.assertEqual([m.body for m in self.drain(topic.channels[name])], [b"p0", b"p1", b"p2"], name)

    def test_channel_memory_overflows_to_disk(self) -> None:
        """--mem-queue-size=7: each channel keeps 7 in memory and writes the rest; each gets every one once.

        (A channel delivers from its disk queue before its memory, as nsqd
        does: there is no order across the two.)
        """
        self.check("overflow", [f"c{i}" for i in range(CHANNELS)], ordered=False)

    def test_commit_after_write(self) -> None:
        """--sync-every=1: sliced too, and the topic's read position is committed once all have it."""
        self.check("commit-after-write", [f"c{i}" for i in range(CHANNELS)])
        topic = self.nsqd.topics["t"]
        self.assertEqual(topic.backend.depth(), 0)

    def test_durable_delivery(self) -> None:
        """--durable-delivery: sliced, every durable channel gets every message in order."""
        self.check("durable", [f"c{i}" for i in range(CHANNELS)])

    def test_a_channel_deleted_during_a_handoff_is_skipped(self) -> None:
        """A channel deleted between two steps of a hand-off gets nothing more; the others get it all."""
        topic = self.first_slice(self.build("buffered"))
        last = topic.channels[f"c{CHANNELS - 1}"]
        self.assertEqual(last.depth(), 0)
        topic.delete_channel(last.name)
        self.settle()
        self.assertEqual(last.depth(), 0)
        self.assertEqual(sorted(c.depth() for c in topic.channels.values()), [MESSAGES] * (CHANNELS - 1))

    def test_close_finishes_a_handoff_under_way(self) -> None:
        """A graceful stop in the middle of a hand-off gives the rest of the channels their copies first."""
        options = make_options()
        self.nsqd = NSQD(options, self.clock, self.disk(options))
        topic = self.first_slice(self.nsqd)
        channels = list(topic.channels.values())
        self.assertEqual(channels[-1].depth(), 0)
        topic.close()
        self.settle()
        self.assertEqual([c.backend.depth() for c in channels], [MESSAGES] * CHANNELS)

    def test_a_dpub_is_deferred_on_every_channel_on_its_own(self) -> None:
        """A DPUB shared by many channels: each defers its own copy, due at the same time."""
        nsqd = self.build("buffered")
        topic = nsqd.get_topic("t")
        for i in range(CHANNELS):
            topic.get_channel(f"c{i}")
        self.settle()
        nsqd.publish("t", [b"later"], defer=5.0)
        self.settle()
        deferred = [m for c in topic.channels.values() for m in c.deferred.live.values()]
        self.assertEqual(len(deferred), CHANNELS)
        self.assertEqual(len({id(m) for m in deferred}), CHANNELS)
        self.assertEqual({m.deadline for m in deferred}, {EPOCH + 5.0})


class SpillTests(FanoutCase):
    """Full channels without clients: the copies of one PUB after another gather in the topic for
    SPILL_INTERVAL and reach each disk queue in one ``put_many``."""

    def setUp(self) -> None:
        super().setUp()
        options = make_options(mem_queue_size=40)
        self.nsqd = NSQD(options, self.clock, self.disk(options))
        self.topic = self.nsqd.get_topic("t")
        self.names = [f"c{i}" for i in range(5)]
        for name in self.names:
            self.topic.get_channel(name)
        self.settle()
        self.bodies: list[bytes] = []
        self.publish(40)  # each channel's memory queue is full,
        self.publish(1)  # and that one went to the disk queues
        self.settle()
        self.puts = {name: self.count_puts(self.topic.channels[name]) for name in self.names}

    def publish(self, n: int) -> None:
        bodies = [b"m%03d" % (len(self.bodies) + i) for i in range(n)]
        self.bodies.extend(bodies)
        self.nsqd.publish("t", bodies)

    def count_puts(self, channel: Channel) -> list[int]:
        """The size of each ``put_many`` the channel's disk queue gets from now on."""
        sizes: list[int] = []
        put_many = channel.backend.put_many

        def counted(records: Any) -> None:
            records = list(records)
            sizes.append(len(records))
            put_many(records)
        self.patch(channel.backend, "put_many", counted)
        return sizes

    def depths(self) -> list[int]:
        return [self.topic.channels[name].depth() for name in self.names]

    def test_pubs_gather_for_the_interval(self) -> None:
        """Ten PUBs within the interval: no hand-off, then one put_many of ten a channel; none lost."""
        for _ in range(10):
            self.publish(1)
            self.settle()
        self.assertEqual(self.depths(), [41] * 5)
        self.assertEqual(self.topic.in_memory(), 10)
        self.clock.advance(handoff.SPILL_INTERVAL)
        self.settle()
        self.assertEqual(self.depths(), [51] * 5)
        self.assertEqual(self.puts, {name: [10] for name in self.names})
        for name in self.names:
            self.assertEqual(sorted(m.body for m in self.drain(self.topic.channels[name])), self.bodies, name)

    def test_a_topic_memory_half_full_hands_off_at_once(self) -> None:
        """The gathered messages never fill the topic's memory queue: at half of it the pump runs now."""
        for _ in range(19):
            self.publish(1)
        self.settle()
        self.assertEqual(self.depths(), [41] * 5)
        self.publish(1)  # 20 of --mem-queue-size=40
        self.settle()
        self.assertEqual(self.depths(), [61] * 5)
        self.assertEqual(self.puts, {name: [20] for name in self.names})
        self.assertEqual(self.topic.in_memory(), 0)

    def test_a_client_ends_the_gathering_at_the_next_batch(self) -> None:
        """Once a channel has a client, the batch after it sees so, and each PUB is handed off at once."""
        Reader.subscribe(self.topic.channels["c0"])
        self.publish(1)  # the last batch said "spill only": this one waits for the interval,
        self.settle()
        self.assertEqual(self.depths(), [41] * 5)
        self.clock.advance(handoff.SPILL_INTERVAL)
        self.settle()
        self.publish(1)  # and is the batch that sees the client
        self.settle()
        self.assertEqual(self.depths(), [43] * 5)
        self.assertEqual(self.puts, {name: [1, 1] for name in self.names})

    def test_a_stop_flushes_what_gathered(self) -> None:
        """A graceful stop while PUBs gather: they are in the topic's memory, so in its disk queue after."""
        for _ in range(5):
            self.publish(1)
        self.settle()
        topic = self.topic
        topic.close()
        self.settle()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(topic.backend.depth(), 5)
        self.assertEqual([topic.channels[name].backend.depth() for name in self.names], [41] * 5)
