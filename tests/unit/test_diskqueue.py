"""DiskQueue: go-diskqueue's file format, rolling, corruption handling, sync policy and batching."""

from __future__ import annotations

import errno
import os
import queue
import shutil
import struct
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import Logger
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from nsqtw.errors import BackendError
from nsqtw.interfaces import IBackendQueue, IDiskExecutor
from nsqtw.storage import segments
from nsqtw.storage.diskqueue import SYNC_REPORT_DELAY, DiskQueue
from nsqtw.storage.executor import Reply, SynchronousDiskExecutor, ThreadPoolDiskExecutor
from nsqtw.storage.segments import nsqd_msg_size_limits
from tests.helpers import ManualExecutor


class FileHooks:
    """Counts write and fsync calls, and fails writes on demand (a full or broken disk)."""

    def __init__(self) -> None:
        self.writes = 0
        self.fsyncs = 0
        self.fail: OSError | None = None
        self.fail_after: int | None = None  # let this many more writes succeed, then fail
        self.fsync_fails = False  # a failing fsync (EIO)

    def write(self, fd: int, data: Any) -> int:
        if self.fail_after is not None:
            if self.fail_after == 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.fail_after -= 1
        if self.fail is not None:
            raise self.fail
        self.writes += 1
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        if self.fsync_fails:
            raise OSError(errno.EIO, "Input/output error")
        self.fsyncs += 1


def rec(i: int, size: int = 3) -> bytes:
    return f"{i:0{size}d}".encode()[-size:]


