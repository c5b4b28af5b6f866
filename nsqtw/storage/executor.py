"""Where disk work runs: off the reactor thread, one job at a time per queue, in submission order.

Every disk queue and journal hands its file work to an :class:`~nsqtw.interfaces.IDiskExecutor`;
what runs there touches only bytes and files, never transports or Deferreds.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import (
    IReactorCore,
    IReactorFromThreads,
)
from twisted.python.failure import Failure
from zope.interface import implementer

from nsqtw.errors import BackendError
from nsqtw.interfaces import IDiskExecutor
from nsqtw.log import Logger

__all__ = ["DiskLane", "DiskPool", "Reply", "SynchronousDiskExecutor", "ThreadPoolDiskExecutor", "run_job"]

T = TypeVar("T")


_Job = tuple[Deferred[Any], Callable[..., Any], tuple[Any, ...]]

_log = Logger()


class Reply(Generic[T]):
    """What a job returns to hand ``value`` back at once and then run ``after()`` on the disk thread.

    A disk queue's read-ahead and its writes are waited for (by a reader,
    by publishers held back while the queue's disk thread is behind): their
    result goes back to the reactor before the fsync and segment removal
    they made due (milliseconds each on a real disk), which then run before
    the queue's next job. ``after`` reports nothing itself; what it finds is the job
    owner's to report with its next result.
    """

    __slots__ = ("value", "after")

    def __init__(self, value: T, after: Callable[[], object]) -> None:
        self.value = value
        self.after = after


def _late_failure(failure: Failure) -> None:
    _log.failure("disk work after a reply failed", failure)


def _call_now(f: Callable[..., object], *args: object) -> None:
    f(*args)


def _run_job(job: _Job, call_from_thread: Callable[..., None]) -> None:
    """Disk thread: run one job and hand its result (or failure) back to the reactor."""
    d, fn, args = job
    try:
        result = fn(*args)
    except BaseException:
        call_from_thread(d.errback, Failure())
        return
    if type(result) is not Reply:
        call_from_thread(d.callback, result)
        return
    call_from_thread(d.callback, result.value)
    try:
        result.after()
    except BaseException:
        call_from_thread(_late_failure, Failure())


@implementer(IDiskExecutor)
class ThreadPoolDiskExecutor:
    """The production executor: one dedicated thread running jobs in submission order.

    Leaner than ``deferToThreadPool`` on purpose: a hand-off is one put on a
    C-implemented queue and one ``callFromThread`` back, with no per-job
    context capture or worker bookkeeping, because every hand-off also costs
    the reactor a GIL hand-over.
    """

    def __init__(self, reactor: IReactorFromThreads, name: str = "diskqueue") -> None:
        self._reactor = reactor
        self._jobs: queue.SimpleQueue[_Job | None]
        self._jobs = queue.SimpleQueue()
        self._stopped = False
        self._trigger: Any = None
        # daemon: a queue nobody closed must not keep the process alive at exit
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        if IReactorCore.providedBy(reactor):
            self._trigger = cast(IReactorCore, reactor).addSystemEventTrigger(
                "during", "shutdown", self.stop)

    def submit(self, fn: Callable[..., T], *args: Any) -> Deferred[T]:
        if self._stopped:
            return defer.fail(BackendError("exiting"))
        d: Deferred[T] = Deferred()
        self._jobs.put((d, fn, args))
        return d

    def _run(self) -> None:
        jobs = self._jobs
        call = self._reactor.callFromThread
        while (job := jobs.get()) is not None:
            _run_job(job, call)

    def stop(self) -> None:
        """No new jobs; the thread finishes the queued ones, then ends."""
        if self._stopped:
            return
        self._stopped = True
        if self._trigger is not None:
            cast(IReactorCore, self._reactor).removeSystemEventTrigger(self._trigger)
            self._trigger = None
        self._jobs.put(None)


def run_job(d: Deferred[Any], fn: Callable[..., Any], *args: Any) -> None:
    """Run a disk job on the calling thread, handing its result to ``d`` as a disk thread does:
    a :class:`Reply`'s value first, then its ``after()``; a failure to ``d``'s errbacks.

    For executors that choose where and when a job runs, such as the test
    stand-ins that hold jobs until the test runs them: a job is finished
    one way, the disk threads'.
    """
    _run_job((d, fn, args), _call_now)


@implementer(IDiskExecutor)
class SynchronousDiskExecutor:
    """A test stand-in that runs each job immediately on the calling thread."""

    def __init__(self) -> None:
        self.stopped = False
        self.submitted = 0

    def submit(self, fn: Callable[..., T], *args: Any) -> Deferred[T]:
        if self.stopped:
            return defer.fail(BackendError("exiting"))
        self.submitted += 1
        d: Deferred[T] = Deferred()
        run_job(d, fn, *args)
        return d

    def stop(self) -> None:
        self.stopped = True


class _ToReactor:
    """What a pool's threads hand back, run on the reactor in the order handed, one wake-up at a time.

    Twisted's ``callFromThread`` writes to the reactor's waker pipe at every
    call: a node loading 30,000 queues at start paid 30,000 pipe writes and
    reactor wake-ups, a quarter of its disk threads' time. Here a thread
    queues the call and wakes the reactor only when no wake-up is pending;
    the reactor runs everything queued by then in one go.
    """

    def __init__(self, reactor: IReactorFromThreads) -> None:
        self._reactor = reactor
        self._calls: deque[tuple[Callable[..., object], tuple[Any, ...]]] = deque()
        self._pending = False

    def __call__(self, f: Callable[..., object], *args: Any) -> None:
        """Any thread: run ``f(*args)`` on the reactor after what was handed before."""
        self._calls.append((f, args))
        if not self._pending:
            self._pending = True
            self._reactor.callFromThread(self._run)

    def _run(self) -> None:
        # cleared before draining: a call queued after this line is either drained below or
        # finds the flag clear and wakes the reactor again
        self._pending = False
        calls = self._calls
        while calls:
            f, args = calls.popleft()
            try:
                f(*args)
            except Exception:
                _log.failure("a disk thread's result failed on the reactor")


class _Wake:
    """Put in a pool's queue to wake a waiting thread without a job (:meth:`DiskPool.halt`)."""


