"""A graceful stop at scale: one syncfs for the queues it closes, nothing rewritten that did not change,
and a report of unflushed records that names only what is not on disk.

A node of 30,000 topics, a message in each, stopped in 15 to 75 s on this
project's disk and logged up to 21,777 "could not be flushed" lines though
every record was written: its queues made two fsyncs each (60,000), the
stop gave up after 10 s, and the disk threads went on writing after the
report. Here the fsyncs of a stop's closes are one ``syncfs`` per round
(:mod:`nsqtw.storage.groupsync`), a queue with nothing new writes no
metadata, the stop gives up only after 10 s in which no queue closed, and
when it does the disk threads run nothing more before the report.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from types import SimpleNamespace
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.errors import BackendError
from nsqtw.nsqd.service import unflushed
from nsqtw.storage.diskqueue import DiskQueue
from nsqtw.storage.executor import DiskPool, SynchronousDiskExecutor
from nsqtw.storage.groupsync import GroupSync, load_syncfs
from tests.helpers import ManualExecutor, make_nsqd
from tests.unit.test_disk_pool import ThreadCalls
from tests.unit.test_diskqueue import DiskQueueTestBase, rec


class SyncCalls:
    """A ``syncfs`` that counts its calls and fails on demand."""

    def __init__(self) -> None:
        self.calls = 0
        self.fail = False

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.fail:
            raise OSError(errno.EIO, os.strerror(errno.EIO))


class GroupSyncTests(SynchronousTestCase):
    def group(self) -> tuple[GroupSync, ManualExecutor, SyncCalls]:
        executor, syncfs = ManualExecutor(), SyncCalls()
        group = GroupSync(os.getcwd(), executor, syncfs)
        armed = group.arm()
        executor.run()
        self.successResultOf(armed)
        self.assertTrue(group.armed)
        self.addCleanup(lambda: (group.disarm(), executor.run()))
        return group, executor, syncfs

    def test_the_syncfs_is_found_here(self) -> None:
        """Linux's C library has syncfs: the stop's fsyncs are grouped where nsqtw runs."""
        if not os.path.exists("/proc/self"):
            self.skipTest("not Linux")
        self.assertIsNotNone(load_syncfs())

    def test_who_asks_during_a_round_waits_for_the_next(self) -> None:
        """The first request starts a round at once; all that come while it waits on the disk share
        one more syncfs, begun after they asked; each ``then`` hears it worked."""
        group, executor, syncfs = self.group()
        first = group.sync(lambda ok: ("first", ok))
        later = [group.sync(lambda ok, i=i: (i, ok)) for i in range(100)]
        executor.run()
        self.assertEqual(self.successResultOf(first), ("first", True))
        self.assertEqual([self.successResultOf(d) for d in later], [(i, True) for i in range(100)])
        self.assertEqual((syncfs.calls, group.rounds), (2, 2))

    def test_a_round_serves_at_most_round_max(self) -> None:
        """5,000 queues waiting: rounds of at most ROUND_MAX, each a syncfs and its renames, so the
        stop sees queues finish closing all along (it gives up only when none do)."""
        from nsqtw.storage.groupsync import ROUND_MAX

        group, executor, syncfs = self.group()
        first = group.sync(lambda ok: ok)
        rest = [group.sync(lambda ok: ok) for _ in range(5000)]
        executor.run()
        self.assertIs(self.successResultOf(first), True)
        self.assertTrue(all(self.successResultOf(d) for d in rest))
        self.assertEqual(syncfs.calls, 1 + -(-5000 // ROUND_MAX))

    def test_a_failed_syncfs_tells_each_then(self) -> None:
        """A syncfs that fails hands ``False`` to every ``then`` of its round (each syncs on its own)."""
        group, executor, syncfs = self.group()
        syncfs.fail = True
        d = group.sync(lambda ok: ok)
        executor.run()
        self.assertIs(self.successResultOf(d), False)


class GroupedCloseTests(DiskQueueTestBase):
    def setUp(self) -> None:
        super().setUp()
        self.lane = ManualExecutor()
        self.syncfs = SyncCalls()
        self.group = GroupSync(self.path, self.lane, self.syncfs)
        self.group.arm()
        self.lane.run()
        self.addCleanup(lambda: (self.group.disarm(), self.lane.run()))

    def test_closes_share_one_syncfs_and_no_fsync(self) -> None:
        """Twenty queues closing at a stop: their records and metadata reach the disk with one syncfs
        and no fsync of their own; the new metadata replaces the old only after it; then they read back."""
        queues = [self.open(f"t{i}", group_sync=self.group) for i in range(20)]
        for i, q in enumerate(queues):
            q.put_many(rec(j) for j in range(i + 1))
        closes = [q.close() for q in queues]
        self.assertEqual([f for f in self.listing() if f.endswith("meta.dat")], [])
        self.assertEqual(len([f for f in self.listing() if f.endswith(".tmp")]), 20)
        self.lane.run()
        for d in closes:
            self.successResultOf(d)
        # the first queue's round began before the others asked; they share the second
        self.assertEqual((self.syncfs.calls, self.hooks.fsyncs), (2, 0))
        self.assertEqual([f for f in self.listing() if f.endswith(".tmp")], [])
        self.assertEqual(self.meta("t4"), b"5\n0,0\n0,35\n")
        self.queues.clear()
        for i in range(20):
            self.assertEqual(self.read_all(self.open(f"t{i}")), [rec(j) for j in range(i + 1)])

    def test_a_failed_syncfs_leaves_each_queue_to_its_own_fsyncs(self) -> None:
        """The syncfs fails: each queue fsyncs its segment and writes its metadata as it always did."""
        self.syncfs.fail = True
        q = self.open("t", group_sync=self.group)
        q.put_many(rec(j) for j in range(3))
        d = q.close()
        self.lane.run()
        self.successResultOf(d)
        self.assertGreaterEqual(self.hooks.fsyncs, 2)  # the segment, the metadata's temp file
        self.assertEqual(self.meta("t"), b"3\n0,0\n0,21\n")
        self.assertEqual([f for f in self.listing() if f.endswith(".tmp")], [])

    def test_a_queue_with_nothing_new_writes_nothing_at_close(self) -> None:
        """Loaded and left alone, a queue's close rewrites no metadata and syncs nothing (a restart of
        30,000 idle topics stops without touching 30,000 files)."""
        q = self.open("t")
        q.put_many(rec(j) for j in range(3))
        self.successResultOf(q.close())
        before = os.stat(os.path.join(self.path, "t.diskqueue.meta.dat"))
        fsyncs = self.hooks.fsyncs
        q = self.open("t", group_sync=self.group)
        self.clock.advance(0)
        self.successResultOf(q.close())
        after = os.stat(os.path.join(self.path, "t.diskqueue.meta.dat"))
        self.assertEqual((after.st_ino, after.st_mtime_ns), (before.st_ino, before.st_mtime_ns))
        self.assertEqual((self.hooks.fsyncs, self.syncfs.calls), (fsyncs, 0))


class UnflushedReportTests(DiskQueueTestBase):
    def test_a_record_the_close_could_not_write_is_reported(self) -> None:
        """The one case for the warning: the write at close fails (a full disk); the record is not on
        disk and the stop's report names its topic; a topic whose close wrote is not named."""
        nsqd, clock = make_nsqd(mem_queue_size=10)
        failing: set[str] = set()

        def backend(name: str) -> DiskQueue:
            def write(fd: int, data: Any) -> int:
                if name in failing:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                return os.write(fd, data)

            return DiskQueue(name, self.path, 1 << 20, 1, 1 << 16, 2500, 2.0, clock, SynchronousDiskExecutor(),
                             write_fn=write, fsync_fn=self.hooks.fsync, flush_interval=0.0)

        nsqd.make_backend = lambda name, ephemeral: backend(name)  # type: ignore[method-assign]
        ok, full = nsqd.get_topic("ok"), nsqd.get_topic("full")
        for topic in (ok, full):
            nsqd.publish(topic.name, [b"hello"])
        clock.advance(0)
        failing.add("full")
        nsqd.close()
        clock.advance(0)
        report = dict(unflushed(nsqd))
        self.assertEqual(list(report), ["TOPIC(full)"])
        self.assertIn("1 records not written", report["TOPIC(full)"])