def framed(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


class AfterHeldExecutor(SynchronousDiskExecutor):
    """A disk lane that runs each job at once and hands its result back, but holds the work a
    :class:`Reply` leaves for after it (a slow fsync) until the test calls :meth:`run_after`;
    the jobs submitted meanwhile wait behind it, in order, as on a real lane."""

    def __init__(self) -> None:
        super().__init__()
        self.after: Callable[[], object] | None = None
        self.waiting: list[tuple[Deferred[Any], Callable[..., Any], tuple[Any, ...]]] = []

    def submit(self, fn: Callable[..., Any], *args: Any) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self.waiting.append((d, fn, args))
        self._run()
        return d

    def _run(self) -> None:
        while self.after is None and self.waiting:
            d, fn, args = self.waiting.pop(0)
            result = fn(*args)
            if isinstance(result, Reply):
                self.after, result = result.after, result.value
            d.callback(result)

    def run_after(self) -> None:
        after, self.after = self.after, None
        assert after is not None
        after()
        self._run()


class DiskQueueTestBase(SynchronousTestCase):
    def setUp(self) -> None:
        # not mktemp(): under pytest that would litter the working directory
        self.path = tempfile.mkdtemp(prefix="nsqtw-diskqueue-")
        self.addCleanup(shutil.rmtree, self.path, True)
        self.clock = Clock()
        self.hooks = FileHooks()
        self.events: list[dict[str, Any]] = []
        self.patch(DiskQueue, "log", Logger(observer=self.events.append))
        self.queues: list[DiskQueue] = []

    def tearDown(self) -> None:
        for q in self.queues:
            q.close()

    def open(self, name: str = "t", max_bytes: int = 1 << 20, min_size: int = 1, max_size: int = 1 << 16,
             sync_every: int = 2500, sync_timeout: float = 2.0, executor: IDiskExecutor | None = None,
             **kw: Any) -> DiskQueue:
        kw.setdefault("flush_interval", 0.0)  # FlushIntervalTests covers the rate limit
        q = DiskQueue(name=name, data_path=self.path, max_bytes_per_file=max_bytes, min_msg_size=min_size,
                      max_msg_size=max_size, sync_every=sync_every, sync_timeout=sync_timeout,
                      clock=self.clock, executor=executor or SynchronousDiskExecutor(),
                      write_fn=self.hooks.write, fsync_fn=self.hooks.fsync, **kw)
        self.queues.append(q)
        return q

    def reopen(self, q: DiskQueue, **kw: Any) -> DiskQueue:
        self.successResultOf(q.close())
        return self.open(q.name, **kw)

    def file(self, name: str) -> bytes:
        with open(os.path.join(self.path, name), "rb") as f:
            return f.read()

    def write_file(self, name: str, data: bytes) -> None:
        with open(os.path.join(self.path, name), "wb") as f:
            f.write(data)

    def meta(self, name: str = "t") -> bytes:
        return self.file(f"{name}.diskqueue.meta.dat")

    def listing(self) -> list[str]:
        return sorted(os.listdir(self.path))

    def read_all(self, q: DiskQueue, limit: int = 1000) -> list[bytes]:
        out: list[bytes] = []
        while len(out) < limit:
            got = q.read(limit - len(out))
            if not got:
                break
            out.extend(got)
        return out

    def logged(self, text: str) -> bool:
        from twisted.logger import formatEvent
        return any(text in formatEvent(e) for e in self.events)


class FormatTests(DiskQueueTestBase):
    def test_provides_interface(self) -> None:
        """DiskQueue provides IBackendQueue."""
        self.assertTrue(verifyObject(IBackendQueue, self.open()))

    def test_nsqd_limits(self) -> None:
        """nsqd gives go-diskqueue min = ID+timestamp+attempts and max = --max-msg-size plus that."""
        self.assertEqual(nsqd_msg_size_limits(1048576), (26, 1048602))

    def test_byte_exact_small_case(self) -> None:
        """Segment names, record framing and metadata text are exactly go-diskqueue's."""
        q = self.open(max_bytes=20)
        q.put(b"abc")
        q.put(b"defgh")
        q.put(b"ij")  # 16 + 6 > 20: rolls first
        self.clock.advance(0)
        self.successResultOf(q.close())
        self.assertEqual(self.listing(), ["t.diskqueue.000000.dat", "t.diskqueue.000001.dat", "t.diskqueue.meta.dat"])
        self.assertEqual(self.file("t.diskqueue.000000.dat"), b"\x00\x00\x00\x03abc\x00\x00\x00\x05defgh")
        self.assertEqual(self.file("t.diskqueue.000001.dat"), b"\x00\x00\x00\x02ij")
        self.assertEqual(self.meta(), b"3\n0,0\n1,6\n")

    def test_roll_only_when_next_record_would_pass(self) -> None:
        """A segment may fill to exactly max-bytes-per-file; the next record starts a new one (go-diskqueue v1.1)."""
        q = self.open(max_bytes=14)
        q.put_many([b"aaa", b"bbb"])
        self.clock.advance(0)
        q = self.reopen(q, max_bytes=14)
        self.assertEqual(self.meta(), b"2\n0,0\n0,14\n")
        q.put(b"ccc")
        self.clock.advance(0)
        q = self.reopen(q, max_bytes=14)
        self.assertEqual(self.meta(), b"3\n0,0\n1,7\n")
        self.assertEqual(self.read_all(q), [b"aaa", b"bbb", b"ccc"])

    def test_record_bigger_than_segment(self) -> None:
        """A record larger than a segment gets a segment of its own."""
        q = self.open(max_bytes=10)
        q.put_many([b"x" * 20, b"y"])
        self.clock.advance(0)
        self.assertEqual(self.file("t.diskqueue.000000.dat"), framed(b"x" * 20))
        self.assertEqual(self.file("t.diskqueue.000001.dat"), framed(b"y"))
        self.assertEqual(self.read_all(q), [b"x" * 20, b"y"])

    def test_no_temp_files_left(self) -> None:
        """Metadata goes through a temp file that is renamed into place."""
        q = self.open()
        q.put(b"a")
        self.clock.advance(0)
        self.successResultOf(q.close())
        self.assertEqual(self.listing(), ["t.diskqueue.000000.dat", "t.diskqueue.meta.dat"])

    def test_put_validates_size(self) -> None:
        """Records outside min..max size are refused with go-diskqueue's message; nothing is queued."""
        q = self.open(min_size=2, max_size=4)
        self.assertRaises(BackendError, q.put, b"a")
        e = self.assertRaises(BackendError, q.put_many, [b"ab", b"abcde"])
        self.assertEqual(str(e), "invalid message write size (5) minMsgSize=2 maxMsgSize=4")
        self.assertEqual(q.depth(), 0)


class BatchingTests(DiskQueueTestBase):
    def test_one_write_per_reactor_turn(self) -> None:
        """Every put of one reactor turn reaches the disk in a single write call."""
        q = self.open()
        for i in range(100):
            q.put(rec(i))
        self.assertEqual(self.hooks.writes, 0)
        self.assertEqual(q.depth(), 100)
        self.clock.advance(0)
        self.assertEqual(self.hooks.writes, 1)
        q.put_many(rec(i) for i in range(100, 150))
        self.clock.advance(0)
        self.assertEqual(self.hooks.writes, 2)
        self.assertEqual(self.read_all(q), [rec(i) for i in range(150)])

    def test_one_write_per_segment(self) -> None:
        """A batch spanning segments costs one write per segment."""
        q = self.open(max_bytes=70)  # 10 records of 7 bytes per segment
        q.put_many(rec(i) for i in range(25))
        self.clock.advance(0)
        self.assertEqual(self.hooks.writes, 3)
        self.assertEqual(self.listing()[:3], ["t.diskqueue.000000.dat", "t.diskqueue.000001.dat",
                                              "t.diskqueue.000002.dat"])
        self.assertEqual(self.read_all(q), [rec(i) for i in range(25)])


class FlushIntervalTests(DiskQueueTestBase):
    def test_at_most_one_flush_per_interval(self) -> None:
        """An idle queue flushes on the next turn; a busy one waits out the interval."""
        q = self.open(flush_interval=0.01)
        q.put(rec(0))
        self.clock.advance(0)
        self.assertEqual(self.hooks.writes, 1)
        q.put(rec(1))
        q.put(rec(2))
        self.clock.advance(0.005)
        self.assertEqual(self.hooks.writes, 1)
        self.clock.advance(0.005)
        self.assertEqual(self.hooks.writes, 2)
        self.clock.advance(1)
        q.put(rec(3))
        self.clock.advance(0)
        self.assertEqual(self.hooks.writes, 3)
        self.assertEqual(self.read_all(q), [rec(i) for i in range(4)])

    def test_waiting_for_written_flushes_at_once(self) -> None:
        """--sync-every=1 and backpressure wait on written(): no interval for them."""
        q = self.open(flush_interval=0.01)
        q.put(rec(0))
        self.clock.advance(0)
        q.put(rec(1))
        d = q.written()
        self.assertNoResult(d)
        self.clock.advance(0)
        self.assertEqual(self.hooks.writes, 2)
        self.successResultOf(d)


class ReadTests(DiskQueueTestBase):
    def test_read_in_order_and_depth(self) -> None:
        """Records come back oldest first; depth counts written minus returned."""
        q = self.open()
        q.put_many(rec(i) for i in range(10))
        self.assertEqual(q.read(5), [])  # not on disk yet
        self.clock.advance(0)
        self.assertEqual(q.read(4), [rec(i) for i in range(4)])
        self.assertEqual(q.depth(), 6)
        self.assertEqual(q.read(100), [rec(i) for i in range(4, 10)])
        self.assertEqual(q.depth(), 0)
        self.assertEqual(q.read(1), [])

    def test_small_read_ahead_refills(self) -> None:
        """Read-ahead works in chunks and refills as the buffer drains."""
        q = self.open(max_bytes=50, read_ahead_records=3)
        q.put_many(rec(i) for i in range(40))
        self.clock.advance(0)
        self.assertLessEqual(q._buffer_count, 3)
        out = []
        for _ in range(40):
            out.extend(q.read(1))
        self.assertEqual(out, [rec(i) for i in range(40)])

    def test_reads_that_cut_chunks_keep_the_byte_count_and_positions(self) -> None:
        """The read-ahead's bytes are counted from each chunk's size, not by adding up its records
        again; reads that cut a chunk anywhere (one record, a few, across chunks) keep that count
        equal to the records held, and the read position just past the last one handed out."""
        q = self.open(max_bytes=4096)
        written = [rec(i, 3 + i % 17) for i in range(3000)]  # records of 3 to 19 bytes
        q.put_many(written)
        self.clock.advance(0)
        out: list[bytes] = []
        for n in [1, 7, 300, 2, 999, 13, 1, 500]:
            out.extend(q.read(n))
            self.clock.advance(0)
            held = [d for _, _, data, i, _ in q._buffer for d in data[i:]]
            self.assertEqual(q._buffer_bytes, sum(map(len, held)))
            self.assertEqual(out + held, written[:len(out) + len(held)])
        q = self.reopen(q)  # the position read back from the metadata: just past what was handed out
        self.clock.advance(0)
        self.assertEqual(self.read_all(q, 5000), written[len(out):])

    def test_readable_callback(self) -> None:
        """After a short read, the callback fires (in a later reactor turn) once records are readable."""
        q = self.open()
        calls: list[None] = []
        q.set_readable_callback(lambda: calls.append(None))
        self.assertEqual(q.read(10), [])
        q.put(b"a")
        self.clock.advance(0)  # flush, refill, schedule the notification
        self.clock.advance(0)
        self.assertEqual(len(calls), 1)
        self.assertEqual(q.read(10), [b"a"])
        self.clock.advance(0)
        self.assertEqual(len(calls), 1)

    def test_reopen_keeps_depth_and_position(self) -> None:
        """Depth and read position survive close and reopen."""
        q = self.open(max_bytes=30)
        q.put_many(rec(i) for i in range(10))
        self.clock.advance(0)
        self.assertEqual(q.read(3), [rec(0), rec(1), rec(2)])
        q = self.reopen(q, max_bytes=30)
        self.assertEqual(q.depth(), 7)
        self.assertEqual(self.meta(), b"7\n0,21\n2,14\n")
        self.assertEqual(self.read_all(q), [rec(i) for i in range(3, 10)])

    def test_read_ahead_is_not_consumed(self) -> None:
        """Records buffered but not returned by read() are read again after a restart."""
        q = self.open()
        q.read(0)  # a reader: what is written is read ahead
        q.put_many(rec(i) for i in range(10))
        self.clock.advance(0)
        self.assertEqual(q._buffer_count, 10)
        q.read(2)
        q = self.reopen(q)
        self.assertEqual(self.meta(), b"8\n0,14\n0,70\n")
        self.assertEqual(self.read_all(q), [rec(i) for i in range(2, 10)])

    def test_read_ahead_grows_only_once_read(self) -> None:
        """A queue nobody reads (a topic without channels, a channel without consumers) holds no
        read-ahead, whether it was written or loaded: it is told it is readable, once, and reads
        ahead at its first read; reads take the read-ahead up to 4,096."""
        q = self.open()
        calls: list[None] = []
        q.set_readable_callback(lambda: calls.append(None))
        q.put_many(rec(i % 10) for i in range(10_000))
        self.clock.advance(0)  # the flush
        self.clock.advance(0)  # the news that it is readable
        q.put_many(rec(i % 10) for i in range(10_000, 12_000))
        self.clock.advance(0)
        self.clock.advance(0)
        self.assertEqual((q._buffer_count, q.depth(), len(calls)), (0, 12_000, 1))
        q = self.reopen(q)
        self.clock.advance(0)
        self.assertEqual(q._buffer_count, 0)
        self.assertFalse(q._disk.files_open())
        self.assertEqual(q.read(100), [rec(i % 10) for i in range(100)])  # read ahead then (synchronously here)
        sizes = []
        for _ in range(6):
            self.assertEqual(len(q.read(100)), 100)
            sizes.append(q._buffer_count)
        self.assertGreater(max(sizes), 1024)
        self.assertLessEqual(max(sizes), 4096)
        self.assertEqual(self.read_all(q, 20_000), [rec(i % 10) for i in range(700, 12_000)])

    def test_a_read_ahead_nobody_reads_is_let_go(self) -> None:
        """A queue read and then no more (its consumers went away) lets its read-ahead go at the
        second --sync-timeout tick without a read, reads nothing ahead of later writes, and its
        next reader gets every record after the last one handed out, once, in order."""
        q = self.open()
        q.put_many(rec(i % 10) for i in range(5_000))
        self.clock.advance(0)
        self.assertEqual(q.read(100), [rec(i % 10) for i in range(100)])
        held = q._buffer_count
        self.assertGreater(held, 900)
        self.clock.advance(2.0)  # a tick: read since the one before
        self.assertEqual(q._buffer_count, held)
        self.clock.advance(2.0)  # no read since: let go
        self.assertEqual((q._buffer_count, q._buffer_bytes, len(q._buffer)), (0, 0, 0))
        q.put_many(rec(i % 10) for i in range(5_000, 8_000))
        self.clock.advance(0)
        self.clock.advance(0)
        self.assertEqual((q._buffer_count, q.depth()), (0, 7_900))
        self.clock.advance(4.0)
        self.assertEqual(q._buffer_count, 0)
        self.assertEqual(self.read_all(q, 10_000), [rec(i % 10) for i in range(100, 8_000)])
        self.assertEqual(q.depth(), 0)
        q = self.reopen(q)
        self.assertEqual((q.depth(), q.read(10)), (0, []))

    def test_a_read_ahead_under_way_when_let_go_is_stale(self) -> None:
        """A read-ahead still on the disk lane when the queue lets its read-ahead go brings back
        records that are dropped; the disk thread reads them again for the next reader."""
        q = self.open(executor=ManualExecutor(), read_ahead_records=4)
        executor = q._executor
        assert isinstance(executor, ManualExecutor)
        calls: list[None] = []
        q.set_readable_callback(lambda: calls.append(None))
        executor.run()  # the load
        q.put_many([rec(i) for i in range(10)])
        self.clock.advance(0)
        executor.run()  # the write
        self.clock.advance(0)
        self.assertEqual(q.read(10), [])  # the first read starts the read-ahead
        executor.run()
        self.clock.advance(0)
        self.assertEqual(q.read(2), [rec(0), rec(1)])  # and a refill, which waits on the lane
        self.assertEqual(len(executor.jobs), 1)
        self.clock.advance(2.0)
        self.clock.advance(2.0)  # let go: the rewind goes on the lane behind the refill
        self.assertEqual(q._buffer_count, 0)
        told = len(calls)
        executor.run()
        self.clock.advance(0)
        self.assertEqual((q._buffer_count, len(calls)), (0, told))  # the refill's records dropped
        out: list[bytes] = []
        for _ in range(10):
            out.extend(q.read(10))
            executor.run()
            self.clock.advance(0)
        self.assertEqual(out, [rec(i) for i in range(2, 10)])

    def test_let_go_keeps_what_read_positions_handed_out(self) -> None:
        """Under --durable-delivery the read position moves only at a commit: records handed out
        and not yet committed are not read again after the read-ahead is let go."""
        q = self.open()
        q.put_many(rec(i) for i in range(10))
        self.clock.advance(0)
        self.assertEqual([r[0] for r in q.read_positions(3)], [rec(0), rec(1), rec(2)])
        first = q.read_mark()
        self.clock.advance(2.0)
        self.clock.advance(2.0)
        self.assertEqual(q._buffer_count, 0)
        self.assertEqual([r[0] for r in q.read_positions(10)], [rec(i) for i in range(3, 10)])
        q.commit_read(first)
        q = self.reopen(q)
        self.assertEqual(q.depth(), 7)
        self.assertEqual(self.read_all(q), [rec(i) for i in range(3, 10)])

    def test_a_commit_after_the_let_go_reads_nothing_ahead(self) -> None:
        """A commit of what was handed out before the read-ahead was let go (a journaled channel's
        FIN arriving later) moves the read position and reads nothing ahead."""
        q = self.open()
        q.put_many(rec(i) for i in range(10))
        self.clock.advance(0)
        self.assertEqual(len(q.read_positions(3)), 3)
        mark = q.read_mark()
        self.clock.advance(2.0)
        self.clock.advance(2.0)
        self.assertEqual(q._buffer_count, 0)
        q.commit_read(mark)
        self.clock.advance(0)
        self.assertEqual(q._buffer_count, 0)
        self.clock.advance(2.0)  # the tick hands the consumption to the disk
        self.assertEqual(self.meta(), b"7\n0,21\n0,70\n")
        self.assertEqual([r[0] for r in q.read_positions(10)], [rec(i) for i in range(3, 10)])

    def test_a_written_queue_reads_ahead_once_read(self) -> None:
        """Writes to a queue that was read are read ahead as they land, and its reader is told;
        the reader of a queue never read is told too, and its first read starts the read-ahead."""
        q = self.open(executor=ManualExecutor())
        executor = q._executor
        assert isinstance(executor, ManualExecutor)
        calls: list[None] = []
        q.set_readable_callback(lambda: calls.append(None))
        executor.run()  # the load
        q.put_many([b"a", b"b"])
        self.clock.advance(0)
        executor.run()  # the write: nothing read ahead, the reader told
        self.clock.advance(0)
        self.assertEqual((q._buffer_count, len(executor.jobs), len(calls)), (0, 0, 1))
        self.assertEqual(q.read(10), [])  # the first read starts a read-ahead
        executor.run()
        self.clock.advance(0)
        self.assertEqual((q.read(10), len(calls)), ([b"a", b"b"], 2))
        q.put(b"c")
        self.clock.advance(0)
        executor.run()  # the write, then its read-ahead, on the disk lane
        self.clock.advance(0)
        self.assertEqual((q._buffer_count, len(calls)), (1, 3))
        self.assertEqual(q.read(10), [b"c"])

    def test_fully_read_segments_deleted(self) -> None:
        """A segment is deleted once every record in it has been returned by read()."""
        q = self.open(max_bytes=21)  # 3 records per segment
        q.put_many(rec(i) for i in range(9))
        self.clock.advance(0)
        self.assertIn("t.diskqueue.000000.dat", self.listing())
        q.read(2)
        q.read(0)
        self.assertIn("t.diskqueue.000000.dat", self.listing())
        q.read(1)
        q.read(0)
        self.assertNotIn("t.diskqueue.000000.dat", self.listing())
        self.assertIn("t.diskqueue.000001.dat", self.listing())
        self.read_all(q)
        self.successResultOf(q.close())
        self.assertEqual(self.listing(), ["t.diskqueue.000002.dat", "t.diskqueue.meta.dat"])
        self.assertEqual(self.meta(), b"0\n2,21\n2,21\n")

    def test_reader_at_end_when_writer_rolls(self) -> None:
        """A reader that caught up at a full segment moves on when the writer rolls; no .bad file.

        go-diskqueue v1.1.0 (nsqd 1.3.0) renames such a segment to .bad; later
        go-diskqueue deletes it, which is what we do.
        """
        q = self.open(max_bytes=14)
        q.put_many([b"aaa", b"bbb"])
        self.clock.advance(0)
        self.assertEqual(q.read(10), [b"aaa", b"bbb"])
        q.put(b"ccc")
        self.clock.advance(0)
        self.assertEqual(q.read(10), [b"ccc"])
        self.assertEqual(q.depth(), 0)
        self.assertIsNone(q.health())
        self.successResultOf(q.close())
        self.assertEqual(self.listing(), ["t.diskqueue.000001.dat", "t.diskqueue.meta.dat"])
        self.assertEqual(self.meta(), b"0\n1,7\n1,7\n")


class DrainedTests(DiskQueueTestBase):
    """A queue read to its end gives back a segment of DRAINED_ROLL_BYTES or more (go-diskqueue keeps
    it until --max-bytes-per-file, so an always-drained queue filled a small disk)."""

    def big(self, i: int) -> bytes:
        return bytes([65 + i]) * (400 << 10)

    def open_big(self, **kw: Any) -> DiskQueue:
        return self.open(max_bytes=100 << 20, max_size=1 << 20, **kw)

    def test_a_drained_segment_gives_its_space_back(self) -> None:
        q = self.open_big()
        q.put_many(self.big(i) for i in range(3))  # 1.2 MiB
        self.clock.advance(0)
        self.assertEqual(self.read_all(q), [self.big(i) for i in range(3)])
        self.clock.advance(0)  # the next operation tells the disk side what was read
        self.assertEqual(self.listing(), ["t.diskqueue.meta.dat"])
        self.assertEqual(self.meta(), b"0\n1,0\n1,0\n")  # named before the old segment went
        q.put(b"next")
        self.clock.advance(0)
        self.assertEqual(self.listing(), ["t.diskqueue.000001.dat", "t.diskqueue.meta.dat"])
        self.assertEqual(self.read_all(q), [b"next"])
        self.assertIsNone(q.health())
        self.assertIsNone(q.corruption)
        q = self.reopen(q, max_bytes=100 << 20, max_size=1 << 20)
        self.assertEqual(self.meta(), b"0\n1,8\n1,8\n")
        self.assertEqual(q.depth(), 0)

    def test_a_small_drained_segment_is_kept(self) -> None:
        """Under the bound the files are go-diskqueue's exactly: light traffic does not churn segments
        (and with a --max-bytes-per-file under the bound, go-diskqueue's own roll bounds them)."""
        q = self.open_big()
        q.put_many([b"aaa", b"bbb"])
        self.clock.advance(0)
        self.read_all(q)
        q = self.reopen(q, max_bytes=100 << 20, max_size=1 << 20)
        self.assertEqual(self.meta(), b"0\n0,14\n0,14\n")
        self.assertIn("t.diskqueue.000000.dat", self.listing())

    def test_a_segment_with_a_record_left_is_kept(self) -> None:
        q = self.open_big()
        q.put_many(self.big(i) for i in range(3))
        self.clock.advance(0)
        self.assertEqual(q.read(2), [self.big(0), self.big(1)])
        self.clock.advance(0)
        self.assertIn("t.diskqueue.000000.dat", self.listing())
        self.assertEqual(self.read_all(q), [self.big(2)])
        self.assertEqual(q.depth(), 0)

    def test_durable_reads_give_it_back_once_committed(self) -> None:
        """--durable-delivery: read, but not yet committed (the journal is not fsynced), is not drained."""
        q = self.open_big(durable=True)
        q.put_many(self.big(i) for i in range(3))
        self.clock.advance(0)
        self.assertEqual(len(q.read_positions(10)), 3)
        self.clock.advance(0)
        q.put(b"next")
        self.clock.advance(0)
        self.assertIn("t.diskqueue.000000.dat", self.listing())
        q.commit_read(q.read_mark())
        self.assertEqual([r[0] for r in q.read_positions(10)], [b"next"])
        q.commit_read(q.read_mark())
        self.clock.advance(0)
        self.assertEqual(q.depth(), 0)
        self.successResultOf(q.close())
        self.assertEqual(self.meta(), b"0\n1,0\n1,0\n")  # committed to the end: it went
        self.assertEqual(self.listing(), ["t.diskqueue.meta.dat"])

    def test_a_crash_after_the_old_segment_went_and_before_its_metadata(self) -> None:
        """The metadata names a drained segment that is gone (its sync failed, then kill -9); the next
        segment holds acknowledged records: they are read, nothing is called corrupt."""
        self.write_file("t.diskqueue.meta.dat", b"0\n0,1228812\n0,1228812\n")
        self.write_file("t.diskqueue.000001.dat", framed(b"acked"))
        q = self.open_big(durable=True)
        self.assertEqual(q.depth(), 1)
        self.assertEqual([r[0] for r in q.read_positions(10)], [b"acked"])
        self.assertIsNone(q.corruption)
        self.assertEqual(q.segments_set_aside, 0)
        self.assertFalse(self.logged("is missing"))


class CorruptionTests(DiskQueueTestBase):
    def write_segments(self, count: int = 9, max_bytes: int = 21) -> None:
        q = self.open(max_bytes=max_bytes)
        q.put_many(rec(i) for i in range(count))
        self.clock.advance(0)
        self.successResultOf(q.close())

    def test_invalid_size(self) -> None:
        """An invalid record size renames the segment to .bad, skips to the next and fixes depth at the tail."""
        self.write_segments()
        data = bytearray(self.file("t.diskqueue.000001.dat"))
        data[7:11] = struct.pack(">i", 1 << 30)  # second record of segment 1
        self.write_file("t.diskqueue.000001.dat", bytes(data))
        told: list[int] = []
        q = self.open(max_bytes=21, on_set_aside=told.append)
        self.assertEqual(q.depth(), 9)
        self.assertEqual(self.read_all(q), [rec(i) for i in (0, 1, 2, 3, 6, 7, 8)])
        self.assertEqual(told, [1])  # the node's count is told as the queue's own grows
        self.assertIn("t.diskqueue.000001.dat.bad", self.listing())
        self.assertNotIn("t.diskqueue.000001.dat", self.listing())
        self.assertEqual(q.depth(), 0)
        self.assertTrue(self.logged("invalid message read size (1073741824)"))
        self.assertTrue(self.logged("saving bad file as"))
        self.assertEqual(q.segments_set_aside, 1)
        self.assertIn("positive depth at tail (2), data loss", q.corruption or "")
        self.assertIsNone(q.health())  # recovered from: the queue stays healthy (as Go nsqd)
        self.successResultOf(q.close())
        self.assertEqual(self.meta(), b"0\n2,21\n2,21\n")

    def test_truncated_record_in_write_segment(self) -> None:
        """A short record in the write segment: .bad, writes move to a new segment, depth corrected."""
        self.write_segments(count=5)  # segment 1 holds records 3 and 4, write position 1,14
        with open(os.path.join(self.path, "t.diskqueue.000001.dat"), "r+b") as f:
            f.truncate(10)
        q = self.open(max_bytes=21)
        self.assertEqual(self.read_all(q), [rec(i) for i in range(4)])
        self.assertEqual(q.depth(), 0)
        self.assertTrue(self.logged("unexpected EOF"))
        self.assertIn("data loss", q.corruption or "")
        self.assertIsNone(q.health())  # recovered from: the queue stays healthy (as Go nsqd)
        self.assertIn("t.diskqueue.000001.dat.bad", self.listing())
        q.put(b"new")
        self.clock.advance(0)
        self.assertEqual(q.read(10), [b"new"])
        self.successResultOf(q.close())
        self.assertEqual(self.meta(), b"0\n2,7\n2,7\n")

    def test_metadata_past_data(self) -> None:
        """Metadata whose write position lies past the data: read what exists, then .bad and depth 0."""
        self.write_segments(count=2)
        self.write_file("t.diskqueue.meta.dat", b"5\n0,0\n0,35\n")
        q = self.open(max_bytes=21)
        self.assertEqual(q.depth(), 5)
        self.assertEqual(self.read_all(q), [rec(0), rec(1)])
        self.assertEqual(q.depth(), 0)
        self.assertIn("t.diskqueue.000000.dat.bad", self.listing())
        self.assertTrue(self.logged("reading at 14 of"))
        self.successResultOf(q.close())
        self.assertEqual(self.meta(), b"0\n1,0\n1,0\n")

    def test_metadata_behind_data(self) -> None:
        """Write position behind the file's end (metadata not synced before a kill -9): new writes go
        to a new segment, the reader salvages the rest, and the depth counts the salvaged records from
        the start (go-diskqueue lets it go negative and logs "metadata corruption" at the tail)."""
        self.write_segments(count=3, max_bytes=100)
        self.write_file("t.diskqueue.meta.dat", b"1\n0,0\n0,7\n")
        q = self.open(max_bytes=100)
        self.assertTrue(self.logged("skipping to new file"))
        self.assertEqual(q.depth(), 3)
        q.put(b"new")
        self.clock.advance(0)
        self.assertEqual(q.depth(), 4)
        self.assertEqual(self.read_all(q), [rec(0), rec(1), rec(2), b"new"])
        self.assertEqual(q.depth(), 0)
        self.assertIsNone(q.corruption)
        self.assertIsNone(q.health())
        self.successResultOf(q.close())
        self.assertEqual(self.meta(), b"0\n1,7\n1,7\n")

    def test_stale_metadata_leaves_nothing_behind_a_depth_guarded_reader(self) -> None:
        """A reader that takes records only while ``depth()`` says there are some (the channel's
        delivery, one message per ready client) gets every record a stale metadata file leaves out.

        Before the depth counted them it stopped k records short, and stayed k behind after every
        later write: after a kill -9 the last messages of a channel were not delivered.
        """
        self.write_segments(count=3, max_bytes=100)
        self.write_file("t.diskqueue.meta.dat", b"1\n0,0\n0,7\n")
        q = self.open(max_bytes=100)
        self.clock.advance(0)
        got: list[bytes] = []

        def take() -> None:
            while q.depth() > 0 and (one := q.read(1)):
                got.extend(one)
                self.clock.advance(0)

        take()
        self.assertEqual(got, [rec(0), rec(1), rec(2)])
        q.put(b"new")
        self.clock.advance(0)
        take()
        self.assertEqual(got, [rec(0), rec(1), rec(2), b"new"])

    def test_records_written_before_the_first_metadata_sync_survive(self) -> None:
        """A kill -9 before a queue's first metadata write (``--sync-every`` not reached, the 2 s
        timer not run) leaves a segment 0 and no metadata file: its records are counted and
        delivered, and new writes go to a new segment instead of over them (go-diskqueue starts at
        writePos 0 and overwrites them; found by ``test_fault_matrix.py::test_kill9[default]``)."""
        self.write_segments(count=3, max_bytes=1000)
        os.remove(os.path.join(self.path, "t.diskqueue.meta.dat"))  # as a kill -9 left it
        q = self.open(max_bytes=1000)
        self.clock.advance(0)
        self.assertEqual(q.depth(), 3)
        q.put(b"new")
        self.clock.advance(0)
        got: list[bytes] = []
        while q.depth() > 0 and (one := q.read(10)):
            got.extend(one)
            self.clock.advance(0)
        self.assertEqual(got, [rec(0), rec(1), rec(2), b"new"])

    def test_stale_metadata_with_a_torn_record(self) -> None:
        """Only whole records past the stale writePos count; the torn end is met as go-diskqueue meets it."""
        self.write_segments(count=3, max_bytes=100)
        data = self.file("t.diskqueue.000000.dat")
        self.write_file("t.diskqueue.000000.dat", data + b"\x00\x00\x00\x09ab")
        self.write_file("t.diskqueue.meta.dat", b"1\n0,0\n0,7\n")
        q = self.open(max_bytes=100)
        self.assertEqual(q.depth(), 3)

    def test_read_position_past_write_position(self) -> None:
        """Read position beyond the write position is corruption: skip to fresh segments."""
        self.write_segments(count=2)
        self.write_file("t.diskqueue.meta.dat", b"0\n0,21\n0,14\n")
        q = self.open(max_bytes=21)
        self.assertEqual(q.depth(), 0)
        self.assertIn("readPos > writePos (21 > 14)", q.corruption or "")
        self.assertIsNone(q.health())  # recovered from: the queue stays healthy (as Go nsqd)
        self.successResultOf(q.close())
        self.assertEqual(self.meta(), b"0\n1,0\n1,0\n")
        self.assertEqual(self.listing(), ["t.diskqueue.meta.dat"])

    def test_missing_segment(self) -> None:
        """A missing finished segment is skipped like an unreadable one."""
        self.write_segments()
        os.remove(os.path.join(self.path, "t.diskqueue.000000.dat"))
        q = self.open(max_bytes=21)
        self.assertEqual(self.read_all(q), [rec(i) for i in range(3, 9)])
        self.assertEqual(q.depth(), 0)


class SyncTests(DiskQueueTestBase):
    def test_sync_every(self) -> None:
        """fsync (write segment + metadata) after every --sync-every writes."""
        q = self.open(sync_every=3)
        q.put_many([b"a", b"b"])
        self.clock.advance(0)
        self.assertEqual(self.hooks.fsyncs, 0)
        self.assertFalse(os.path.exists(os.path.join(self.path, "t.diskqueue.meta.dat")))
        q.put(b"c")
        self.clock.advance(0)
        self.assertEqual(self.hooks.fsyncs, 2)
        self.assertEqual(self.meta(), b"3\n0,0\n0,15\n")

    def test_sync_timeout(self) -> None:
        """With activity, fsync at least every --sync-timeout; without activity, never."""
        q = self.open(sync_timeout=2.0)
        self.clock.advance(2.0)
        self.assertEqual(self.hooks.fsyncs, 0)
        q.put(b"a")
        self.clock.advance(0)
        self.clock.advance(1.9)
        self.assertEqual(self.hooks.fsyncs, 0)
        self.clock.advance(0.1)
        self.assertEqual(self.hooks.fsyncs, 2)
        self.clock.advance(10)
        self.assertEqual(self.hooks.fsyncs, 2)

    def test_sync_timeout_persists_reads(self) -> None:
        """Reads count as activity: the timer persists the new read position."""
        q = self.open()
        q.put_many([b"a", b"b"])
        self.clock.advance(2.0)
        self.assertEqual(self.meta(), b"2\n0,0\n0,10\n")
        q.read(1)
        self.clock.advance(2.0)
        self.assertEqual(self.meta(), b"1\n0,5\n0,10\n")

    def test_sync_on_roll(self) -> None:
        """Starting a new segment fsyncs the old one and persists metadata."""
        q = self.open(max_bytes=10)
        q.put_many([b"aaaaaa", b"b"])
        self.clock.advance(0)
        self.assertEqual(self.hooks.fsyncs, 2)
        self.assertEqual(self.meta(), b"1\n0,0\n1,0\n")

    def test_a_read_ahead_comes_back_before_the_work_it_made_due(self) -> None:
        """A read-ahead that finishes a segment and makes a sync due replies first: the
        segment is removed and the metadata persisted after the reply, before the next
        operation, which reports how that sync went (a real disk takes milliseconds for
        each, and a reader waits for the read-ahead)."""
        q = self.open(max_bytes=10, sync_every=1)
        q.read(0)  # a reader: what is written is read ahead
        q.put_many([b"aaaaaa", b"bbbbbb", b"cccccc"])  # a segment each
        self.clock.advance(0)
        state = q._disk  # driven directly: the reactor's side has read one record
        fsyncs = self.hooks.fsyncs
        reply = state.run_waited((1, 1, 0), state.read_chunk, 10, 1 << 20)
        assert isinstance(reply, Reply)
        self.assertEqual(reply.value.value, [])  # the read-ahead already held the rest
        self.assertIsNone(reply.value.sync_error)  # no sync has run yet
        self.assertIn("t.diskqueue.000000.dat", self.listing())
        self.assertEqual(self.hooks.fsyncs, fsyncs)
        reply.after()
        self.assertNotIn("t.diskqueue.000000.dat", self.listing())
        self.assertGreater(self.hooks.fsyncs, fsyncs)
        self.assertEqual(self.meta(), b"2\n1,0\n2,10\n")
        self.assertEqual(state.run(None, lambda: None).sync_error, "")

    def test_a_write_comes_back_before_the_sync_it_made_due(self) -> None:
        """A write that makes a sync due replies first, as go-diskqueue answers the publisher whose
        write made the sync due before it syncs: the records count as written (publishers held
        back by a queue behind its disk go on) while the fsync and the metadata write run, before
        the queue's next operation, which reports how that sync went."""
        q = self.open(sync_every=2)
        q.put(b"a")
        self.clock.advance(0)
        state = q._disk  # driven directly, as the disk thread runs the queue's next write
        fsyncs = self.hooks.fsyncs
        reply = state.run_waited(None, state.write_batch, [b"b", b"c"])
        assert isinstance(reply, Reply)
        self.assertEqual(reply.value.value, (2, None))  # written: both records are in the segment
        self.assertIsNone(reply.value.sync_error)  # no sync has run yet
        self.assertEqual(self.hooks.fsyncs, fsyncs)
        self.assertFalse(os.path.exists(os.path.join(self.path, "t.diskqueue.meta.dat")))
        reply.after()
        self.assertEqual(self.hooks.fsyncs, fsyncs + 2)  # the segment, then the metadata's temp file
        self.assertEqual(self.meta(), b"3\n0,0\n0,15\n")
        self.assertEqual(state.run(None, lambda: None).sync_error, "")

    def test_held_back_publishers_go_on_before_the_sync(self) -> None:
        """What a write handed over counts as written (``written()`` fires: the publishers of a
        queue behind its disk go on) once write() returned; the fsync and the metadata write that
        write made due run after, before the queue's next job."""
        lane = AfterHeldExecutor()
        q = self.open(sync_every=2, executor=lane)
        q.put_many([b"a", b"b"])
        waited = q.written()
        self.clock.advance(0)
        self.successResultOf(waited)
        self.assertEqual(q.backlog(), 0)
        self.assertIsNotNone(lane.after)
        self.assertEqual(self.hooks.fsyncs, 0)  # not yet: it is what waits behind the reply
        lane.run_after()
        self.assertEqual(self.hooks.fsyncs, 2)  # the segment, then the metadata's temp file
        self.assertEqual(self.meta(), b"2\n0,0\n0,10\n")

    def test_a_write_that_makes_no_sync_due_has_nothing_after_it(self) -> None:
        """Below --sync-every a write's result is all there is: no work waits behind its reply."""
        q = self.open(sync_every=10)
        q.put(b"a")
        self.clock.advance(0)
        state = q._disk
        result = state.run_waited(None, state.write_batch, [b"b"])
        self.assertNotIsInstance(result, Reply)
        assert not isinstance(result, Reply)
        self.assertEqual(result.value, (1, None))

    def test_a_sync_after_a_write_that_fails_is_reported(self) -> None:
        """An fsync failing after a write's reply makes a queue that does nothing more unhealthy
        within SYNC_REPORT_DELAY, through an operation that runs after the sync on the disk lane,
        not at the next --sync-timeout tick; the records were written and stay readable."""
        executor = ManualExecutor()
        q = self.open(sync_every=1, executor=executor)
        self.hooks.fsync_fails = True
        q.put_many([b"a", b"b"])
        self.clock.advance(0)
        executor.run()  # the write's reply, then its failing sync
        self.assertEqual((q.backlog(), q.health(), self.hooks.writes), (0, None, 1))  # nobody waited for it
        self.clock.advance(SYNC_REPORT_DELAY)
        self.assertEqual(len(executor.jobs), 1)  # the operation that reports it, behind the sync
        executor.run()
        self.assertIn("failed to sync: [Errno 5] Input/output error", q.health() or "")
        self.assertTrue(self.logged("failed to sync"))
        self.assertEqual(self.read_all(q), [])  # (read-ahead on this lane waits for run())
        executor.run()
        self.clock.advance(0)
        self.assertEqual(self.read_all(q), [b"a", b"b"])

    def test_a_busy_queue_hears_of_its_syncs_without_an_extra_operation(self) -> None:
        """A queue with a write under way when SYNC_REPORT_DELAY passes hears how the sync before
        it went from that write: no operation is added for it (none per publish at --sync-every=1)."""
        executor = ManualExecutor()
        q = self.open(sync_every=1, executor=executor)
        q.put(b"a")
        self.clock.advance(0)
        executor.run()  # the write's reply, then its sync
        q.put(b"b")
        self.clock.advance(0)  # the next write, held on the lane
        self.clock.advance(SYNC_REPORT_DELAY)
        self.assertEqual([job[1].__name__ for job in executor.jobs], ["run_waited"])
        executor.run()
        self.clock.advance(SYNC_REPORT_DELAY)  # the last write's sync: nothing under way now
        self.assertEqual([job[2][1].__name__ for job in executor.jobs], ["report"])

    def test_a_sync_after_a_read_that_fails_is_reported(self) -> None:
        """An fsync failing after a read-ahead's reply makes the queue unhealthy within
        SYNC_REPORT_DELAY (an operation of its own reports it); records stay readable."""
        q = self.open(sync_every=1)
        q.put_many([b"a", b"b", b"c"])
        self.clock.advance(0)
        self.assertIsNone(q.health())
        self.hooks.fsync_fails = True
        self.assertEqual(q.read(1), [b"a"])  # the next read-ahead's sync fails after it replies
        self.clock.advance(SYNC_REPORT_DELAY)
        self.assertIn("failed to sync: [Errno 5] Input/output error", q.health() or "")
        self.assertTrue(self.logged("failed to sync"))
        self.assertEqual(self.read_all(q), [b"b", b"c"])

    def test_failed_fsync_is_unhealthy_until_a_sync_works(self) -> None:
        """A failing fsync makes the queue unhealthy (its listener, the node's /ping, hears it
        within SYNC_REPORT_DELAY, though nothing reads the queue: the sync runs after the write's
        reply, and an operation of its own reports it), the sync is tried again at each --sync-timeout tick,
        and health is OK once one works; the records stay readable meanwhile (the page cache
        holds them)."""
        self.hooks.fsync_fails = True
        heard: list[str | None] = []
        q = self.open(sync_every=1)
        q.watch_health(lambda _, error: heard.append(error))
        q.put(b"a")
        self.clock.advance(0)  # the write, and the sync after its reply
        self.assertEqual((self.hooks.writes, q.health()), (1, None))
        self.clock.advance(SYNC_REPORT_DELAY)  # the operation that reports it
        self.assertIn("failed to sync: [Errno 5] Input/output error", q.health() or "")
        self.assertEqual(heard, [q.health()])
        self.clock.advance(2.0)  # the retry fails too: nothing new to hear
        self.assertEqual(len(heard), 1)
        self.hooks.fsync_fails = False
        self.clock.advance(2.0)
        self.assertIsNone(q.health())
        self.assertEqual(heard[-1], None)
        self.assertEqual(self.meta(), b"1\n0,0\n0,5\n")  # the record's metadata made it too
        self.assertEqual(q.read(1), [b"a"])


class LifecycleTests(DiskQueueTestBase):
    def test_close_flushes_and_persists(self) -> None:
        """close() writes pending records, syncs and persists metadata; later puts fail."""
        q = self.open()
        q.put_many([b"a", b"b"])
        self.successResultOf(q.close())
        self.assertEqual(self.file("t.diskqueue.000000.dat"), framed(b"a") + framed(b"b"))
        self.assertEqual(self.meta(), b"2\n0,0\n0,10\n")
        self.assertRaises(BackendError, q.put, b"c")
        self.assertTrue(q._executor.stopped)  # type: ignore[attr-defined]
        q2 = self.open()
        self.assertEqual(q2.depth(), 2)

    def test_empty(self) -> None:
        """empty() drops every record, pending ones too, removes segments and keeps working."""
        q = self.open(max_bytes=21)
        q.put_many(rec(i) for i in range(7))
        self.clock.advance(0)
        q.read(2)
        q.put(b"pending")
        self.successResultOf(q.empty())
        self.assertEqual(q.depth(), 0)
        self.assertEqual(q.read(10), [])
        self.clock.advance(0)
        self.assertEqual(self.listing(), ["t.diskqueue.meta.dat"])
        self.assertEqual(self.meta(), b"0\n3,0\n3,0\n")
        q.put(b"after")
        self.clock.advance(0)
        self.assertEqual(q.read(10), [b"after"])
        q = self.reopen(q)
        self.assertEqual(q.depth(), 0)

    def test_delete(self) -> None:
        """delete() removes segments and metadata and closes the queue."""
        q = self.open(max_bytes=21)
        q.put_many(rec(i) for i in range(7))
        self.clock.advance(0)
        q.put(b"pending")
        self.successResultOf(q.delete())
        self.assertEqual(self.listing(), [])
        self.assertRaises(BackendError, q.put, b"x")
        self.failureResultOf(q.empty(), BackendError)

    def test_write_failure_and_recovery(self) -> None:
        """A failed write shows in health(); puts meanwhile wait in memory (backlog) and a later retry
        writes everything, in order."""
        q = self.open()
        q.put(b"a")
        self.clock.advance(0)
        self.hooks.fail = OSError(errno.ENOSPC, "No space left on device")
        q.put_many([b"b", b"c"])
        self.clock.advance(0)
        self.assertIn("No space left on device", q.health() or "")
        q.put(b"d")
        self.assertEqual(q.depth(), 4)
        self.assertEqual(q.backlog(), 3)
        self.clock.advance(1.0)  # retry still fails
        self.assertIsNotNone(q.health())
        self.hooks.fail = None
        self.clock.advance(1.0)
        self.assertIsNone(q.health())
        self.assertEqual(q.backlog(), 0)
        q.put(b"e")
        self.clock.advance(0)
        self.assertEqual(self.read_all(q), [b"a", b"b", b"c", b"d", b"e"])
        self.assertEqual(self.file("t.diskqueue.000000.dat"),
                         b"".join(framed(x) for x in (b"a", b"b", b"c", b"d", b"e")))

    def test_partial_batch_failure_across_segments(self) -> None:
        """When a batch fails after some segments were written, only the rest is retried."""
        q = self.open(max_bytes=10)
        self.hooks.fail_after = 1
        q.put_many([b"aaaaaa", b"bbbbbb", b"cccccc"])
        self.clock.advance(0)
        self.assertIsNotNone(q.health())
        self.assertEqual(q.read(10), [b"aaaaaa"])
        self.hooks.fail_after = None
        self.clock.advance(1.0)
        self.assertIsNone(q.health())
        self.assertEqual(self.read_all(q), [b"bbbbbb", b"cccccc"])
        self.assertEqual(q.depth(), 0)

    def test_close_while_failing(self) -> None:
        """close() tries the pending records once more and reports what it could not write."""
        q = self.open()
        self.hooks.fail = OSError(errno.EIO, "I/O error")
        q.put(b"a")
        self.clock.advance(0)
        self.failureResultOf(q.close(), BackendError)


class FakeThreadReactor:
    """callFromThread hands calls to the test thread through a queue."""

    def __init__(self) -> None:
        self.calls: queue.Queue[tuple[Callable[..., object], tuple[object, ...]]] = queue.Queue()

    def callFromThread(self, f: Callable[..., object], *args: object) -> None:
        self.calls.put((f, args))

    def run_one(self) -> None:
        f, args = self.calls.get(timeout=5)
        f(*args)


class ThreadPoolExecutorTests(SynchronousTestCase):
    def test_ordered_on_one_other_thread(self) -> None:
        """Jobs run in submission order, on one thread that is not the caller's."""
        reactor = FakeThreadReactor()
        executor = ThreadPoolDiskExecutor(reactor, name="test")  # type: ignore[arg-type]
        self.addCleanup(executor.stop)
        seen: list[tuple[int, int]] = []
        results: list[int] = []
        ds: list[Deferred[int]] = []
        for i in range(20):
            def job(i: int = i) -> int:
                seen.append((i, threading.get_ident()))
                return i
            ds.append(executor.submit(job))
        for d in ds:
            d.addCallback(results.append)
        for _ in range(20):
            reactor.run_one()
        self.assertEqual(results, list(range(20)))
        self.assertEqual([i for i, _ in seen], list(range(20)))
        threads = {t for _, t in seen}
        self.assertEqual(len(threads), 1)
        self.assertNotIn(threading.get_ident(), threads)


    def test_failure_and_stop(self) -> None:
        """A raising job fails its Deferred; stop() refuses new jobs but finishes queued ones."""
        reactor = FakeThreadReactor()
        executor = ThreadPoolDiskExecutor(reactor, name="test")  # type: ignore[arg-type]
        failing = executor.submit(lambda: 1 // 0)
        queued = executor.submit(lambda: "done")
        executor.stop()
        self.failureResultOf(executor.submit(lambda: None), BackendError)
        reactor.run_one()
        reactor.run_one()
        self.failureResultOf(failing, ZeroDivisionError)
        self.assertEqual(self.successResultOf(queued), "done")
        executor._thread.join(5)
        self.assertFalse(executor._thread.is_alive())


class ModelTests(DiskQueueTestBase):
    def test_random_operations_match_a_fifo(self) -> None:
        """Random puts, reads, turns, reopens and empties behave like an in-memory FIFO."""
        import random
        from collections import deque

        rnd = random.Random(1234)
        model: deque[bytes] = deque()
        opts: dict[str, Any] = {"max_bytes": 60, "read_ahead_records": 4, "read_ahead_bytes": 40}
        q = self.open(**opts)
        serial = 0
        for _ in range(3000):
            op = rnd.random()
            if op < 0.4:
                batch = []
                for _ in range(rnd.randint(1, 6)):
                    batch.append(f"r{serial}".encode() * rnd.randint(1, 4))
                    serial += 1
                q.put_many(batch)
                model.extend(batch)
            elif op < 0.75:
                got = q.read(rnd.randint(1, 8))
                self.assertEqual(got, [model.popleft() for _ in got])
            elif op < 0.95:
                self.clock.advance(rnd.choice([0, 0, 0.5, 2.0]))
            elif op < 0.99:
                q = self.reopen(q, **opts)
            else:
                self.successResultOf(q.empty())
                model.clear()
            self.assertEqual(q.depth(), len(model))
        self.clock.advance(0)
        self.assertEqual(self.read_all(q, limit=100000), list(model))
        self.assertIsNone(q.health())
        self.successResultOf(q.close())
        segments = [n for n in self.listing() if n.endswith(".dat") and "meta" not in n]
        self.assertLessEqual(len(segments), 1)
        self.assertFalse([n for n in self.listing() if n.endswith((".bad", ".tmp"))])


class IOPieceTests(DiskQueueTestBase):
    """Writes and read-aheads move at most IO_PIECE bytes a call: their buffers stay under glibc's mmap
    threshold (nsqtw.heap), where a bigger one was mapped, faulted in page by page and unmapped each
    time. The files and what is read back are the same."""

    def test_a_big_batch_is_written_in_pieces_and_read_back_whole(self) -> None:
        sizes: list[int] = []
        write = self.hooks.write

        def counted_write(fd: int, data: Any) -> int:
            sizes.append(len(data))
            return write(fd, data)
        self.hooks.write = counted_write  # type: ignore[method-assign]
        reads: list[int] = []
        pread = os.pread

        def counted_pread(fd: int, n: int, pos: int) -> bytes:
            reads.append(n)
            return pread(fd, n, pos)
        self.patch(os, "pread", counted_pread)
        records = [b"%05d" % i + b"x" * 200 for i in range(2000)]  # 418 KB framed
        q = self.open(max_bytes=8 << 20)
        q.put_many(records)
        self.clock.advance(0)
        self.assertEqual(sum(sizes), sum(4 + len(r) for r in records))
        self.assertGreater(len(sizes), 1)
        self.assertLessEqual(max(sizes), segments.IO_PIECE)
        with open(os.path.join(self.path, "t.diskqueue.000000.dat"), "rb") as f:
            self.assertEqual(f.read(), b"".join(struct.pack(">i", len(r)) + r for r in records))
        got: list[bytes] = []
        for _ in range(100):  # the read-ahead comes back a buffer at a time
            got.extend(self.read_all(q, limit=len(records) - len(got)))
            self.clock.advance(0)
        self.assertEqual(got, records)
        self.assertLessEqual(max(reads), segments.IO_PIECE)

    def test_a_short_write_goes_on_from_where_it_stopped(self) -> None:
        """A write that takes only part of what it is given is followed by one of the rest: the
        segment holds each record once, in order, and the queue's positions count every byte."""
        write = self.hooks.write
        self.hooks.write = lambda fd, data: write(fd, memoryview(data)[:7])  # type: ignore[method-assign]
        records = [b"%03d" % i + b"y" * i for i in range(30)]
        q = self.open()
        q.put_many(records)
        self.clock.advance(0)
        self.assertEqual(self.file("t.diskqueue.000000.dat"), b"".join(map(framed, records)))
        self.successResultOf(q.close())
        self.assertEqual(self.meta(), b"30\n0,0\n0,%d\n" % sum(4 + len(r) for r in records))
        self.hooks.write = write  # type: ignore[method-assign]
        self.assertEqual(self.read_all(self.open()), records)
