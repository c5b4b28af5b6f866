"""Descriptors of disk queues: none held while a queue idles, and running out of them is never corruption.

A node with 30,000 topics restarted on a hard limit of 20,000 descriptors
used to open (and keep) a read descriptor per queue, run out, and rename
every segment it could not open to ``.bad``: their messages were skipped
from then on. Here a queue opens a segment when it reads or writes it and
gives it back once idle, and an ``OSError`` that says nothing about the
data (EMFILE, ENFILE, ENOMEM, EIO, EACCES) leaves every file as it is:
the queue reports it and tries again. Only bad data sets a segment aside.
"""

from __future__ import annotations

import errno
import os
import struct
from typing import Any

from nsqtw.storage.diskqueue import DiskQueue
from nsqtw.storage.segments import DiskState, LoadError
from tests.unit.test_diskqueue import DiskQueueTestBase, rec

#: the errors a process meets for want of something other than good data
RESOURCE_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EIO, errno.EACCES)


class Opens:
    """``os.open`` that counts the files opened and fails with ``error`` for names ending in ``suffix``."""

    def __init__(self) -> None:
        self.error: int | None = None
        self.suffix = ""
        self.opened: list[str] = []

    def __call__(self, path: str, flags: int, mode: int = 0o777) -> int:
        if self.error is not None and path.endswith(self.suffix):
            raise OSError(self.error, os.strerror(self.error), path)
        self.opened.append(os.path.basename(path))
        return os.open(path, flags, mode)

    def fail(self, error: int | None, suffix: str = "") -> None:
        self.error, self.suffix = error, suffix


class CountedOpensBase(DiskQueueTestBase):
    """Queues whose files are opened through :class:`Opens`."""

    def setUp(self) -> None:
        super().setUp()
        self.opens = Opens()

    def open(self, name: str = "t", max_bytes: int = 1 << 20, min_size: int = 1, max_size: int = 1 << 16,
             sync_every: int = 2500, sync_timeout: float = 2.0, **kw: Any) -> DiskQueue:
        kw.setdefault("open_fn", self.opens)
        return super().open(name, max_bytes, min_size, max_size, sync_every, sync_timeout, **kw)


class DescriptorTests(CountedOpensBase):

    def test_a_queue_nobody_reads_holds_no_descriptor(self) -> None:
        """Loaded with records on disk, a queue opens no segment until it is read (a topic without
        channels, a channel without clients: a node restarting with 30,000 of them holds none)."""
        q = self.open()
        q.put_many(rec(i) for i in range(20))
        self.clock.advance(0)
        q = self.reopen(q)
        self.clock.advance(0)
        self.assertEqual(q.depth(), 20)
        self.assertFalse(q._disk.files_open())
        self.assertNotIn("t.diskqueue.000000.dat", self.opens.opened[-1:])
        self.assertEqual(self.read_all(q), [rec(i) for i in range(20)])

    def test_a_read_ahead_nobody_takes_gives_its_descriptor_back(self) -> None:
        """A read-ahead with no reader behind it (the records wait in memory) closes its segment."""
        q = self.open(read_ahead_records=5)
        q.put_many(rec(i) for i in range(20))
        self.clock.advance(0)
        q = self.reopen(q, read_ahead_records=5)
        self.assertEqual(len(q.read(1)), 1)  # the first read reads ahead
        self.clock.advance(0)
        self.assertTrue(q._disk.files_open())  # read, and more to read: kept for the next refill
        self.assertEqual(self.read_all(q), [rec(i) for i in range(1, 20)])
        self.assertFalse(q._disk.files_open())  # read to the end, nobody writing: given back

    def test_a_reader_keeps_its_descriptor_while_it_drains(self) -> None:
        """The hot path stays as it was: a queue being read opens its segment once, not per read-ahead."""
        q = self.open(read_ahead_records=10)
        q.put_many(rec(i) for i in range(200))
        self.clock.advance(0)
        q = self.reopen(q, read_ahead_records=10)
        self.opens.opened.clear()
        got = []
        while len(got) < 200:
            batch = q.read(10)
            self.assertTrue(batch)
            got.extend(batch)
        self.assertEqual(got, [rec(i) for i in range(200)])
        self.assertEqual([n for n in self.opens.opened if n.endswith("000000.dat")], ["t.diskqueue.000000.dat"])

    def test_an_idle_queue_gives_its_descriptors_back_within_two_ticks(self) -> None:
        """Written and read, a queue keeps its descriptors while busy; the sync tick syncs it, the
        next one (nothing done in between) closes its files; a later write opens its segment again
        without a second ``writeOne() opened`` line."""
        q = self.open()
        q.put_many(rec(i) for i in range(5))
        self.clock.advance(0)
        self.assertEqual(q.read(2), [rec(0), rec(1)])
        self.assertTrue(q._disk.files_open())
        self.clock.advance(2.0)  # --sync-timeout: synced, files kept (it was busy)
        self.assertEqual(self.meta(), b"3\n0,14\n0,35\n")
        self.assertTrue(q._disk.files_open())
        self.clock.advance(2.0)
        self.assertFalse(q._disk.files_open())
        self.assertEqual(self.clock.getDelayedCalls(), [])
        q.put(rec(5))
        self.clock.advance(0)
        self.assertEqual(self.read_all(q), [rec(i) for i in range(2, 6)])
        opened = [e for e in self.events if "writeOne() opened" in str(e.get("log_format"))]
        self.assertEqual(len(opened), 1)

    def test_an_idle_queue_fsyncs_before_it_closes(self) -> None:
        """Records written since the last sync are fsynced before their descriptor goes (a later
        sync would have none to fsync them through)."""
        q = self.open(sync_timeout=0)  # no sync by time: only the idle release syncs
        q.put_many(rec(i) for i in range(3))
        self.clock.advance(0)
        fsyncs = self.hooks.fsyncs
        self.clock.advance(2.0)
        self.clock.advance(2.0)
        self.assertFalse(q._disk.files_open())
        self.assertGreater(self.hooks.fsyncs, fsyncs)
        self.assertEqual(self.meta(), b"3\n0,0\n0,21\n")