class HaltTests(SynchronousTestCase):
    def test_halt_runs_nothing_queued_but_the_kept_lane_and_waits_for_the_running_job(self) -> None:
        """A stop that gives up halts the disk threads: a job already running ends and its result comes
        back before the halt's Deferred fires; queued jobs fail with BackendError and never run; the
        lane kept (nsqd.dat's) still runs."""
        reactor = ThreadCalls()
        pool = DiskPool(reactor, 1)  # type: ignore[arg-type]
        self.addCleanup(pool.stop)
        busy, meta = pool.lane("busy"), pool.lane("metadata")
        started, release = threading.Event(), threading.Event()
        ran: list[str] = []

        def slow() -> str:
            started.set()
            release.wait(10)
            ran.append("slow")
            return "slow"

        order: list[str] = []
        busy.submit(slow).addCallback(order.append)
        started.wait(10)
        queued = busy.submit(lambda: ran.append("queued"))
        failures: list[Any] = []
        queued.addErrback(failures.append)
        halted = pool.halt(keep=meta)
        halted.addCallback(lambda _: order.append("halted"))
        release.set()
        reactor.run_until(lambda: "halted" in order)
        self.assertEqual(order, ["slow", "halted"])
        reactor.run_until(lambda: bool(failures))
        self.assertTrue(failures[0].check(BackendError))
        kept: list[str] = []
        meta.submit(lambda: "nsqd.dat").addCallback(kept.append)
        reactor.run_until(lambda: bool(kept))
        time.sleep(0.05)
        self.assertEqual(ran, ["slow"])


