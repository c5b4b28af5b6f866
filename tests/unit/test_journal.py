"""The --durable-delivery journal: records, replay, torn tails, compaction, group commit."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.core.message import Message
from nsqtw.storage import atomic
from nsqtw.storage.diskqueue import DiskQueue
from nsqtw.storage.executor import SynchronousDiskExecutor
from nsqtw.storage.journal import MAGIC, Journal, JournalError, find_journals, journal_path, replay
from tests.helpers import EPOCH


def msg(i: int, body: bytes = b"body", attempts: int = 0) -> Message:
    return Message(b"%016x" % i + body + b"%d" % i, 1000 + i, attempts)


class HeldExecutor(SynchronousDiskExecutor):
    """Runs disk jobs only when the test says so (a slow fsync)."""

    def __init__(self) -> None:
        super().__init__()
        self.jobs: list[tuple[Any, tuple[Any, ...], Deferred[Any]]] = []

    def submit(self, fn, *args):  # type: ignore[no-untyped-def]
        d: Deferred[Any] = Deferred()
        self.jobs.append((fn, args, d))
        return d

    def run_one(self) -> None:
        fn, args, d = self.jobs.pop(0)
        d.callback(fn(*args))


class FlakyFsync:
    """os.fsync that fails with EIO while ``failing`` is set (a disk whose flushes fail)."""

    def __init__(self, failing: bool) -> None:
        self.failing = failing

    def __call__(self, fd: int) -> None:
        if self.failing:
            raise OSError(5, "Input/output error")
        os.fsync(fd)


class JournalTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.path = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.path)
        self.clock = Clock()
        self.clock.advance(EPOCH)
        self.file = journal_path(self.path, "t:c")

    def journal(self, executor: Any = None, **kw: Any) -> Journal:
        state = replay(self.file)
        return Journal("t:c", self.path, self.clock, executor or SynchronousDiskExecutor(), state, **kw)

    def settle(self) -> None:
        for _ in range(3):
            self.clock.advance(0)


class ReplayTests(JournalTestCase):
    def test_round_trip(self) -> None:
        """What is recorded comes back on replay: live messages with attempts and due times, positions."""
        j = self.journal()
        a, b, c, d = msg(1), msg(2), msg(3), msg(4)
        j.delivering([a, b, c])           # attempts become 1
        j.deferred(d, EPOCH + 30)         # a DPUB message, not delivered yet
        b.attempts = 1
        j.deferred(b, EPOCH + 60)         # REQ with a delay
        j.finished(a.id)
        j.taken((0, 120))
        j.handed_off((2, 40))
        j.handed_off((1, 99))             # positions only move forward
        self.settle()
        state = replay(self.file)
        self.assertEqual(list(state.messages), [b.id, c.id, d.id])
        self.assertEqual(state.messages[b.id], [b.timestamp, 1, int((EPOCH + 60) * 1000), b.body])
        self.assertEqual(state.messages[c.id], [c.timestamp, 1, 0, c.body])
        self.assertEqual(state.messages[d.id][1:3], [0, int((EPOCH + 30) * 1000)])
        self.assertEqual(state.taken, (0, 120))
        self.assertEqual(state.handoff, (2, 40))
        self.assertEqual(state.torn, 0)
        self.assertEqual(state.size, os.path.getsize(self.file))

    def test_clear(self) -> None:
        """An emptied channel forgets every message but keeps its positions."""
        j = self.journal()
        j.delivering([msg(1), msg(2)])
        j.taken((0, 50))
        j.cleared()
        j.delivering([msg(3)])
        self.settle()
        state = replay(self.file)
        self.assertEqual(list(state.messages), [msg(3).id])
        self.assertEqual(state.taken, (0, 50))

    def test_recovered_state_feeds_the_next_journal(self) -> None:
        """A journal opened on a replayed file knows its live ids and appends after them."""
        j = self.journal()
        j.delivering([msg(1), msg(2)])
        self.settle()
        j2 = self.journal()
        self.assertTrue(j2.is_live(msg(1).id))
        self.assertEqual(set(j2.recovered), {msg(1).id, msg(2).id})
        j2.finished(msg(1).id)
        self.settle()
        self.assertEqual(list(replay(self.file).messages), [msg(2).id])

    def test_missing_file_is_empty(self) -> None:
        """No file yet: nothing to recover, and nothing is created until something is recorded."""
        state = replay(self.file)
        self.assertEqual((state.messages, state.taken, state.handoff), ({}, None, None))
        j = self.journal()
        self.settle()
        self.assertFalse(os.path.exists(self.file))
        j.finished(msg(1).id)
        self.settle()
        self.assertTrue(open(self.file, "rb").read().startswith(MAGIC))

    def test_topic_due_times(self) -> None:
        """A topic journal keeps DPUB due times; dropped ones vanish at the next compaction."""
        j = self.journal(compact_min_bytes=1)
        j.due(msg(1).id, EPOCH + 10)
        j.due(msg(2).id, EPOCH + 20)
        self.settle()
        self.assertEqual(replay(self.file).dues, {msg(1).id: int((EPOCH + 10) * 1000),
                                                  msg(2).id: int((EPOCH + 20) * 1000)})
        j.drop_dues([msg(1).id])
        j.due(msg(3).id, EPOCH - 5)  # already past: not worth keeping
        for i in range(4, 10):
            j.due(msg(i).id, EPOCH + 5)
        j.drop_dues([msg(i).id for i in range(4, 10)])
        j.finished(msg(0).id)  # anything, to make a write happen
        self.settle()
        self.assertGreater(j.compactions, 0)
        self.assertEqual(set(replay(self.file).dues), {msg(2).id})
        self.assertEqual(set(self.journal().dues), {msg(2).id})

    def test_find_journals(self) -> None:
        """find_journals lists the names that have a journal file."""
        for name in ("t:c", "t", "u:d"):
            open(journal_path(self.path, name), "wb").close()
        open(os.path.join(self.path, "t.diskqueue.meta.dat"), "wb").close()
        self.assertEqual(find_journals(self.path), ["t", "t:c", "u:d"])
        self.assertEqual(find_journals(os.path.join(self.path, "nope")), [])


class TornTailTests(JournalTestCase):
    def write_three(self) -> int:
        j = self.journal()
        j.delivering([msg(1)])
        self.settle()
        j.delivering([msg(2)])
        self.settle()
        size = os.path.getsize(self.file)
        j.delivering([msg(3)])
        self.settle()
        return size

    def test_short_last_record(self) -> None:
        """A record cut short (a crash mid-write) is dropped and cut off the file; the rest survives."""
        good = self.write_three()
        with open(self.file, "r+b") as f:
            f.truncate(os.path.getsize(self.file) - 3)
        state = replay(self.file)
        self.assertEqual(list(state.messages), [msg(1).id, msg(2).id])
        self.assertEqual(state.size, good)
        self.assertGreater(state.torn, 0)
        self.assertEqual(os.path.getsize(self.file), good)
        # appending after the cut yields a clean journal
        j = self.journal()
        j.delivering([msg(4)])
        self.settle()
        self.assertEqual(list(replay(self.file).messages), [msg(1).id, msg(2).id, msg(4).id])

    def test_garbage_and_zeros_at_the_end(self) -> None:
        """Zeros or junk past the last record (unsynced pages after power loss) are cut off."""
        self.write_three()
        whole = os.path.getsize(self.file)
        for junk in (b"\0" * 100, b"\xff\xff\xff\xff" + b"x" * 10, b"\0\0\0\x05Mabcd"):
            with open(self.file, "ab") as f:
                f.write(junk)
            state = replay(self.file)
            self.assertEqual(len(state.messages), 3)
            self.assertEqual(state.torn, len(junk))
            self.assertEqual(os.path.getsize(self.file), whole)

    def test_bad_crc_stops_replay(self) -> None:
        """A damaged record ends the journal there: nothing after it is trusted."""
        good = self.write_three()
        with open(self.file, "r+b") as f:
            f.seek(good + 20)
            byte = f.read(1)
            f.seek(good + 20)
            f.write(bytes([byte[0] ^ 0xFF]))
        state = replay(self.file)
        self.assertEqual(list(state.messages), [msg(1).id, msg(2).id])
        self.assertEqual(os.path.getsize(self.file), good)

    def test_torn_header(self) -> None:
        """A file whose header was cut short holds nothing and is reset."""
        with open(self.file, "wb") as f:
            f.write(MAGIC[:3])
        state = replay(self.file)
        self.assertEqual((state.messages, state.torn), ({}, 3))
        self.assertEqual(os.path.getsize(self.file), 0)

    def test_not_a_journal(self) -> None:
        """A file that is not a journal is an error, never silently dropped."""
        with open(self.file, "wb") as f:
            f.write(b"something else entirely")
        self.assertRaises(JournalError, replay, self.file)


class CompactionTests(JournalTestCase):
    def deliver_mostly_finished(self, j: Journal, count: int) -> dict[bytes, Message]:
        """Deliver ``count`` messages of 100 bytes one at a time and finish nine in ten; returns the
        live ones, which are what ``j`` snapshots."""
        live: dict[bytes, Message] = {}
        j.snapshot = lambda: [(m, 0.0) for m in live.values()]
        for i in range(count):
            m = msg(i, b"x" * 100)
            j.delivering([m])
            m.attempts += 1
            if i % 10:
                j.finished(m.id)
            else:
                live[m.id] = m
            self.settle()
        return live

    def test_compaction_keeps_only_live_messages(self) -> None:
        """When finished messages dominate, the file is rewritten with the live ones only."""
        j = self.journal(compact_min_bytes=4096)
        live = self.deliver_mostly_finished(j, 200)
        j.taken((0, 777))
        self.settle()
        self.assertGreater(j.compactions, 0)
        size = os.path.getsize(self.file)
        self.assertLess(size, 4 * 4096)
        state = replay(self.file)
        self.assertEqual(set(state.messages), set(live))
        self.assertEqual({e[1] for e in state.messages.values()}, {1})
        self.assertEqual(state.taken, (0, 777))

    def test_compaction_carries_due_times(self) -> None:
        """A deferred message keeps its due time through compaction."""
        m = msg(1)
        j = self.journal(compact_min_bytes=1)
        j.snapshot = lambda: [(m, EPOCH + 99)]
        j.deferred(m, EPOCH + 99)
        for i in range(2, 20):
            j.delivering([msg(i)])
            j.finished(msg(i).id)
            self.settle()
        self.assertGreater(j.compactions, 0)
        self.assertEqual(replay(self.file).messages[m.id][2], int((EPOCH + 99) * 1000))

    def test_compaction_encodes_on_the_disk_lane(self) -> None:
        """Issue #16: the reactor only lists the live messages; the snapshot's records are
        encoded (and written) by the job on the journal's disk lane."""
        from nsqtw.storage import journal as journal_module
        built: list[int] = []
        real = journal_module.build_snapshot

        def counting(snap):  # type: ignore[no-untyped-def]
            built.append(len(snap[0]))
            return real(snap)

        self.patch(journal_module, "build_snapshot", counting)
        held = HeldExecutor()
        live = [msg(1, b"z" * 50)]
        j = self.journal(executor=held, compact_min_bytes=1)
        j.snapshot = lambda: [(m, 0.0) for m in live]
        j.delivering(live + [msg(2)])
        self.settle()
        held.run_one()  # the plain append
        j.finished(msg(2).id)
        for i in range(3, 10):
            j.delivering([msg(i)])
            j.finished(msg(i).id)
        self.settle()
        self.assertEqual(len(held.jobs), 1)
        self.assertEqual(built, [])  # nothing encoded on the reactor
        self.assertFalse(isinstance(held.jobs[0][1][0], bytes))
        held.run_one()
        self.settle()
        self.assertEqual(built, [1])
        self.assertEqual(j.compactions, 1)
        self.assertEqual(list(replay(self.file).messages), [msg(1).id])

    def test_no_compaction_while_mostly_live(self) -> None:
        """A journal of mostly unfinished messages is left alone however big."""
        j = self.journal(compact_min_bytes=1024)
        msgs = [msg(i, b"y" * 200) for i in range(50)]
        j.snapshot = lambda: [(m, 0.0) for m in msgs]
        j.delivering(msgs)
        self.settle()
        j.finished(msgs[0].id)
        self.settle()
        self.assertEqual(j.compactions, 0)


    def test_a_failed_write_compacts_at_any_size(self) -> None:
        """After a failed write the retry compacts however small the file: on a full disk the
        finished messages' records hold the space the journal needs to go on (below
        COMPACT_MIN_BYTES a journal of two channels on an 8 MiB disk wedged for good)."""
        fsync = FlakyFsync(failing=False)
        j = self.journal(fsync_fn=fsync)
        live = self.deliver_mostly_finished(j, 50)
        self.assertEqual(j.compactions, 0)  # far below COMPACT_MIN_BYTES
        grown = os.path.getsize(self.file)
        fsync.failing = True
        j.taken((0, 99))
        self.settle()
        self.assertIn("failed to write", j.health() or "")
        fsync.failing = False
        self.clock.advance(1.0)  # the retry
        self.assertEqual(j.compactions, 1)
        self.assertIsNone(j.health())
        self.assertLess(os.path.getsize(self.file), grown // 4)
        state = replay(self.file)
        self.assertEqual(set(state.messages), set(live))
        self.assertEqual(state.taken, (0, 99))

    def test_a_failed_write_of_mostly_live_messages_does_not_compact(self) -> None:
        """Compacting could not make room there: the retry appends as before."""
        fsync = FlakyFsync(failing=False)
        j = self.journal(fsync_fn=fsync)
        msgs = [msg(i, b"y" * 200) for i in range(50)]
        j.snapshot = lambda: [(m, 0.0) for m in msgs]
        j.delivering(msgs)
        self.settle()
        fsync.failing = True
        j.taken((0, 5))
        self.settle()
        fsync.failing = False
        self.clock.advance(1.0)
        self.assertEqual(j.compactions, 0)
        self.assertIsNone(j.health())
        self.assertEqual(replay(self.file).taken, (0, 5))


class GroupCommitTests(JournalTestCase):
    def test_records_arriving_during_a_write_go_in_the_next_one(self) -> None:
        """Everything recorded while an fsync runs is written (and synced) together by the next."""
        ex = HeldExecutor()
        j = self.journal(ex)
        done: list[str] = []
        j.finished(msg(1).id)
        j.on_synced(lambda: done.append("first"))
        self.clock.advance(0)
        self.assertEqual(len(ex.jobs), 1)
        for i in range(2, 12):  # ten records while the first write runs
            j.finished(msg(i).id)
            j.on_synced(lambda i=i: done.append(f"r{i}"))
        self.clock.advance(0)
        self.assertEqual(len(ex.jobs), 1)  # still only the first write
        ex.run_one()
        self.assertEqual(done, ["first"])
        self.assertEqual(len(ex.jobs), 1)  # the ten, as one write
        ex.run_one()
        self.assertEqual(done, ["first"] + [f"r{i}" for i in range(2, 12)])
        self.assertEqual(ex.jobs, [])

    def test_on_synced_immediately_when_idle(self) -> None:
        """Nothing pending: on_synced runs at once and synced() has fired."""
        j = self.journal()
        seen: list[int] = []
        j.on_synced(lambda: seen.append(1))
        self.assertEqual(seen, [1])
        self.assertIsNone(self.successResultOf(j.synced()))


class FailureTests(JournalTestCase):
    def test_failed_write_is_retried_and_leaves_no_half_record(self) -> None:
        """A failed fsync reports unhealthy, keeps the records, retries, and the file stays clean."""
        fsync = FlakyFsync(failing=True)

        j = self.journal(fsync_fn=fsync)
        synced: list[int] = []
        j.delivering([msg(1)])
        j.on_synced(lambda: synced.append(1))
        self.settle()
        self.assertIn("failed to write", j.health() or "")
        self.assertEqual(synced, [])
        self.assertEqual(os.path.getsize(self.file), len(MAGIC))  # nothing half-written stays
        fsync.failing = False
        self.clock.advance(1.0)
        self.assertIsNone(j.health())
        self.assertEqual(synced, [1])
        self.assertEqual(list(replay(self.file).messages), [msg(1).id])

    def test_appends_leave_the_last_bytes_to_the_queues_metadata(self) -> None:
        """A journal's appends stop short of its ``keep_free`` reserve (its queues' metadata
        needs those bytes to let consumed segments go); FINs that make a compaction worth it
        retry at once, and the compaction, which gives space back, may use the reserve."""
        keep = 100_000
        self.patch(atomic, "free_bytes", lambda path: keep + 1_500)
        j = self.journal(keep_free=keep)
        msgs = [msg(i, b"y" * 200) for i in range(20)]  # about 250 bytes a record
        j.snapshot = lambda: [(m, 0.0) for m in msgs if j.is_live(m.id)]
        j.delivering(msgs[:5])
        self.settle()
        self.assertIsNone(j.health())
        size = os.path.getsize(self.file)
        j.delivering(msgs[5:])  # past what the reserve leaves
        self.settle()
        self.assertIn("the last 100000 bytes are kept for the queues' metadata", j.health() or "")
        self.assertEqual(os.path.getsize(self.file), size)  # nothing written
        j.finished_many([m.id for m in msgs])
        self.settle()  # no retry interval waited: the compaction went at once
        self.assertEqual(j.compactions, 1)
        self.assertIsNone(j.health())
        self.assertEqual(replay(self.file).messages, {})

    def test_a_failing_journal_alone_makes_the_node_unhealthy(self) -> None:
        """Health tells the truth when only a journal fails (its disk queues write fine): the
        node's /ping answer is NOK with the journal's error while its fsync fails, OK once the
        retry syncs, and OK again at once when a failing journal is removed."""
        from nsqtw.core.nsqd import NSQD
        from tests.helpers import make_options
        fsync = FlakyFsync(failing=True)

        node = NSQD(make_options(), self.clock)
        j = self.journal(fsync_fn=fsync)
        j.watch_health(node.storage_health)
        self.assertEqual(node.health(), "OK")
        j.delivering([msg(1)])
        self.settle()
        self.assertTrue(node.health().startswith("NOK - "), node.health())
        self.assertIn("Input/output error", node.health())
        self.assertFalse(node.is_healthy())
        fsync.failing = False
        self.clock.advance(1.0)
        self.assertEqual(node.health(), "OK")
        fsync.failing = True
        j.delivering([msg(2)])
        self.settle()
        self.assertFalse(node.is_healthy())
        self.successResultOf(j.remove())  # its channel was deleted while the fsync still fails
        self.assertEqual(node.health(), "OK")

    def test_unsynced_records_are_bounded(self) -> None:
        """While fsync fails the journal's unsynced bytes grow only to PENDING_LIMIT_BYTES:
        behind() turns true there (writers wait), and false once the retry syncs them."""
        from nsqtw.storage import journal as journal_module
        self.patch(journal_module, "PENDING_LIMIT_BYTES", 10_000)
        fsync = FlakyFsync(failing=True)

        j = self.journal(fsync_fn=fsync)
        n = 0
        while not j.behind():
            j.delivering([msg(n)])
            n += 1
            self.settle()
        self.assertGreater(n, 10)
        self.assertEqual(j.unsynced(), n)
        self.clock.advance(1.0)  # a failed retry keeps it behind
        self.assertTrue(j.behind())
        fsync.failing = False
        self.clock.advance(1.0)
        self.assertFalse(j.behind())
        self.assertEqual(j.unsynced(), 0)

    def test_close_writes_pending_and_remove_deletes(self) -> None:
        """close() syncs what is pending and keeps the file; remove() deletes it."""
        j = self.journal()
        j.delivering([msg(1)])
        self.successResultOf(j.close())
        self.assertEqual(list(replay(self.file).messages), [msg(1).id])
        j2 = self.journal()
        j2.finished(msg(1).id)
        self.successResultOf(j2.remove())
        self.assertFalse(os.path.exists(self.file))


class DurableDiskQueueTests(SynchronousTestCase):
    """The disk queue's durable mode: committed reads, adopted tails."""

    def setUp(self) -> None:
        self.path = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.path)
        self.clock = Clock()

    def queue(self, **kw: Any) -> DiskQueue:
        q = DiskQueue("q", self.path, 1 << 20, 26, 1 << 20, 2500, 0, self.clock,
                      SynchronousDiskExecutor(), durable=True, **kw)
        self.clock.advance(0)
        return q

    def settle(self) -> None:
        for _ in range(5):
            self.clock.advance(0)

    def test_reads_consumed_only_when_committed(self) -> None:
        """A restart finds every record read but not committed; committed ones are gone."""
        q = self.queue()
        q.put_many([b"r%025d" % i for i in range(10)])
        self.settle()
        first = q.read_positions(4)
        self.assertEqual(len(first), 4)
        q.commit_read(q.read_mark())
        q.read_positions(3)  # read, never committed
        self.successResultOf(q.close())
        q2 = self.queue()
        self.settle()
        self.assertEqual(q2.depth(), 6)
        self.assertEqual([r[0] for r in q2.read_positions(10)], [b"r%025d" % i for i in range(4, 10)])

    def test_stale_marks_are_ignored(self) -> None:
        """An older mark committed after a newer one changes nothing."""
        q = self.queue()
        q.put_many([b"s%025d" % i for i in range(5)])
        self.settle()
        q.read_positions(2)
        old = q.read_mark()
        q.read_positions(2)
        new = q.read_mark()
        q.commit_read(new)
        q.commit_read(old)
        self.successResultOf(q.close())
        self.assertEqual(self.queue().depth(), 1)

    def test_segments_begun_after_a_failed_fsync_are_adopted(self) -> None:
        """A failed fsync moves writing to a new segment without a metadata write; the batch is
        written again there and acknowledged. A kill -9 before the next metadata write must not lose
        it: the later segment is taken in at the next start (a batch whose fsync failed may come
        twice, never not at all)."""
        fsync = FlakyFsync(failing=False)

        q = self.queue(fsync_fn=fsync)
        q.put_many([b"a%025d" % i for i in range(3)])
        self.settle()
        fsync.failing = True
        q.put_many([b"b%025d" % i for i in range(2)])
        written = q.written()
        self.settle()
        self.failureResultOf(written)
        # a failed fsync may have lost those pages (Linux drops them): segment 0 keeps the a's only
        os.truncate(os.path.join(self.path, "q.diskqueue.000000.dat"), 3 * 30)
        fsync.failing = False
        self.clock.advance(1.0)  # the retry writes the batch into the next segment
        self.settle()
        self.assertIsNone(q.health())
        self.assertTrue(os.path.exists(os.path.join(self.path, "q.diskqueue.000001.dat")))
        q2 = self.queue()  # kill -9: the old queue never wrote its metadata again
        self.settle()
        got = [r[0] for r in q2.read_positions(20)]
        self.assertEqual(got, [b"a%025d" % i for i in range(3)] + [b"b%025d" % i for i in range(2)])

    def test_tail_past_metadata_is_adopted(self) -> None:
        """Records fsynced after the last metadata write count after a crash; a torn one is cut."""
        q = self.queue()
        q.put_many([b"a%025d" % i for i in range(3)])
        self.successResultOf(q.close())
        q = self.queue()
        q.put_many([b"b%025d" % i for i in range(4)])
        self.settle()  # written and fsynced; metadata still says 3 (kill -9 now)
        seg = os.path.join(self.path, "q.diskqueue.000000.dat")
        with open(seg, "ab") as f:
            f.write(b"\0\0\0\x30partial")  # a record torn by the crash
        q2 = self.queue()
        self.settle()
        self.assertEqual(q2.depth(), 7)
        got = [r[0] for r in q2.read_positions(10)]
        self.assertEqual(got, [b"a%025d" % i for i in range(3)] + [b"b%025d" % i for i in range(4)])
        self.assertEqual(os.path.getsize(seg), 7 * 30)
        self.assertIsNone(q2.health())
