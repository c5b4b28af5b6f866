"""One ``syncfs`` for the queues a graceful stop closes together, instead of two fsyncs each.

A disk queue's close writes what it holds, fsyncs its segment and replaces
its metadata file (temp file, fsync, rename): two fsyncs. A node of 30,000
topics stopping with a message in each did 60,000 of them, 20 to 40 s on
this project's disk, past the stop's deadline. At a stop, a queue with
something to persist instead writes its segment and its new metadata
beside the old one without an fsync and asks :class:`GroupSync` for a sync
of the data path's filesystem; one ``syncfs(2)``, begun after that request,
serves every queue that asked meanwhile (a group commit), and each then
renames its metadata into place on the same disk thread, right after.
What a crash can find is what per-file fsyncs left: the metadata names
only records that reached the disk. A ``syncfs`` that fails sends each
queue of its round back to its own fsyncs (and their errors).

Only where the C library has ``syncfs`` (Linux); elsewhere queues keep
their own fsyncs.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from nsqtw.interfaces import IDiskExecutor

__all__ = ["ROUND_MAX", "GroupSync", "load_syncfs"]

#: the most queues one syncfs serves: their renames follow it in the same job, and a stop waits
#: only while its queues keep moving (a round of 30,000 renames took seconds)
ROUND_MAX = 2048

#: run on a disk thread after the round's syncfs, given whether it worked; its value goes back
Then = Callable[[bool], Any]


def load_syncfs() -> Callable[[int], None] | None:
    """The C library's ``syncfs(fd)``, raising ``OSError`` as ``os.fsync`` does; ``None`` where there is none."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int

    def syncfs(fd: int) -> None:
        if fn(fd) != 0:
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error))

    return syncfs


class GroupSync:
    """Syncs of one filesystem, shared by whoever asks while one is under way (reactor side).

    :meth:`arm` opens the data path (the node does it at start: ``syncfs``
    reports the writeback errors since its descriptor was opened) and
    turns the group on; until then :attr:`armed` is false and queues sync
    on their own. Only a graceful stop closes queues, so only a stop
    syncs through it. Rounds run one at a time on ``executor``.
    """

    def __init__(self, data_path: str, executor: IDiskExecutor, syncfs: Callable[[int], None]) -> None:
        self.data_path = data_path
        self._executor = executor
        self._syncfs = syncfs
        self._fd: int | None = None
        self.armed = False
        #: rounds run so far (tests, and the stop's log line)
        self.rounds = 0
        self._running = False
        self._waiting: list[tuple[Then, Deferred[Any]]] = []

    def arm(self) -> Deferred[None]:
        """Open the data path on the executor; from then on queues may :meth:`sync`."""
        d: Deferred[None] = self._executor.submit(self._open)
        d.addCallback(lambda _: setattr(self, "armed", True))
        return d

    def _open(self) -> None:
        self._fd = os.open(self.data_path, os.O_RDONLY)

    def sync(self, then: Then) -> Deferred[Any]:
        """``then(synced)`` on a disk thread once a ``syncfs`` begun after this call has ended; its value."""
        d: Deferred[Any] = Deferred()
        self._waiting.append((then, d))
        if not self._running:
            self._start()
        return d

    def _start(self) -> None:
        batch, self._waiting = self._waiting[:ROUND_MAX], self._waiting[ROUND_MAX:]
        self._running = True
        self.rounds += 1
        done = self._executor.submit(self._round, [then for then, _ in batch])
        done.addBoth(self._finished, [d for _, d in batch])

    def _round(self, thens: list[Then]) -> list[tuple[bool, Any]]:
        """Disk thread: one syncfs, then every ``then`` of the round with its outcome."""
        synced = False
        if self._fd is not None:  # else disarmed: every queue of the round syncs on its own
            try:
                self._syncfs(self._fd)
                synced = True
            except OSError:
                pass
        out: list[tuple[bool, Any]] = []
        for then in thens:
            try:
                out.append((True, then(synced)))
            except Exception:
                out.append((False, Failure()))
        return out

    def _finished(self, results: list[tuple[bool, Any]] | Failure, waiters: list[Deferred[Any]]) -> None:
        self._running = False
        for i, d in enumerate(waiters):
            if isinstance(results, Failure):
                d.errback(results)
            else:
                ok, value = results[i]
                if ok:
                    d.callback(value)
                else:
                    d.errback(value)
        if self._waiting:
            self._start()

    def disarm(self) -> Deferred[None]:
        """Close the data path's descriptor (after the last round)."""
        self.armed = False
        return self._executor.submit(self._close)

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