class ResourceErrorTests(CountedOpensBase):

    def test_out_of_descriptors_at_a_read_sets_nothing_aside(self) -> None:
        """EMFILE (and ENFILE, ENOMEM, EIO, EACCES) opening a segment to read: the queue is unhealthy
        and reads nothing, no segment is renamed ``.bad``, no record skipped; once it can open
        files again the retry reads every record."""
        for error in RESOURCE_ERRORS:
            with self.subTest(error=errno.errorcode[error]):
                for f in os.listdir(self.path):
                    os.remove(os.path.join(self.path, f))
                q = self.open(max_bytes=21)  # 3 records a segment
                q.put_many(rec(i) for i in range(8))
                self.clock.advance(0)
                q = self.reopen(q, max_bytes=21)
                self.opens.fail(error, ".dat")
                self.assertEqual(q.read(10), [])
                self.clock.advance(0)
                self.assertEqual(q.read(10), [])
                self.assertIn(os.strerror(error), q.health() or "")
                self.assertEqual(q.depth(), 8)
                self.assertEqual(q.segments_set_aside, 0)
                self.assertFalse([f for f in self.listing() if f.endswith(".bad")])
                self.opens.fail(None)
                self.clock.advance(1.0)  # the retry
                self.assertEqual(self.read_all(q), [rec(i) for i in range(8)])
                self.assertIsNone(q.health())
                self.successResultOf(q.close())

    def test_a_read_that_keeps_failing_is_logged_once(self) -> None:
        """Retried every second, a read that keeps failing the same way logs one ERROR, and one line
        when it works again (10,000 queues out of descriptors would otherwise log 10,000 a second)."""
        q = self.open()
        q.put_many(rec(i) for i in range(3))
        self.clock.advance(0)
        q = self.reopen(q)
        self.opens.fail(errno.EMFILE, ".dat")
        self.assertEqual(q.read(10), [])
        for _ in range(5):
            self.clock.advance(1.0)
        self.opens.fail(None)
        self.clock.advance(1.0)
        self.assertEqual(self.read_all(q), [rec(i) for i in range(3)])
        lines = [str(e.get("text", e.get("log_format"))) for e in self.events]
        self.assertEqual(len([line for line in lines if "Too many open files" in line]), 1)
        self.assertEqual(len([line for line in lines if "reads work again" in line]), 1)

    def test_out_of_descriptors_at_load_touches_no_file(self) -> None:
        """The metadata cannot be opened: the queue is not loaded (nothing is written at position
        0 over its records, as go-diskqueue would), is unhealthy and tries again; writes wait.
        Once it loads, old and new records come out in order."""
        q = self.open()
        q.put_many(rec(i) for i in range(4))
        self.clock.advance(0)
        self.successResultOf(q.close())
        before = {f: self.file(f) for f in self.listing()}
        self.opens.fail(errno.EMFILE, "meta.dat")
        q = self.open()
        self.assertIn("Too many open files", q.load_error or "")
        self.assertIn("failed to load", q.health() or "")
        q.put_many(rec(i) for i in range(4, 6))
        self.clock.advance(0)
        self.assertEqual({f: self.file(f) for f in self.listing()}, before)
        self.assertIn("Too many open files", q.write_error or "")
        self.opens.fail(None)
        self.clock.advance(1.0)  # the load and the write are retried
        self.assertIsNone(q.health())
        self.assertEqual(q.depth(), 6)
        self.assertEqual(self.read_all(q), [rec(i) for i in range(6)])

    def test_a_write_that_cannot_open_its_segment_keeps_its_records(self) -> None:
        """EMFILE creating a segment: the records wait in memory and are written by the retry."""
        q = self.open()
        self.opens.fail(errno.EMFILE, ".dat")
        q.put_many(rec(i) for i in range(3))
        self.clock.advance(0)
        self.assertIn("Too many open files", q.health() or "")
        self.assertEqual(q.backlog(), 3)
        self.opens.fail(None)
        self.clock.advance(1.0)
        self.assertIsNone(q.health())
        self.assertEqual(self.read_all(q), [rec(i) for i in range(3)])


