"""The load generator's worker processes: each forked, each running a reactor of its own.

:mod:`nsqtw.tools.bench` (writer, reader, latency), :mod:`nsqtw.tools.compare`
(its fill before a read) and :mod:`nsqtw.tools.scale` build on these; a
worker reports its count and CPU use, or the error that stopped it, through
a queue, and a worker that dies without a word is an error too.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import resource
import time
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.python.failure import Failure

from nsqtw.client import Config, Consumer, Producer

__all__ = ["CONNECT_WAIT", "WorkerError", "at", "collect", "fill", "in_reactor", "new_reactor",
           "run_in_worker", "run_workers", "when_connected"]


def new_reactor() -> Any:
    """A reactor of this worker's own (not the global one: a forked worker must share no epoll set)."""
    try:
        from twisted.internet.epollreactor import EPollReactor
    except ImportError:  # not Linux
        from twisted.internet.selectreactor import SelectReactor

        return SelectReactor()
    return EPollReactor()


def in_reactor(work: Callable[[Any], Deferred[Any]]) -> Any:
    """Run ``work(reactor)`` in a fresh reactor of this process until its Deferred fires; its result.

    A failure is raised here (the worker reports it instead of a count)."""
    reactor = new_reactor()
    outcome: list[Any] = []

    def start() -> None:
        d = maybeDeferred(work, reactor)
        d.addBoth(outcome.append)
        d.addBoth(lambda _: reactor.stop())

    reactor.callWhenRunning(start)
    reactor.run(installSignalHandlers=False)
    if not outcome:
        raise RuntimeError("the reactor stopped before the worker finished")
    if isinstance(outcome[0], Failure):
        outcome[0].raiseException()
    return outcome[0]


def at(reactor: Any, when: float, call: Callable[[], Any]) -> None:
    """Call ``call`` at wall-clock time ``when`` (at once if that has passed)."""
    reactor.callLater(max(0.0, when - time.time()), call)


def run_in_worker(out: Any, work: Callable[[Any], Deferred[int]]) -> None:
    """A worker's end: its count and CPU use, or the error that stopped it."""
    try:
        count = in_reactor(work)
    except Exception as e:
        out.put((None, f"{e!r}"))
        return
    out.put((count, resource.getrusage(resource.RUSAGE_SELF)))


#: how long a worker waits for its connection (and subscription) before it gives up
CONNECT_WAIT = 10.0


def when_connected(client: Producer | Consumer, reactor: Any) -> Deferred[None]:
    d = client.when_connected()
    d.addTimeout(CONNECT_WAIT, reactor)
    return d


def fill(address: str, topic: str, size: int, batch: int, count: int) -> None:
    """Publish ``count`` messages of ``size`` bytes as MPUBs of ``batch``, each answered OK (from a worker)."""
    run_workers(_fill_worker, (address, topic, size, batch, count), 1)


def _fill_worker(address: str, topic: str, size: int, batch: int, count: int, out: Any) -> None:
    def work(reactor: Any) -> Deferred[int]:
        producer = Producer([address], Config(), reactor=reactor)
        bodies = [b"m" * size] * batch
        done: Deferred[int] = Deferred()
        left = count // batch

        def send(_: Any = None) -> None:
            nonlocal left
            if left == 0:
                done.callback(count // batch * batch)
                return
            left -= 1
            producer.multi_publish(topic, bodies).addCallbacks(send, done.errback)

        when_connected(producer, reactor).addCallbacks(send, done.errback)
        return done

    run_in_worker(out, work)


class WorkerError(RuntimeError):
    """A worker could not do its part (no connection, an error from nsqd...)."""


def collect(procs: list[Any], out: Any) -> list[Any]:
    """One result from each started process; a process that died without one is an error."""
    results: list[Any] = []
    while len(results) < len(procs):
        try:
            results.append(out.get(timeout=1.0))
        except queue.Empty:
            if not any(p.is_alive() for p in procs) and out.empty():
                raise WorkerError("a worker process died without a result") from None
    for p in procs:
        p.join()
    return results


def run_workers(target: Any, args: tuple[Any, ...], workers: int) -> list[Any]:
    """``workers`` forked processes running ``target(*args, out)``: their (count, rusage) results."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=args + (out,)) for _ in range(workers)]
    for p in procs:
        p.start()
    results = collect(procs, out)
    errors = [r[1] for r in results if r[0] is None]
    if errors:
        raise WorkerError(f"{len(errors)} of {workers} workers failed: {errors[0]}")
    return results
