"""Records a topic reads from its backend reach full channels still encoded (no decode, no encode)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from twisted.internet.task import Clock
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.core import topic as topic_module
from nsqtw.core.message import MSG_ID_LENGTH, Message, decode_message, decode_messages, record_id
from nsqtw.core.nsqd import NSQD
from nsqtw.core.topic import Topic
from nsqtw.protocol.wire import encode_command
from nsqtw.storage.diskqueue import DiskQueue
from nsqtw.storage.executor import SynchronousDiskExecutor
from nsqtw.storage.segments import nsqd_msg_size_limits
from tests.helpers import EPOCH, connect, decode_message_frame, make_nsqd, make_options, take_frames

BODIES = [b"%d" % i for i in range(10)]


def settle(clock: Clock, turns: int = 5) -> None:
    for _ in range(turns):
        clock.advance(0)


def backlog(nsqd: NSQD, clock: Clock, name: str = "t") -> Topic:
    """A topic holding BODIES: two in memory, eight in its backend (--mem-queue-size=2)."""
    nsqd.publish(name, list(BODIES))
    settle(clock)
    topic = nsqd.topics[name]
    assert (len(topic.memory), topic.backend.depth()) == (2, 8)
    return topic


def consume(nsqd: NSQD, clock: Clock, channel: str, rdy: int = 100) -> list[bytes]:
    """Every body a new consumer of ``t``/``channel`` gets now, FINed as they come."""
    proto, transport = connect(nsqd, clock)
    proto.dataReceived(encode_command(b"SUB", b"t", channel.encode()) + b"RDY %d\n" % rdy)
    bodies = []
    while True:
        settle(clock)
        got = [decode_message_frame(p) for t, p in take_frames(transport) if t == 2]
        if not got:
            proto.connectionLost(None)  # type: ignore[arg-type]
            settle(clock)
            return bodies
        for _, _, msg_id, body in got:
            bodies.append(body)
            proto.dataReceived(b"FIN " + msg_id + b"\n")


class DecodeCounter:
    """The records the topic decodes, one at a time or in runs, counted."""

    def __init__(self, test: SynchronousTestCase) -> None:
        self.calls = 0
        test.patch(topic_module, "decode_message", self)
        test.patch(topic_module, "decode_messages", self.run)

    def __call__(self, data: bytes) -> Message:
        self.calls += 1
        return decode_message(data)

    def run(self, records: list[bytes], bad: Callable[[ValueError], object]) -> list[Message]:
        self.calls += len(records)
        return decode_messages(records, bad)


class RawOverflowTests(SynchronousTestCase):
    def test_full_channel_gets_records_undecoded(self) -> None:
        """A channel whose memory queue has room for two gets two decoded messages; the other
        records go to its backend as the very bytes the topic read, never decoded or encoded."""
        nsqd, clock = make_nsqd(mem_queue_size=2)
        topic = backlog(nsqd, clock)
        read = list(topic.backend._records)  # type: ignore[attr-defined]
        decodes = DecodeCounter(self)
        channel = topic.get_channel("c")
        settle(clock)
        self.assertEqual(decodes.calls, 2)
        self.assertEqual(len(channel.memory), 2)
        held = list(channel.backend._records)  # type: ignore[attr-defined]
        self.assertEqual(len(held), 8)
        self.assertTrue(all(a is b for a, b in zip(held, read[2:], strict=False)))
        self.assertEqual((channel.message_count, channel.depth(), topic.depth()), (10, 10, 0))
        self.assertEqual(sorted(consume(nsqd, clock, "c"), key=int), BODIES)

    def test_every_channel_gets_every_message(self) -> None:
        """Two channels, one with an emptier memory queue than the other: each gets all ten. Past
        its own room each takes the very bytes the topic read, even those decoded for the other,
        and the topic's memory encoded once for both."""
        nsqd, clock = make_nsqd(mem_queue_size=4)
        nsqd.publish("t", list(BODIES))  # four in memory, six in the backend
        topic = nsqd.topics["t"]
        read = list(topic.backend._records)  # type: ignore[attr-defined]
        decodes = DecodeCounter(self)
        a, b = topic.get_channel("a"), topic.get_channel("b")
        b.memory.extend(Message(b"%016d" % i + b"old", 1) for i in range(3))  # room for one
        settle(clock)
        self.assertEqual(decodes.calls, 4)  # as many as a's memory takes
        self.assertEqual((len(a.memory), len(b.memory)), (4, 4))
        self.assertEqual((a.message_count, b.message_count), (10, 10))
        in_a = list(a.backend._records)  # type: ignore[attr-defined]
        in_b = list(b.backend._records)  # type: ignore[attr-defined]
        self.assertEqual((len(in_a), len(in_b)), (6, 9))
        self.assertTrue(all(x is y for x, y in zip(in_b[:5], read[1:], strict=True)))
        self.assertTrue(all(x is y for x, y in zip(in_a, in_b[3:], strict=True)))
        self.assertEqual(sorted(consume(nsqd, clock, "a"), key=int), BODIES)
        self.assertEqual(sorted(consume(nsqd, clock, "b")), sorted([b"old"] * 3 + BODIES))

    def test_restored_dpub_still_deferred(self) -> None:
        """A DPUB message read back after a restart (its ID in restored_due) is decoded and waits
        out its due time, even where the other records go to the backend undecoded."""
        nsqd, clock = make_nsqd(mem_queue_size=2)
        topic = backlog(nsqd, clock)
        late = topic.backend._records[6]  # type: ignore[attr-defined]
        topic.restored_due = {record_id(late): clock.seconds() + 60}
        decodes = DecodeCounter(self)
        channel = topic.get_channel("c")
        settle(clock)
        self.assertEqual(decodes.calls, 3)
        self.assertEqual((len(channel.deferred), channel.backend.depth(), topic.restored_due), (1, 7, {}))
        body = late[10 + MSG_ID_LENGTH:]
        self.assertEqual(sorted(consume(nsqd, clock, "c"), key=int), [b for b in BODIES if b != body])
        clock.advance(60)
        self.assertEqual(consume(nsqd, clock, "c"), [body])

    def test_dpub_from_memory_behind_records(self) -> None:
        """A DPUB message in the topic's memory, taken behind records no channel has room for,
        is still deferred; the plain ones beside it go to the backend."""
        nsqd, clock = make_nsqd(mem_queue_size=2)
        nsqd.publish("t", [b"later"], defer=30.0)
        nsqd.publish("t", list(BODIES[:9]))  # one in memory, eight in the backend
        topic = nsqd.topics["t"]
        channel = topic.get_channel("c")
        settle(clock)
        self.assertEqual((len(channel.deferred), len(channel.memory), channel.backend.depth()), (1, 2, 7))
        self.assertEqual(sorted(consume(nsqd, clock, "c"), key=int), BODIES[:9])
        clock.advance(30)
        self.assertEqual(consume(nsqd, clock, "c"), [b"later"])

    def test_bad_record_logged_and_skipped(self) -> None:
        """A record too short to be a message is logged as nsqd does ("failed to decode
        message") and skipped once, by the topic, even among records left undecoded."""
        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        nsqd, clock = make_nsqd(mem_queue_size=2)
        topic = backlog(nsqd, clock)
        topic.backend._records.insert(5, b"short")  # type: ignore[attr-defined]
        channel = topic.get_channel("c")
        settle(clock)
        errors = [formatEvent(e) for e in events if "decode" in formatEvent(e)]
        self.assertEqual(errors, ["TOPIC(t): failed to decode message - invalid message buffer size (5)"])
        self.assertEqual((channel.message_count, channel.depth()), (10, 10))
        self.assertNotIn(b"short", channel.backend._records)  # type: ignore[attr-defined]
        self.assertEqual(sorted(consume(nsqd, clock, "c"), key=int), BODIES)

    def test_bad_record_among_decoded_ones(self) -> None:
        """A bad record among those decoded for the emptier channel is logged once and skipped for
        both channels; the fuller one still gets every good record after its own room."""
        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        nsqd, clock = make_nsqd(mem_queue_size=4)
        nsqd.publish("t", list(BODIES))  # four in memory, six in the backend
        topic = nsqd.topics["t"]
        topic.backend._records.insert(1, b"short")  # type: ignore[attr-defined]
        a, b = topic.get_channel("a"), topic.get_channel("b")
        b.memory.extend(Message(b"%016d" % i + b"old", 1) for i in range(3))  # room for one
        settle(clock)
        errors = [formatEvent(e) for e in events if "decode" in formatEvent(e)]
        self.assertEqual(errors, ["TOPIC(t): failed to decode message - invalid message buffer size (5)"])
        self.assertEqual((a.message_count, b.message_count), (10, 10))
        self.assertEqual(sorted(consume(nsqd, clock, "a"), key=int), BODIES)
        self.assertEqual(sorted(consume(nsqd, clock, "b")), sorted([b"old"] * 3 + BODIES))

    def test_bad_record_where_the_room_ends(self) -> None:
        """A bad record skipped among the decoded ones leaves the batch one short of the room:
        the record after them still reaches the channel."""
        nsqd, clock = make_nsqd(mem_queue_size=6)
        topic = nsqd.get_topic("t")
        records = [Message(b"%016d" % i + body, 1).encode() for i, body in enumerate(BODIES[:6])]
        topic.backend.put_many(records[:1] + [b"short"] + records[1:])
        channel = topic.get_channel("c")  # room for six, seven records
        settle(clock)
        self.assertEqual((channel.message_count, channel.depth()), (6, 6))
        self.assertEqual(sorted(consume(nsqd, clock, "c"), key=int), BODIES[:6])

    def test_paused_channel(self) -> None:
        """A paused channel takes the records the same way and delivers them once unpaused."""
        nsqd, clock = make_nsqd(mem_queue_size=2)
        topic = backlog(nsqd, clock)
        channel = topic.get_channel("c")
        channel.pause()
        settle(clock)
        self.assertEqual(consume(nsqd, clock, "c"), [])
        self.assertEqual((channel.depth(), channel.backend.depth()), (10, 8))
        channel.unpause()
        self.assertEqual(sorted(consume(nsqd, clock, "c"), key=int), BODIES)

    def test_ephemeral_channel_drops_the_overflow(self) -> None:
        """An ephemeral channel counts every message and keeps what fits in memory, as before."""
        nsqd, clock = make_nsqd(mem_queue_size=2)
        topic = backlog(nsqd, clock)
        channel = topic.get_channel("c#ephemeral")
        settle(clock)
        self.assertEqual((channel.message_count, channel.depth(), topic.depth()), (10, 2, 0))


