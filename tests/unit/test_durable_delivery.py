"""--durable-delivery in process: a V2 client over StringTransport, a task.Clock, synchronous disk.

A "crash" is simply abandoning the NSQD without closing anything (every disk
job already ran) and building a new one on the same directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.core.message import FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE
from nsqtw.core.nsqd import NSQD
from nsqtw.protocol.wire import encode_command, encode_mpub
from nsqtw.storage.diskqueue import DiskQueue
from nsqtw.storage.durable import DurableDelivery, DurableTopicDelivery
from nsqtw.storage.executor import SynchronousDiskExecutor
from nsqtw.storage.journal import Journal, find_journals, journal_path, replay
from nsqtw.storage.segments import nsqd_msg_size_limits
from tests.helpers import EPOCH, connect, decode_message_frame, make_options, take_frames


class DurableTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.path = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.path)
        self.clock = Clock()
        self.clock.advance(EPOCH)

    def build(self) -> NSQD:
        options = make_options(durable_delivery=True, msg_timeout=60.0)
        lo, hi = nsqd_msg_size_limits(options.max_msg_size)

        def backend(name: str) -> DiskQueue:
            return DiskQueue(name, self.path, 1 << 20, lo, hi, options.sync_every, 0, self.clock,
                             SynchronousDiskExecutor(), durable=True)

        def journal(name: str) -> Journal:
            return Journal(name, self.path, self.clock, SynchronousDiskExecutor(),
                           replay(journal_path(self.path, name)), fsync_fn=self.journal_fsync)

        nsqd = NSQD(options, self.clock, backend, DurableDelivery(journal, options.sync_every))
        for name in find_journals(self.path):  # what the service does at start
            topic, _, channel = name.partition(":")
            t = nsqd.get_topic(topic)
            if channel:
                t.get_channel(channel)
        self.settle()
        return nsqd

    def settle(self) -> None:
        for _ in range(10):
            self.clock.advance(0)

    journal_fails = False

    def journal_fsync(self, fd: int) -> None:
        if self.journal_fails:
            raise OSError(5, "Input/output error")
        os.fsync(fd)

    def test_delivery_waits_while_the_journal_is_behind(self) -> None:
        """Issue #15 item 5: while journal fsyncs fail, its unsynced records stay bounded: past
        PENDING_LIMIT_BYTES the channel takes nothing more for delivery; synced again, it goes on."""
        from nsqtw.storage import journal as journal_module
        self.patch(journal_module, "PENDING_LIMIT_BYTES", 5_000)
        nsqd = self.build()
        nsqd.publish("t", [b"m%03d" % i + b"x" * 200 for i in range(100)])
        nsqd.get_topic("t").get_channel("c")
        self.settle()
        self.clock.advance(0.01)
        self.settle()
        self.journal_fails = True
        p, t = self.consumer(nsqd, 10)
        delivered = []
        for _ in range(30):
            got = self.messages(t)
            delivered.extend(got)
            for _, msg_id, _ in got:
                p.dataReceived(encode_command(b"FIN", msg_id))
            self.settle()
            self.clock.advance(0.1)
        channel = nsqd.topics["t"].channels["c"]
        journal = channel.delivery.journal  # type: ignore[attr-defined]
        self.assertTrue(journal.behind())
        self.assertLess(len(delivered), 100)
        self.assertLess(journal._pending_bytes + journal._writing_bytes, 5_000 + 10 * 300)
        self.journal_fails = False
        for _ in range(40):
            got = self.messages(t)
            delivered.extend(got)
            for _, msg_id, _ in got:
                p.dataReceived(encode_command(b"FIN", msg_id))
            self.settle()
            self.clock.advance(0.1)
        self.assertEqual(sorted(b for _, _, b in delivered), [b"m%03d" % i + b"x" * 200 for i in range(100)])

    def test_topic_holds_batches_while_a_channel_journal_is_behind(self) -> None:
        """While a durable channel's journal is past its bound (fsyncs failing), the topic hands
        it nothing more and keeps the messages in its own queue; synced again, every one arrives."""
        from nsqtw.storage import journal as journal_module
        self.patch(journal_module, "PENDING_LIMIT_BYTES", 5_000)
        nsqd = self.build()
        topic = nsqd.get_topic("t")
        channel = topic.get_channel("c")
        p, t = self.consumer(nsqd, 100)
        self.journal_fails = True
        first = [b"a%03d" % i + b"x" * 200 for i in range(100)]
        nsqd.publish("t", first)
        delivered = []
        for _ in range(10):
            self.settle()
            self.clock.advance(0.1)
            delivered.extend(self.messages(t))
        journal = channel.delivery.journal  # type: ignore[attr-defined]
        self.assertTrue(journal.behind())
        handed = channel.message_count
        later = [b"b%03d" % i for i in range(50)]
        nsqd.publish("t", later)
        for _ in range(30):
            self.settle()
            self.clock.advance(0.1)
            delivered.extend(self.messages(t))
        self.assertEqual(channel.message_count, handed)
        self.assertEqual(topic.depth(), 50)
        self.journal_fails = False
        for _ in range(60):
            self.settle()
            self.clock.advance(0.1)
            got = self.messages(t)
            delivered.extend(got)
            p.dataReceived(b"".join(encode_command(b"FIN", msg_id) for _, msg_id, _ in got))
        self.assertEqual(sorted(b for _, _, b in delivered), sorted(first + later))
        self.assertEqual(topic.depth(), 0)

    def consumer(self, nsqd: NSQD, rdy: int) -> tuple[Any, Any]:
        p, t = connect(nsqd, self.clock)
        p.dataReceived(encode_command(b"SUB", b"t", b"c"))
        self.settle()
        self.assertEqual(take_frames(t), [(FRAME_TYPE_RESPONSE, b"OK")])
        p.dataReceived(encode_command(b"RDY", str(rdy).encode()))
        self.settle()
        return p, t

    def messages(self, t: Any) -> list[tuple[int, bytes, bytes]]:
        out = []
        for ftype, data in take_frames(t):
            self.assertEqual(ftype, FRAME_TYPE_MESSAGE)
            _, attempts, msg_id, body = decode_message_frame(data)
            out.append((attempts, msg_id, body))
        return out

    def test_publish_answered_after_fsync(self) -> None:
        """A PUB's OK comes only after the topic queue's write and fsync, even with one in memory room."""
        fsyncs: list[int] = []
        nsqd = self.build()
        p, t = connect(nsqd, self.clock)
        topic = nsqd.get_topic("t")
        self.assertIsInstance(topic.delivery, DurableTopicDelivery)
        topic.backend._disk.fsync_fn = lambda fd: fsyncs.append(fd)  # type: ignore[attr-defined]
        p.dataReceived(encode_command(b"PUB", b"t", body=b"x"))
        self.assertEqual(take_frames(t), [])  # nothing yet: the write runs next turn
        self.settle()
        self.assertEqual(take_frames(t), [(FRAME_TYPE_RESPONSE, b"OK")])
        self.assertEqual(len(fsyncs), 1)
        self.assertEqual(len(topic.memory), 0)

    def test_crash_recovery_in_process(self) -> None:
        """FINed ones never return; in-flight, requeued and DPUB ones do, attempts and due times kept."""
        nsqd = self.build()
        cp, ct = self.consumer(nsqd, 0)
        pp, pt = connect(nsqd, self.clock)
        pp.dataReceived(encode_mpub(b"t", [b"m%d" % i for i in range(10)]))
        pp.dataReceived(encode_command(b"DPUB", b"t", b"5000", body=b"later"))
        self.settle()
        self.assertEqual(len(take_frames(pt)), 2)
        cp.dataReceived(encode_command(b"RDY", b"10"))
        self.settle()
        got = {body: (attempts, msg_id) for attempts, msg_id, body in self.messages(ct)}
        self.assertEqual(len(got), 10)
        cmds = b"".join(encode_command(b"FIN", got[b"m%d" % i][1]) for i in range(4))
        cmds += encode_command(b"REQ", got[b"m4"][1], b"3000")
        cp.dataReceived(cmds)
        self.settle()
        self.clock.advance(1.0)  # one second later: crash
        self.settle()

        nsqd2 = self.build()
        cp2, ct2 = self.consumer(nsqd2, 100)
        back = {body: attempts for attempts, _, body in self.messages(ct2)}
        self.assertEqual(back, {b"m%d" % i: 2 for i in range(5, 10)})
        self.clock.advance(2.5)  # the REQ's due time (3s after it) has passed, not the DPUB's
        self.settle()
        self.assertEqual({body: a for a, _, body in self.messages(ct2)}, {b"m4": 2})
        self.clock.advance(2.0)
        self.settle()
        self.assertEqual({body: a for a, _, body in self.messages(ct2)}, {b"later": 1})

    def test_handoff_not_repeated_after_crash(self) -> None:
        """The topic's read position lags after a crash; its records already in the channel are skipped."""
        nsqd = self.build()
        cp, ct = self.consumer(nsqd, 100)
        pp, pt = connect(nsqd, self.clock)
        pp.dataReceived(encode_mpub(b"t", [b"a", b"b", b"c"]))
        self.settle()
        ids = [msg_id for _, msg_id, _ in self.messages(ct)]
        cp.dataReceived(b"".join(encode_command(b"FIN", i) for i in ids))
        self.settle()
        # the topic's read position on disk lags (persisted every --sync-every records)
        meta = os.path.join(self.path, "t.diskqueue.meta.dat")
        self.assertTrue(not os.path.exists(meta) or open(meta).read().split("\n")[1] == "0,0")
        nsqd2 = self.build()
        _, ct2 = self.consumer(nsqd2, 100)
        self.clock.advance(1.0)
        self.settle()
        self.assertEqual(self.messages(ct2), [])

    def test_compaction_keeps_disk_use_bounded(self) -> None:
        """Thousands of FINed messages later, the journal holds only the unfinished ones."""
        nsqd = self.build()
        cp, ct = self.consumer(nsqd, 100)
        journal = nsqd.topics["t"].channels["c"].delivery.journal  # type: ignore[attr-defined]
        assert journal is not None
        journal._compact_min = 8192
        pp, pt = connect(nsqd, self.clock)
        for _ in range(20):
            pp.dataReceived(encode_mpub(b"t", [b"x" * 200] * 50))
            self.settle()
            cp.dataReceived(b"".join(encode_command(b"FIN", i) for _, i, _ in self.messages(ct)))
            self.settle()
        self.assertGreater(journal.compactions, 0)
        self.assertEqual(replay(journal.path).messages, {})
        self.assertLess(os.path.getsize(journal.path), 4 * 8192)