class FakeNode:
    """What ``_close_within`` asks of the node: a close that ends when the test says, and its topics."""

    def __init__(self) -> None:
        self.closing: Deferred[None] = Deferred()
        self.topics: dict[str, Any] = {}

    def close(self) -> Deferred[None]:
        return self.closing


class StopDeadlineTests(SynchronousTestCase):
    """The stop's deadline counts from the last queue that finished closing, not from the SIGTERM."""

    def stop(self) -> tuple[Any, Clock, Deferred[None], list[str]]:
        from twisted.logger import Logger, formatEvent

        from nsqtw.nsqd.service import NSQDService

        clock = Clock()
        errors: list[str] = []
        service = SimpleNamespace(nsqd=FakeNode(), reactor=clock, stop_progress=0, disk_pool=None,
                                  meta_executor=None,
                                  log=Logger(observer=lambda e: errors.append(formatEvent(e))))
        done = Deferred.fromCoroutine(NSQDService._close_within(service, 10.0))  # type: ignore[arg-type]
        return service, clock, done, errors

    @staticmethod
    def tick(clock: Clock, seconds: float) -> None:
        """Time passes a second at a time (``Clock.advance`` runs every call due at the end time)."""
        for _ in range(int(seconds)):
            clock.advance(1.0)

    def test_a_stop_that_keeps_closing_queues_is_not_cut_short(self) -> None:
        """Queues finish closing every few seconds for a minute: the stop waits for all of them and
        reports nothing (a healthy disk with 30,000 topics may take longer than 10 s)."""
        service, clock, done, errors = self.stop()
        for _ in range(20):
            self.tick(clock, 3.0)
            service.stop_progress += 1
        self.assertNoResult(done)
        service.nsqd.closing.callback(None)
        self.successResultOf(done)
        self.assertEqual(errors, [])

    def test_no_queue_closing_for_the_deadline_gives_up(self) -> None:
        """Queues stop closing (a failing disk): 10 s later the stop gives up and says so."""
        service, clock, done, errors = self.stop()
        self.tick(clock, 5.0)
        service.stop_progress += 1
        self.tick(clock, 9.0)
        self.assertNoResult(done)
        self.tick(clock, 2.0)
        self.successResultOf(done)
        self.assertEqual(len(errors), 1)
        self.assertIn("no queue moved on flushing for 10.0s", errors[0])