_WAKE = _Wake()


class DiskPool:
    """A fixed number of disk threads serving every queue and journal, each on its own lane.

    A node with 10,000 channels has 10,000 disk queues; one thread each
    would be 10,000 threads. Here the thread count is fixed (``threads``)
    and each queue submits to a :class:`DiskLane`: a lane's jobs run one at a
    time in submission order (go-diskqueue's file rules need that), while
    different lanes run in parallel on different threads, so a slow fsync
    on one queue holds up only that queue. Lanes with work wait in one FIFO;
    a lane that still has work after a job goes to its back, so every busy
    lane gets a turn before any gets a second one (no lane starves another).
    """

    def __init__(self, reactor: IReactorFromThreads, threads: int = 4, name: str = "disk") -> None:
        if threads < 1:
            raise ValueError(f"a disk pool needs at least one thread, not {threads}")
        self._reactor = reactor
        self._to_reactor = _ToReactor(reactor)
        self._ready: queue.SimpleQueue[DiskLane | _Wake | None] = queue.SimpleQueue()
        self._stopped = False
        #: see :meth:`halt`
        self._halted = False
        self._keep: DiskLane | None = None
        self._quiet: list[bool] = []
        self._quiet_left = 0
        self._quiet_done: Deferred[None] | None = None
        self._threads = [threading.Thread(target=self._run, args=(i,), name=f"{name}-{i}", daemon=True)
                         for i in range(threads)]
        for t in self._threads:
            t.start()

    @property
    def size(self) -> int:
        """How many threads serve the lanes."""
        return len(self._threads)

    def lane(self, name: str) -> DiskLane:
        """A new ordered lane (one per disk queue or journal)."""
        return DiskLane(self, name)

    def _schedule(self, lane: DiskLane) -> None:
        self._ready.put(lane)

    def _run(self, index: int) -> None:
        ready = self._ready
        call = self._to_reactor
        while (lane := ready.get()) is not None:
            if lane is not _WAKE:
                lane = cast(DiskLane, lane)
                job = lane._take()
                if self._halted and lane is not self._keep:
                    call(job[0].errback, Failure(BackendError("exiting: not run, the stop gave up waiting")))
                else:
                    _run_job(job, call)
                lane._done()
            if self._halted and not self._quiet[index]:
                self._quiet[index] = True
                call(self._thread_quiet)

    def halt(self, keep: DiskLane | None = None) -> Deferred[None]:
        """Run no more of the jobs waiting, but ``keep``'s: the others fail with ``BackendError``.

        A graceful stop that gives up waiting reports what is not on disk;
        for that to stay true nothing may be written after it. The Deferred
        fires once every job running now has ended and its result has
        reached the reactor (each thread says so after its job's result, on
        the same ordered path).
        """
        self._keep = keep
        self._quiet = [False] * len(self._threads)
        self._quiet_left = len(self._threads)
        self._quiet_done = Deferred()
        self._halted = True
        for _ in self._threads:
            self._ready.put(_WAKE)  # a thread waiting for work says it is quiet at once
        return self._quiet_done

    def _thread_quiet(self) -> None:
        self._quiet_left -= 1
        if self._quiet_left == 0 and self._quiet_done is not None:
            done, self._quiet_done = self._quiet_done, None
            done.callback(None)

    def stop(self) -> None:
        """End the threads once the lanes queued so far have run their jobs."""
        if self._stopped:
            return
        self._stopped = True
        for _ in self._threads:
            self._ready.put(None)


@implementer(IDiskExecutor)
class DiskLane:
    """One queue's ordered lane on a :class:`DiskPool` (an :class:`~nsqtw.interfaces.IDiskExecutor`)."""

    def __init__(self, pool: DiskPool, name: str) -> None:
        self.pool = pool
        self.name = name
        self._lock = threading.Lock()
        self._jobs: deque[_Job] = deque()
        #: in the pool's ready FIFO or running: the lane is never there twice (its jobs stay in order)
        self._active = False
        self._stopped = False

    def submit(self, fn: Callable[..., T], *args: Any) -> Deferred[T]:
        if self._stopped:
            return defer.fail(BackendError("exiting"))
        d: Deferred[T] = Deferred()
        with self._lock:
            self._jobs.append((d, fn, args))
            if self._active:
                return d
            self._active = True
        self.pool._schedule(self)
        return d

    def _take(self) -> _Job:
        """Pool thread: the lane's next job (it is active, so it has one)."""
        with self._lock:
            return self._jobs.popleft()

    def _done(self) -> None:
        """Pool thread: a job finished; back of the FIFO if more are waiting."""
        with self._lock:
            if not self._jobs:
                self._active = False
                return
        self.pool._schedule(self)

    def stop(self) -> None:
        """No new jobs; those already submitted still run."""
        self._stopped = True
