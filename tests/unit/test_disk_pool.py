"""The shared disk pool: each lane in order, lanes in parallel, no lane starving another."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from nsqtw.errors import BackendError
from nsqtw.interfaces import IDiskExecutor
from nsqtw.storage.executor import DiskPool, Reply, SynchronousDiskExecutor


class ThreadCalls:
    """Stands in for the reactor: keeps what the pool's threads hand back, for the test to run."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]]] = queue.SimpleQueue()

    def callFromThread(self, f: Callable[..., Any], *args: Any) -> None:
        self.calls.put((f, args))

    def run_until(self, done: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, "the pool did not finish in time"
            try:
                f, args = self.calls.get(timeout=0.05)
            except queue.Empty:
                continue
            f(*args)


class DiskPoolTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = ThreadCalls()

    def pool(self, threads: int) -> DiskPool:
        pool = DiskPool(self.reactor, threads)  # type: ignore[arg-type]
        self.addCleanup(pool.stop)
        return pool

    def test_a_lane_is_a_disk_executor(self) -> None:
        """A lane provides IDiskExecutor, so disk queues and journals take it unchanged."""
        self.assertTrue(verifyObject(IDiskExecutor, self.pool(1).lane("t")))

    def test_each_lane_runs_in_submission_order_one_at_a_time(self) -> None:
        """Thousands of jobs on several lanes over four threads: each lane's run in order, never two at once."""
        pool = self.pool(4)
        lanes = [pool.lane(f"q{i}") for i in range(8)]
        seen: dict[str, list[int]] = {lane.name: [] for lane in lanes}
        running: dict[str, int] = {lane.name: 0 for lane in lanes}
        overlap: list[str] = []
        lock = threading.Lock()

        def job(name: str, i: int) -> int:
            with lock:
                running[name] += 1
                if running[name] > 1:
                    overlap.append(name)
            time.sleep(0.0001 if i % 50 == 0 else 0)
            seen[name].append(i)
            with lock:
                running[name] -= 1
            return i

        results: list[int] = []
        for i in range(500):
            for lane in lanes:
                lane.submit(job, lane.name, i).addCallback(results.append)
        self.reactor.run_until(lambda: len(results) == 4000)
        self.assertEqual(overlap, [])
        for lane in lanes:
            self.assertEqual(seen[lane.name], list(range(500)))

    def test_a_slow_fsync_holds_up_only_its_own_lane(self) -> None:
        """While one lane's job blocks (a stuck fsync), the other lanes' jobs all complete."""
        pool = self.pool(2)
        stuck, other = pool.lane("stuck"), pool.lane("other")
        release = threading.Event()
        stuck_done: list[object] = []
        stuck.submit(release.wait, 30).addCallback(stuck_done.append)
        stuck.submit(lambda: "after").addCallback(stuck_done.append)
        done: list[int] = []
        for i in range(200):
            other.submit(lambda i=i: i).addCallback(done.append)
        self.reactor.run_until(lambda: len(done) == 200)
        self.assertEqual(done, list(range(200)))
        self.assertEqual(stuck_done, [])  # its own later job waits behind it, in order
        release.set()
        self.reactor.run_until(lambda: len(stuck_done) == 2)
        self.assertEqual(stuck_done, [True, "after"])

    def test_busy_lanes_take_turns(self) -> None:
        """With one thread, a lane with a long backlog does not run it all before another lane's job."""
        pool = self.pool(1)
        gate = threading.Event()
        order: list[str] = []
        busy, quiet = pool.lane("busy"), pool.lane("quiet")
        finished: list[object] = []
        busy.submit(gate.wait, 30).addCallback(finished.append)  # holds the only thread
        for _ in range(100):
            busy.submit(order.append, "busy").addCallback(finished.append)
        quiet.submit(order.append, "quiet").addCallback(finished.append)
        gate.set()
        self.reactor.run_until(lambda: len(finished) == 102)
        self.assertLess(order.index("quiet"), 2)

    def test_errors_come_back_and_the_lane_goes_on(self) -> None:
        """A job that raises fails its Deferred; the lane's next job still runs."""
        lane = self.pool(1).lane("q")
        failures: list[Any] = []
        results: list[object] = []
        lane.submit(lambda: 1 / 0).addErrback(failures.append)
        lane.submit(lambda: "next").addCallback(results.append)
        self.reactor.run_until(lambda: bool(results))
        self.assertEqual(len(failures), 1)
        self.assertTrue(failures[0].check(ZeroDivisionError))
        self.assertEqual(results, ["next"])

    def test_a_reply_comes_back_before_the_work_after_it(self) -> None:
        """A job's Reply fires its Deferred with the value while ``after`` still runs on the
        disk thread; the lane's next job waits for ``after``; an ``after`` that raises is
        logged and the lane goes on."""
        lane = self.pool(2).lane("q")
        go_on = threading.Event()
        order: list[str] = []
        results: list[object] = []

        def after() -> None:
            go_on.wait(10)
            order.append("after")

        lane.submit(lambda: Reply("read", after)).addCallback(results.append)
        lane.submit(lambda: order.append("next") or "next").addCallback(results.append)
        self.reactor.run_until(lambda: bool(results))
        self.assertEqual((results, order), (["read"], []))  # the value is back; after() is still waiting
        go_on.set()
        self.reactor.run_until(lambda: len(results) == 2)
        self.assertEqual(order, ["after", "next"])

        def broken() -> None:
            raise OSError("after failed")

        lane.submit(lambda: Reply(1, broken)).addCallback(results.append)
        lane.submit(lambda: "still").addCallback(results.append)
        self.reactor.run_until(lambda: len(results) == 4)
        self.assertEqual(results[2:], [1, "still"])
        self.assertEqual(len(self.flushLoggedErrors(OSError)), 1)

    def test_the_test_executor_keeps_the_same_order(self) -> None:
        """SynchronousDiskExecutor: the Reply's value, with ``after`` already run (it runs
        everything at once, in the order a disk thread would)."""
        order: list[str] = []
        d = SynchronousDiskExecutor().submit(lambda: Reply("v", lambda: order.append("after")))
        self.assertEqual((self.successResultOf(d), order), ("v", ["after"]))

    def test_stopped_lane_refuses_new_jobs(self) -> None:
        """After stop() a lane answers new jobs with BackendError("exiting")."""
        lane = self.pool(1).lane("q")
        lane.stop()
        self.failureResultOf(lane.submit(lambda: None), BackendError)

    def test_thread_count_is_fixed(self) -> None:
        """However many lanes, the pool's threads are the ones it started with."""
        pool = DiskPool(self.reactor, 3, name="counted")  # type: ignore[arg-type]
        self.addCleanup(pool.stop)
        lanes = [pool.lane(f"q{i}") for i in range(2000)]
        done: list[object] = []
        for lane in lanes:
            lane.submit(lambda: None).addCallback(done.append)
        self.reactor.run_until(lambda: len(done) == 2000)
        alive = [t for t in threading.enumerate() if t.name.startswith("counted-")]
        self.assertEqual(len(alive), 3)


class CoalescedResultsTests(SynchronousTestCase):
    def test_results_come_back_in_order_with_fewer_wake_ups_than_jobs(self) -> None:
        """A thousand jobs' results reach the reactor in the order they finished, through far fewer
        ``callFromThread`` calls (each one a write to the reactor's waker pipe) than jobs."""
        reactor = ThreadCalls()
        wakes: list[int] = []
        calls = reactor.calls
        original = reactor.callFromThread

        def counted(f: Callable[..., Any], *args: Any) -> None:
            wakes.append(1)
            original(f, *args)

        reactor.callFromThread = counted  # type: ignore[method-assign]
        pool = DiskPool(reactor, 1)  # type: ignore[arg-type]
        self.addCleanup(pool.stop)
        lane = pool.lane("t")
        gate = threading.Event()
        lane.submit(gate.wait, 10)
        results: list[int] = []
        for i in range(1000):
            lane.submit(lambda i=i: i).addCallback(results.append)
        gate.set()
        time.sleep(0.2)  # the thread runs them all before the "reactor" looks
        reactor.run_until(lambda: len(results) == 1000)
        self.assertEqual(results, list(range(1000)))
        self.assertLess(len(wakes), 100)
        self.assertTrue(calls.empty())
