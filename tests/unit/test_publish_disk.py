"""PUB over disk-backed queues: answered after the write, E_PUB_FAILED when the disk fails."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.core.message import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, decode_message
from nsqtw.core.nsqd import NSQD
from nsqtw.errors import BackendError
from nsqtw.protocol.wire import encode_command, encode_mpub
from nsqtw.storage.diskqueue import DiskQueue
from nsqtw.storage.executor import SynchronousDiskExecutor
from nsqtw.storage.segments import nsqd_msg_size_limits
from tests.helpers import EPOCH, ManualExecutor, connect, make_options, take_frames


class FlakyDisk:
    """os.write that fails with ENOSPC while ``full`` is set."""

    def __init__(self) -> None:
        self.full = False

    def write(self, fd: int, data: object) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, "no space left on device")
        return os.write(fd, data)  # type: ignore[arg-type]


class DiskPublishTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.path = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.path)
        self.clock = Clock()
        self.clock.advance(EPOCH)
        self.disk = FlakyDisk()
        self.executor: SynchronousDiskExecutor = SynchronousDiskExecutor()

    def build(self, **overrides: object) -> None:
        options = make_options(**{"mem_queue_size": 0, **overrides})

        def backend(name: str) -> DiskQueue:
            lo, hi = nsqd_msg_size_limits(options.max_msg_size)
            return DiskQueue(name, self.path, 1 << 20, lo, hi, 1, 2.0, self.clock,
                             self.executor, write_fn=self.disk.write)

        self.nsqd = NSQD(options, self.clock, backend)

    def settle(self) -> None:
        for _ in range(5):
            self.clock.advance(0)

    def test_ok_only_after_the_write(self) -> None:
        """With --sync-every=1 a PUB that spills to disk is answered once it is written."""
        self.executor = ManualExecutor()
        self.build(sync_every=1)
        p, t = connect(self.nsqd, self.clock)
        p.dataReceived(encode_command(b"PUB", b"t", body=b"x") + b"NOP\n")
        self.settle()
        self.assertEqual(len(self.executor.jobs), 2)  # the queue's load and the write, not yet run
        self.assertEqual(take_frames(t), [])
        self.assertEqual(t.producerState, "paused")
        self.executor.run()  # load and write
        self.settle()
        self.assertEqual(take_frames(t), [(FRAME_TYPE_RESPONSE, b"OK")])
        self.assertEqual(t.producerState, "producing")

    def test_ok_on_hand_off_by_default(self) -> None:
        """With default flags a PUB is answered once handed to the disk thread, before the write."""
        self.executor = ManualExecutor()
        self.build()
        p, t = connect(self.nsqd, self.clock)
        p.dataReceived(encode_command(b"PUB", b"t", body=b"x"))
        self.settle()
        self.assertEqual(take_frames(t), [(FRAME_TYPE_RESPONSE, b"OK")])
        self.assertEqual(self.nsqd.topics["t"].backend.backlog(), 1)

    def test_publisher_waits_when_disk_falls_behind(self) -> None:
        """Past BACKLOG_LIMIT unwritten records, publishers wait for the disk (backpressure), checked
        before the data is accepted: the MPUB that crosses the bound is answered, the next one waits
        unread and is taken only once there is room."""
        from nsqtw.core.handoff import BACKLOG_LIMIT
        from nsqtw.protocol.wire import encode_mpub
        self.executor = ManualExecutor()
        self.build()
        p, t = connect(self.nsqd, self.clock)
        batch = [b"m"] * 1000
        for _ in range(BACKLOG_LIMIT // 1000 + 1):
            p.dataReceived(encode_mpub(b"t", batch))
        self.settle()
        self.assertEqual(len(take_frames(t)), BACKLOG_LIMIT // 1000 + 1)
        backend = self.nsqd.topics["t"].backend
        self.assertEqual(backend.backlog(), BACKLOG_LIMIT + 1000)
        p.dataReceived(encode_mpub(b"t", batch))
        self.settle()
        self.assertEqual(take_frames(t), [])
        self.assertEqual(t.producerState, "producing")  # nothing more came: no pause to pay for
        p.dataReceived(b"NOP\n")
        self.assertEqual(t.producerState, "paused")  # more came: it is kept, nothing more read
        self.assertEqual(backend.backlog(), BACKLOG_LIMIT + 1000)  # not accepted meanwhile
        self.executor.run()
        self.settle()
        self.executor.run()
        self.settle()
        self.assertEqual(take_frames(t), [(FRAME_TYPE_RESPONSE, b"OK")])
        self.assertEqual(t.producerState, "producing")

    def test_publisher_waits_when_disk_falls_behind_in_bytes(self) -> None:
        """Past BACKLOG_BYTES unwritten bytes, publishers wait too: large messages cannot pile up
        10,000 deep (16 KiB ones would hold 160 MiB)."""
        from nsqtw.core.handoff import BACKLOG_BYTES
        from nsqtw.protocol.wire import encode_mpub
        self.executor = ManualExecutor()
        self.build(max_msg_size=1 << 20, max_body_size=8 << 20)
        p, t = connect(self.nsqd, self.clock)
        batch = [b"m" * (64 * 1024)] * 16  # 1 MiB per MPUB, far fewer records than BACKLOG_LIMIT
        answered = BACKLOG_BYTES // (1 << 20)  # the 16th crosses the bound (26-byte headers)
        for _ in range(answered):
            p.dataReceived(encode_mpub(b"t", batch))
        self.settle()
        self.assertEqual(len(take_frames(t)), answered)
        backend = self.nsqd.topics["t"].backend
        before = backend.backlog_bytes()
        self.assertGreater(before, BACKLOG_BYTES)
        p.dataReceived(encode_mpub(b"t", batch) + b"NOP\n")
        self.settle()
        self.assertEqual(take_frames(t), [])
        self.assertEqual(t.producerState, "paused")  # more than the waiting MPUB came: read no further
        self.assertEqual(backend.backlog_bytes(), before)
        for _ in range(3):
            self.executor.run()
            self.settle()
        self.assertEqual(take_frames(t), [(FRAME_TYPE_RESPONSE, b"OK")])
        self.assertEqual(t.producerState, "producing")
        self.assertLess(backend.backlog_bytes(), 2 << 20)  # only the MPUB taken after the wait

    def test_an_mpub_past_the_memory_queue_is_split_between_memory_and_disk(self) -> None:
        """The messages that fit in --mem-queue-size stay in memory as messages; the rest go
        to the disk queue as records made straight from IDs and bodies: the same IDs in
        order, the publish's timestamp, attempts 0, and the topic's counts cover all."""
        self.build(mem_queue_size=2)
        p, t = connect(self.nsqd, self.clock)
        bodies = [b"m%d" % i for i in range(5)]
        p.dataReceived(encode_mpub(b"t", bodies))
        self.settle()
        self.assertEqual(take_frames(t), [(FRAME_TYPE_RESPONSE, b"OK")])
        topic = self.nsqd.topics["t"]
        self.assertEqual([m.body for m in topic.memory], bodies[:2])
        self.assertEqual([m.attempts for m in topic.memory], [0, 0])
        self.clock.advance(1)  # the flush
        records = topic.backend.read(10)
        on_disk = [decode_message(r) for r in records]
        self.assertEqual([m.body for m in on_disk], bodies[2:])
        self.assertEqual({(m.timestamp, m.attempts) for m in on_disk},
                         {(topic.memory[0].timestamp, 0)})
        ids = [m.id for m in topic.memory] + [m.id for m in on_disk]
        self.assertEqual([int(i, 16) for i in ids], list(range(int(ids[0], 16), int(ids[0], 16) + 5)))
        self.assertEqual((topic.message_count, topic.message_bytes), (5, 10))

    def test_a_publish_the_backend_refuses_leaves_nothing_behind(self) -> None:
        """A batch is taken whole or not at all: when the backend refuses the part past
        the memory queue, E_MPUB_FAILED, and neither memory nor the counts took any of it."""
        self.build(mem_queue_size=2)
        p, t = connect(self.nsqd, self.clock)
        p.dataReceived(encode_command(b"PUB", b"t", body=b"first"))
        self.settle()
        topic = self.nsqd.topics["t"]

        def refuse(records: object) -> None:
            raise BackendError("exiting")

        topic.backend.put_many = refuse  # type: ignore[method-assign]
        p.dataReceived(encode_mpub(b"t", [b"a", b"b", b"c"]))
        self.settle()
        [(ftype, data)] = take_frames(t)[1:]
        self.assertEqual((ftype, data), (FRAME_TYPE_ERROR, b"E_MPUB_FAILED MPUB failed exiting"))
        self.assertEqual([m.body for m in topic.memory], [b"first"])
        self.assertEqual((topic.message_count, topic.message_bytes), (1, 5))
        self.flushLoggedErrors()

    def test_a_pub_the_backend_refuses_leaves_nothing_behind(self) -> None:
        """A PUB past the memory queue goes to the backend alone (``put``); refused, it is
        E_PUB_FAILED, and the topic counts nothing of it."""
        self.build(mem_queue_size=1)
        p, t = connect(self.nsqd, self.clock)
        p.dataReceived(encode_command(b"PUB", b"t", body=b"first"))
        self.settle()
        topic = self.nsqd.topics["t"]
        put = []
        topic.backend.put = put.append  # type: ignore[method-assign]
        p.dataReceived(encode_command(b"PUB", b"t", body=b"second"))
        self.settle()
        self.assertEqual([r[26:] for r in put], [b"second"])

        def refuse(record: object) -> None:
            raise BackendError("exiting")

        topic.backend.put = refuse  # type: ignore[method-assign]
        p.dataReceived(encode_command(b"PUB", b"t", body=b"third"))
        self.settle()
        self.assertEqual(take_frames(t)[2:], [(FRAME_TYPE_ERROR, b"E_PUB_FAILED PUB failed exiting")])
        self.assertEqual([m.body for m in topic.memory], [b"first"])
        self.assertEqual((topic.message_count, topic.message_bytes), (2, 11))
        self.flushLoggedErrors()

    def test_disk_full_then_recovered(self) -> None:
        """ENOSPC with --sync-every=1: E_PUB_FAILED (the write failed) and NOK health; the records stay
        queued for the retry; space back: the retry writes them, PUB works, nothing lost."""
        self.build(sync_every=1)
        p, t = connect(self.nsqd, self.clock)
        p.dataReceived(encode_command(b"PUB", b"t", body=b"before"))
        self.settle()
        self.assertEqual(take_frames(t), [(FRAME_TYPE_RESPONSE, b"OK")])
        self.disk.full = True
        p.dataReceived(encode_command(b"PUB", b"t", body=b"during"))
        self.settle()
        [(ftype, data)] = take_frames(t)
        self.assertEqual(ftype, FRAME_TYPE_ERROR)
        self.assertTrue(data.startswith(b"E_PUB_FAILED PUB failed"), data)
        self.assertTrue(self.nsqd.health().startswith("NOK - "), self.nsqd.health())
        p2, t2 = connect(self.nsqd, self.clock)
        p2.dataReceived(encode_command(b"PUB", b"t", body=b"refused"))
        self.settle()
        self.clock.advance(1.0)  # the retry fails again
        self.settle()
        self.assertTrue(take_frames(t2)[0][1].startswith(b"E_PUB_FAILED"))
        self.disk.full = False
        self.clock.advance(1.0)
        self.settle()
        self.assertEqual(self.nsqd.health(), "OK")
        self.assertEqual(self.nsqd.topics["t"].backend.backlog(), 0)
        p3, t3 = connect(self.nsqd, self.clock)
        p3.dataReceived(encode_command(b"PUB", b"t", body=b"after"))
        self.settle()
        self.assertEqual(take_frames(t3), [(FRAME_TYPE_RESPONSE, b"OK")])
        topic = self.nsqd.topics["t"]
        self.assertEqual(topic.backend.depth(), 4)  # before, during and refused (kept for retry), after

    def test_topic_holds_messages_while_a_channel_disk_is_behind(self) -> None:
        """A channel whose disk is BACKLOG_LIMIT records behind gets no more until it catches up.

        The rest waits in the topic's own queue, whose backlog paces the
        publishers: a slow channel disk cannot grow the daemon's memory.
        """
        from nsqtw.core.handoff import BACKLOG_LIMIT, TOPIC_BATCH
        from nsqtw.protocol.wire import encode_mpub
        held = ManualExecutor()  # the channel's disk thread, run only when the test says so
        options = make_options(mem_queue_size=0)

        def backend(name: str) -> DiskQueue:
            lo, hi = nsqd_msg_size_limits(options.max_msg_size)
            executor = held if ":" in name else SynchronousDiskExecutor()
            # as the daemon makes them: each queue counts its backlog in the node's total
            return DiskQueue(name, self.path, 1 << 20, lo, hi, 2500, 2.0, self.clock, executor,
                             unwritten=self.nsqd.unwritten)

        self.nsqd = NSQD(options, self.clock, backend)
        topic = self.nsqd.get_topic("t")
        channel = topic.get_channel("c")
        held.run()  # the channel queue's load
        p, t = connect(self.nsqd, self.clock)
        total = 3 * BACKLOG_LIMIT
        for _ in range(total // 1000):
            p.dataReceived(encode_mpub(b"t", [b"m"] * 1000))
            self.settle()
        self.assertEqual(len(take_frames(t)), total // 1000)
        self.assertLessEqual(channel.backend.backlog(), BACKLOG_LIMIT + TOPIC_BATCH)
        self.assertGreater(topic.depth(), 0)
        for _ in range(20):
            held.run()
            self.clock.advance(0.01)  # the disk queue hands writes over at most once a millisecond
            self.settle()
        self.assertEqual(topic.depth(), 0)
        self.assertEqual(channel.depth(), total)
        self.assertEqual(channel.backend.backlog(), 0)

    def test_sync_every_1_topic_read_position_waits_for_channel_writes(self) -> None:
        """With --sync-every=1 the topic's read position passes a message only once every channel
        has written it: a kill -9 between the two cannot lose an acknowledged message."""
        held = ManualExecutor()  # the channel's disk thread, run only when the test says so
        options = make_options(mem_queue_size=0, sync_every=1)

        def backend(name: str) -> DiskQueue:
            lo, hi = nsqd_msg_size_limits(options.max_msg_size)
            executor = held if ":" in name else SynchronousDiskExecutor()
            return DiskQueue(name, self.path, 1 << 20, lo, hi, 1, 2.0, self.clock, executor)

        self.nsqd = NSQD(options, self.clock, backend)
        topic = self.nsqd.get_topic("t")
        channel = topic.get_channel("c")
        held.run()  # the channel queue's load
        p, t = connect(self.nsqd, self.clock)
        p.dataReceived(encode_command(b"PUB", b"t", body=b"acked"))
        for _ in range(3):
            self.clock.advance(0.01)
            self.settle()
        self.assertEqual(take_frames(t), [(FRAME_TYPE_RESPONSE, b"OK")])
        self.assertEqual(channel.backend.backlog(), 1)  # copied to the channel, not yet written there
        # a crash now: the topic's queue on disk must still hold the message
        meta = os.path.join(self.path, "t.diskqueue.meta.dat")
        with open(meta) as f:
            self.assertEqual(f.read().split("\n")[0], "1")
        held.run()  # the channel writes it
        for _ in range(3):
            self.clock.advance(0.01)
            self.settle()
        self.assertEqual(channel.backend.backlog(), 0)
        topic.backend.put(b"x" * 26)  # any later disk job persists the committed read position
        for _ in range(3):
            self.clock.advance(0.01)
            self.settle()
        with open(meta) as f:
            self.assertEqual(f.read().split("\n")[0], "1")  # the first one consumed, the new one queued


class DiskFullHandoffTests(SynchronousTestCase):
    """Issue #15 item 1: a disk that fills during the topic → channel hand-off, a timeout
    requeue or a client's disconnect loses nothing; the work waits in memory and is written,
    in order, once the disk accepts again."""

    def setUp(self) -> None:
        self.path = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.path)
        self.clock = Clock()
        self.clock.advance(EPOCH)
        self.disk = FlakyDisk()
        options = make_options(mem_queue_size=0)

        def backend(name: str) -> DiskQueue:
            lo, hi = nsqd_msg_size_limits(options.max_msg_size)
            return DiskQueue(name, self.path, 1 << 16, lo, hi, 2500, 2.0, self.clock,
                             SynchronousDiskExecutor(), write_fn=self.disk.write)

        self.nsqd = NSQD(options, self.clock, backend)

    def settle(self, seconds: float = 0.0) -> None:
        for _ in range(5):
            self.clock.advance(seconds / 5)
            self.clock.advance(0)

    def test_handoff_waits_for_the_disk(self) -> None:
        """Topic paused with 3,000 acknowledged messages, the disk fills, the topic is unpaused:
        health is NOK with the error, nothing is dropped; space back: all 3,000 reach the channel
        in order and health is OK."""
        from nsqtw.core.handoff import BACKLOG_LIMIT
        topic = self.nsqd.get_topic("full")
        channel = topic.get_channel("c")
        topic.pause()
        bodies = [b"%05d" % i + b"x" * 1000 for i in range(3000)]
        for i in range(0, 3000, 100):
            self.assertIsNone(self.nsqd.publish("full", bodies[i:i + 100]))
            self.settle(0.01)
        self.assertEqual(topic.backend.backlog(), 0)
        self.assertEqual(topic.depth(), 3000)
        self.disk.full = True
        topic.unpause()
        self.settle(3.0)
        self.assertTrue(self.nsqd.health().startswith("NOK - "), self.nsqd.health())
        self.assertIn("no space left on device", self.nsqd.health())
        self.assertEqual(topic.depth() + channel.depth(), 3000)
        self.assertLessEqual(channel.backend.backlog(), BACKLOG_LIMIT + 8192)
        self.disk.full = False
        self.settle(3.0)
        self.assertEqual(self.nsqd.health(), "OK")
        self.assertEqual(channel.depth(), 3000)
        got = []
        while channel.depth():
            got.extend(m.body for m in channel.next_messages(500))
            self.settle(0.01)
        self.assertEqual(got, bodies)

    def test_deleting_a_failing_channel_clears_the_nodes_health(self) -> None:
        """The node's health follows what its queues report as it happens: a channel whose disk
        write fails makes it NOK; deleting that channel makes it OK again at once."""
        topic = self.nsqd.get_topic("gone")
        topic.get_channel("c")
        topic.pause()
        self.nsqd.publish("gone", [b"x" * 100] * 50)
        self.settle(0.01)
        self.disk.full = True
        topic.unpause()
        self.settle(1.0)
        self.assertIn("no space left on device", self.nsqd.health())
        self.assertFalse(self.nsqd.is_healthy())
        self.disk.full = False  # only so the topic's own queue can go; the channel's error stays until its retry
        self.successResultOf(topic.delete_channel("c"))
        self.settle(0.01)
        self.assertEqual(self.nsqd.health(), "OK")

    def test_health_does_not_ask_every_queue(self) -> None:
        """``health()`` is O(1): it never walks the topics and channels (a /ping on a node with
        10,000 channels took 18 ms of the reactor when it did)."""
        from nsqtw.core.channel import Channel
        from nsqtw.core.topic import Topic
        for i in range(20):
            self.nsqd.get_topic(f"t{i}").get_channel("c")

        def walked(self: object) -> None:
            raise AssertionError("health() asked a topic or channel")

        self.patch(Topic, "health", walked)
        self.patch(Channel, "health", walked)
        self.assertEqual(self.nsqd.health(), "OK")
        self.assertTrue(self.nsqd.is_healthy())

    def test_timeouts_and_disconnect_requeue_wait_for_the_disk(self) -> None:
        """Messages that time out, and a disconnected client's in-flight ones, go back to a
        channel whose disk is full: kept for the retry, delivered again once it has room."""
        from tests.helpers import decode_message_frame, read_frames
        topic = self.nsqd.get_topic("t")
        topic.get_channel("c")
        for i in range(10):
            self.nsqd.publish("t", [b"m%d" % i])
        self.settle(0.01)
        p, t = connect(self.nsqd, self.clock)
        p.dataReceived(encode_command(b"SUB", b"t", b"c") + encode_command(b"RDY", b"10"))
        self.settle(0.01)
        channel = topic.channels["c"]
        self.assertEqual(len(channel.in_flight), 10)
        t.clear()
        self.disk.full = True
        self.clock.advance(61)  # every one times out (msg_timeout 60 s) into the full disk
        self.settle(0.01)
        self.assertEqual(channel.timeout_count, 10)
        self.assertEqual(channel.depth() + len(channel.in_flight), 10)
        p.connectionLost(None)  # type: ignore[arg-type]
        self.settle(2.0)
        self.assertEqual(channel.depth(), 10)
        self.assertTrue(self.nsqd.health().startswith("NOK - "))
        self.disk.full = False
        self.settle(2.0)
        self.assertEqual(self.nsqd.health(), "OK")
        p2, t2 = connect(self.nsqd, self.clock)
        p2.dataReceived(encode_command(b"SUB", b"t", b"c") + encode_command(b"RDY", b"20"))
        self.settle(0.01)
        bodies = sorted(decode_message_frame(data)[3] for ftype, data in read_frames(t2.value()) if ftype == 2)
        self.assertEqual(bodies, sorted(b"m%d" % i for i in range(10)))


class NodeWideBoundTests(SynchronousTestCase):
    """Issue #15 item 6: the bound on memory waiting for the disks is the node's, not each
    queue's: many topics each under their own bound cannot together hold more than
    ``--max-unwritten-bytes``, checked before a publish is accepted, for every topic."""

    LIMIT = 64 * 1024

    def setUp(self) -> None:
        self.path = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.path)
        self.clock = Clock()
        self.clock.advance(EPOCH)
        self.executor = ManualExecutor()
        options = make_options(mem_queue_size=0, max_unwritten_bytes=self.LIMIT)

        def backend(name: str) -> DiskQueue:
            lo, hi = nsqd_msg_size_limits(options.max_msg_size)
            return DiskQueue(name, self.path, 1 << 20, lo, hi, 2500, 2.0, self.clock,
                             self.executor, unwritten=self.nsqd.unwritten)

        self.nsqd = NSQD(options, self.clock, backend)

    def settle(self) -> None:
        for _ in range(5):
            self.clock.advance(0)

    def test_publishers_of_other_topics_wait_at_the_node_bound(self) -> None:
        """Ten topics, each far under its own bound, fill the node's: the next MPUB, to a topic with
        nothing unwritten, is not taken (and its publisher not read further) until writes bring the
        node back under the bound; then it is taken and answered."""
        from nsqtw.protocol.wire import encode_mpub
        p, t = connect(self.nsqd, self.clock)
        batch = [b"m" * 1000] * 8  # 8,208 bytes a publish as records (26-byte headers)
        crossing = self.LIMIT // (8 * 1026) + 1  # the publish that takes the node over its bound
        for i in range(crossing + 1):
            p.dataReceived(encode_mpub(b"t%d" % i, batch))
        self.settle()
        self.assertEqual(len(take_frames(t)), crossing)  # the next one waits
        unwritten = self.nsqd.unwritten
        self.assertGreater(unwritten.total, self.LIMIT)
        self.assertTrue(all(self.nsqd.topics[f"t{i}"].has_room() for i in range(crossing)))
        self.assertNotIn(f"t{crossing}", self.nsqd.topics)  # not accepted, not even looked at
        p.dataReceived(b"NOP\n")
        self.assertEqual(t.producerState, "paused")  # and nothing more is read from it
        self.assertIsNotNone(self.nsqd.wait_for_room("other"))  # HTTP asks the same rule
        for _ in range(3):
            self.executor.run()
            self.settle()
        self.assertEqual(take_frames(t), [(FRAME_TYPE_RESPONSE, b"OK")])
        self.assertEqual(t.producerState, "producing")
        self.assertEqual(self.nsqd.topics[f"t{crossing}"].depth(), 8)
        for _ in range(3):
            self.executor.run()
            self.settle()
        self.assertEqual(unwritten.total, 0)

    def test_topics_hold_handoffs_while_the_node_is_over(self) -> None:
        """While the node is over its bound a topic copies nothing more to its channels (the copies
        would only add to the memory waiting for the disks); once under, it hands everything on."""
        topic = self.nsqd.get_topic("a")
        channel = topic.get_channel("c")
        self.executor.run()
        self.settle()
        topic.pause()
        self.assertIsNone(self.nsqd.publish("a", [b"x" * 1000] * 20))
        for _ in range(3):
            self.executor.run()
            self.settle()
        self.assertEqual(topic.depth(), 20)
        # another topic's unwritten records put the node over its bound
        self.assertIsNone(self.nsqd.publish("b", [b"y" * 1000] * 80))
        self.settle()
        self.assertTrue(self.nsqd.unwritten.over())
        topic.unpause()
        self.settle()
        self.assertEqual(channel.depth(), 0)
        self.assertEqual(channel.backend.backlog(), 0)
        for _ in range(6):
            self.executor.run()
            self.settle()
        self.assertFalse(self.nsqd.unwritten.over())
        self.assertEqual(channel.depth(), 20)

    def test_deleted_and_closed_queues_give_their_bytes_back(self) -> None:
        """What a deleted topic or a stopped node had not written leaves the node's count (nothing
        is waiting for it any more), so the bound cannot leak shut."""
        self.nsqd.get_topic("gone")
        self.executor.run()
        self.nsqd.publish("gone", [b"z" * 1000] * 10)
        self.nsqd.publish("kept", [b"z" * 1000] * 10)
        self.settle()
        self.assertGreater(self.nsqd.unwritten.total, 10 * 1000)
        deleted = self.nsqd.delete_topic("gone")
        for _ in range(3):
            self.executor.run()
            self.settle()
        self.successResultOf(deleted)
        self.assertEqual(self.nsqd.unwritten.total, self.nsqd.topics["kept"].backend.backlog_bytes())
        closed = self.nsqd.close()
        for _ in range(5):
            self.executor.run()
            self.settle()
        self.successResultOf(closed)
        self.assertEqual(self.nsqd.unwritten.total, 0)
