"""One --sync-timeout timer for all disk queues, and none at all while the node is idle."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.storage.sync import SyncSchedule


class Queue:
    def __init__(self) -> None:
        self.syncs = 0

    def sync_tick(self) -> None:
        self.syncs += 1


class SyncScheduleTests(SynchronousTestCase):
    def test_one_timer_for_many_queues(self) -> None:
        """A thousand active queues share one pending timer; each is synced once when it fires."""
        clock = Clock()
        schedule = SyncSchedule(clock, 2.0)
        queues = [Queue() for _ in range(1000)]
        for q in queues:
            schedule.mark(q)
            schedule.mark(q)  # more activity in the same window: still one sync
        self.assertEqual(len(clock.getDelayedCalls()), 1)
        clock.advance(1.9)
        self.assertEqual(sum(q.syncs for q in queues), 0)
        clock.advance(0.1)
        self.assertEqual([q.syncs for q in queues], [1] * 1000)

    def test_idle_means_no_timer(self) -> None:
        """After the tick, nothing is armed until a queue does something again."""
        clock = Clock()
        schedule = SyncSchedule(clock, 2.0)
        q = Queue()
        schedule.mark(q)
        clock.advance(2.0)
        self.assertEqual(clock.getDelayedCalls(), [])
        clock.advance(60)
        self.assertEqual(q.syncs, 1)
        schedule.mark(q)
        clock.advance(2.0)
        self.assertEqual(q.syncs, 2)

    def test_forgotten_and_disabled(self) -> None:
        """A closed queue is not synced; an interval of 0 arms nothing."""
        clock = Clock()
        schedule = SyncSchedule(clock, 2.0)
        q = Queue()
        schedule.mark(q)
        schedule.forget(q)
        clock.advance(2.0)
        self.assertEqual(q.syncs, 0)
        off = SyncSchedule(clock, 0)
        off.mark(q)
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_disk_queues_share_it(self) -> None:
        """Idle disk queues on a shared schedule leave no timer behind (no per-queue work while idle),
        and no descriptor open: the tick after the one that synced them gives their files back."""
        import shutil
        import tempfile

        from nsqtw.storage.diskqueue import DiskQueue
        from nsqtw.storage.executor import SynchronousDiskExecutor

        path = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, path)
        clock = Clock()
        schedule = SyncSchedule(clock, 2.0)
        queues = [DiskQueue(f"q{i}", path, 1 << 20, 1, 1 << 20, 2500, 2.0, clock, SynchronousDiskExecutor(),
                            sync_schedule=schedule) for i in range(50)]
        for q in queues:
            q.put(b"x")
        clock.advance(0)
        self.assertEqual(len(clock.getDelayedCalls()), 1)  # the shared sync timer only
        clock.advance(2.0)
        with open(f"{path}/q7.diskqueue.meta.dat", "rb") as f:
            self.assertEqual(f.read(), b"1\n0,0\n0,5\n")  # the tick synced and persisted it
        self.assertEqual(len(clock.getDelayedCalls()), 1)  # their write descriptors are still open
        self.assertTrue(all(q._disk.files_open() for q in queues))
        clock.advance(2.0)
        self.assertEqual(clock.getDelayedCalls(), [])
        self.assertFalse(any(q._disk.files_open() for q in queues))

    def test_descriptors_are_given_back_with_syncs_off(self) -> None:
        """With --sync-timeout=0 nothing is synced by time, but idle queues still close their files."""
        clock = Clock()
        schedule = SyncSchedule(clock, 0)
        q = Queue()
        schedule.watch(q)
        clock.advance(2.0)
        self.assertEqual(q.syncs, 1)
        self.assertEqual(clock.getDelayedCalls(), [])