class DiskStateTests(DiskQueueTestBase):
    """The same rules one level down, on the disk thread's :class:`DiskState`."""

    def state(self, opens: Opens) -> DiskState:
        return DiskState("t", self.path, 1 << 20, 1, 1 << 16, 2500, os.write, lambda fd: None, open_fn=opens)

    def segment(self, records: list[bytes]) -> None:
        self.write_file("t.diskqueue.000000.dat", b"".join(struct.pack(">i", len(r)) + r for r in records))
        size = sum(4 + len(r) for r in records)
        self.write_file("t.diskqueue.meta.dat", f"{len(records)}\n0,0\n0,{size}\n".encode())

    def test_emfile_is_reported_and_bad_data_is_set_aside(self) -> None:
        """An injected EMFILE opening the segment comes back as ``read_error`` with the segment in
        place; a record with an impossible size is corruption and renames it ``.bad``."""
        self.segment([b"aaa", b"bbb"])
        opens = Opens()
        disk = self.state(opens)
        disk.run(None, disk.load)
        opens.fail(errno.EMFILE, "000000.dat")
        result = disk.run(None, disk.read_chunk, 10, 1 << 20)
        self.assertEqual(result.value, [])
        self.assertIn("Too many open files", result.read_error or "")
        self.assertEqual(result.set_aside, 0)
        self.assertIsNone(result.corruption)
        self.assertIn("t.diskqueue.000000.dat", self.listing())
        opens.fail(None)
        result = disk.run(None, disk.read_chunk, 10, 1 << 20)
        self.assertEqual(result.value, [(0, 0, [b"aaa", b"bbb"], 6)])
        self.assertEqual(result.read_error, "")

        self.segment([b"ccc"])
        self.write_file("t.diskqueue.000000.dat", struct.pack(">i", 1 << 30) + b"ccc")
        disk = self.state(Opens())
        disk.run(None, disk.load)
        result = disk.run(None, disk.read_chunk, 10, 1 << 20)
        self.assertEqual(result.set_aside, 1)
        self.assertIn("t.diskqueue.000000.dat.bad", self.listing())

    def test_a_finished_segment_is_sized_once_however_many_pieces_read_it(self) -> None:
        """A read-ahead reads 64 KiB at a time, and each piece needs its segment's end. A finished
        segment's size cannot change, so it is looked up once (each lookup is a system call: a
        GIL release and take on the disk thread, against a reactor that holds it); the write
        segment's end is the write position. Removing the segment forgets it."""
        body = b"x" * 1000
        segment = b"".join(struct.pack(">i", len(body)) + body for _ in range(200))  # 4 pieces each
        for num in range(3):
            self.write_file(f"t.diskqueue.{num:06d}.dat", segment)
        self.write_file("t.diskqueue.meta.dat", f"600\n0,0\n2,{len(segment)}\n".encode())
        disk = self.state(Opens())
        disk.run(None, disk.load)
        sized: list[Any] = []
        real_stat, real_fstat = os.stat, os.fstat

        def stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
            if str(path).endswith(".dat") and "meta" not in str(path):
                sized.append(os.path.basename(path))
            return real_stat(path, *args, **kwargs)

        def fstat(fd: int) -> os.stat_result:
            sized.append(fd)
            return real_fstat(fd)

        self.patch(os, "stat", stat)
        self.patch(os, "fstat", fstat)
        runs = []
        while True:
            chunks = disk.run(None, disk.read_chunk, 100, 1 << 20).value
            if not chunks:
                break
            runs.extend((num, len(records)) for num, _, records, _ in chunks)
        self.assertEqual(sum(n for _, n in runs), 600)
        self.assertEqual(sorted({num for num, _ in runs}), [0, 1, 2])
        # segment 1 once (segment 0 was sized by the load), where each piece sized its segment twice
        self.assertEqual(sized, ["t.diskqueue.000001.dat"])
        disk._remove_segment(1)
        self.assertIsNone(disk._segment_size(1))

    def test_a_load_that_cannot_open_raises_and_changes_nothing(self) -> None:
        """Every operation on an unloaded state loads first; a load that fails for want of
        descriptors raises :class:`LoadError` before anything is written or persisted."""
        self.segment([b"aaa", b"bbb"])
        before = {f: self.file(f) for f in self.listing()}
        opens = Opens()
        opens.fail(errno.EMFILE)
        disk = self.state(opens)
        for op, args in ((disk.load, ()), (disk.write_batch, ([b"ccc"],)), (disk.close, ([b"ccc"],))):
            with self.assertRaises(LoadError):
                disk.run(None, op, *args)
        self.assertEqual({f: self.file(f) for f in self.listing()}, before)
        opens.fail(None)
        self.assertEqual(disk.run(None, disk.load).loaded, 2)
