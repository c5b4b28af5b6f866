"""Where disk work runs: off the reactor thread, one job at a time, in submission order.

Every disk queue and journal hands its file work to an :class:`~nsqtw.interfaces.IDiskExecutor`;
what runs there touches only bytes and files, never transports or Deferreds.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

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

__all__ = ["SynchronousDiskExecutor", "ThreadPoolDiskExecutor"]

T = TypeVar("T")


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
        self._jobs: queue.SimpleQueue[tuple[Deferred[Any], Callable[..., Any], tuple[Any, ...]] | None]
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
            d, fn, args = job
            try:
                result = fn(*args)
            except BaseException:
                call(d.errback, Failure())
            else:
                call(d.callback, result)

    def stop(self) -> None:
        """No new jobs; the thread finishes the queued ones, then ends."""
        if self._stopped:
            return
        self._stopped = True
        if self._trigger is not None:
            cast(IReactorCore, self._reactor).removeSystemEventTrigger(self._trigger)
            self._trigger = None
        self._jobs.put(None)


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
        return defer.maybeDeferred(fn, *args)

    def stop(self) -> None:
        self.stopped = True