class DiskQueueOverflowTests(SynchronousTestCase):
    """The same hand-off between real disk queues, in both modes of nsqd's own flags."""

    def setUp(self) -> None:
        self.path = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.path)
        self.clock = Clock()
        self.clock.advance(EPOCH)

    def build(self, **overrides: Any) -> NSQD:
        options = make_options(mem_queue_size=0, **overrides)

        def backend(name: str) -> DiskQueue:
            lo, hi = nsqd_msg_size_limits(options.max_msg_size)
            return DiskQueue(name, self.path, 1 << 20, lo, hi, 2500, 2.0, self.clock, SynchronousDiskExecutor())

        return NSQD(options, self.clock, backend)

    def run_through(self, nsqd: NSQD) -> None:
        decodes = DecodeCounter(self)
        nsqd.publish("t", list(BODIES))
        topic = nsqd.topics["t"]
        channel = topic.get_channel("c")
        for _ in range(5):
            self.clock.advance(0.01)
            settle(self.clock)
        self.assertEqual(decodes.calls, 0)
        self.assertEqual((topic.depth(), channel.message_count, channel.depth()), (0, 10, 10))
        self.assertEqual(consume(nsqd, self.clock, "c"), BODIES)

    def test_buffered(self) -> None:
        """--mem-queue-size=0: every record reaches the channel's disk queue undecoded, and comes
        back from it whole."""
        self.run_through(self.build())

    def test_commit_after_write(self) -> None:
        """--sync-every=1 too; the topic's read position passes the records once the channel wrote them."""
        nsqd = self.build(sync_every=1)
        self.run_through(nsqd)
        self.assertEqual(nsqd.topics["t"].backend._committed_total, 10)  # type: ignore[attr-defined]
