"""A segmented file queue that reads and writes go-diskqueue's on-disk format.

Go nsqd keeps each topic's and channel's overflow in nsqio/go-diskqueue files:
``NAME.diskqueue.%06d.dat`` segments of ``[int32 big-endian size][data]``
records and ``NAME.diskqueue.meta.dat`` holding
``depth\\nreadFileNum,readPos\\nwriteFileNum,writePos\\n``.  nsqtw reads a
data dir Go left behind and leaves one Go can read.

Three parts:

* :class:`DiskState` owns the files and go-diskqueue's positions.  It runs
  only on the queue's lane of the disk threads and touches only bytes and
  files; what it wants logged travels back with each result.
* :class:`DiskQueue` lives on the reactor thread.  ``put`` only appends to a
  pending list (one disk write per reactor turn, handed over at most every
  5 ms while busy).
* Its base :class:`~nsqtw.storage.readahead.ReadAhead` is the read side:
  ``read`` slices records from a read-ahead buffer the disk thread refills.

A queue holds a descriptor only while it is read or written: an idle one
gives them back at the sync schedule's next tick (:meth:`DiskQueue.sync_tick`),
and running out of them is an error the queue reports and retries, never
corruption (tests/unit/test_diskqueue_fds.py).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, cast

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import (
    IDelayedCall,
    IReactorFromThreads,
    IReactorTime,
)
from twisted.python.failure import Failure
from zope.interface import implementer

from nsqtw.core.unwritten import UnwrittenBytes
from nsqtw.errors import BackendError
from nsqtw.interfaces import IDiskExecutor, IDurableBackendQueue
from nsqtw.log import Logger
from nsqtw.storage.executor import ThreadPoolDiskExecutor
from nsqtw.storage.groupsync import GroupSync
from nsqtw.storage.readahead import ReadAhead
from nsqtw.storage.segments import Consumption, DiskState, OpResult
from nsqtw.storage.sync import SyncSchedule

__all__ = ["DiskQueue"]

#: seconds between two hand-offs of a queue's writes to its disk thread
FLUSH_INTERVAL = 0.005

#: seconds after a reply that left a sync behind before an idle queue asks how it went
#: (a busy queue hears it from its own next read-ahead or write: no extra hand-off for it)
SYNC_REPORT_DELAY = 0.05


@implementer(IDurableBackendQueue)
class DiskQueue(ReadAhead):
    """go-diskqueue-compatible backend for a topic or channel, driven from the reactor."""

    log = Logger()

    def __init__(
        self,
        name: str,
        data_path: str,
        max_bytes_per_file: int,
        min_msg_size: int,
        max_msg_size: int,
        sync_every: int,
        sync_timeout: float,
        clock: IReactorTime,
        executor: IDiskExecutor | None = None,
        *,
        read_ahead_records: int = 4096,
        read_ahead_bytes: int = 1 << 20,
        retry_interval: float = 1.0,
        flush_interval: float = FLUSH_INTERVAL,
        write_fn: Callable[[int, Any], int] = os.write,
        fsync_fn: Callable[[int], None] = os.fsync,
        open_fn: Callable[..., int] = os.open,
        durable: bool = False,
        keep_free: int = 0,
        sync_schedule: SyncSchedule | None = None,
        unwritten: UnwrittenBytes | None = None,
        on_set_aside: Callable[[int], None] | None = None,
        group_sync: GroupSync | None = None,
        on_progress: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self.data_path = data_path
        self._min_msg_size = min_msg_size
        self._max_msg_size = max_msg_size
        self._clock = clock
        if executor is None:
            executor = self.default_executor(cast(IReactorFromThreads, clock), name)
        self._executor = executor
        self._init_reading(read_ahead_records, read_ahead_bytes)
        self._retry_interval = retry_interval
        self._disk = DiskState(name, data_path, max_bytes_per_file, min_msg_size, max_msg_size,
                                sync_every, write_fn, fsync_fn, durable, keep_free, open_fn)

        self._depth = 0
        self._epoch = 0  # bumped by empty/delete: results of older operations are stale
        self._closed = False
        self._loaded = False

        # writing
        self._pending: list[bytes] = []
        self._flush_call: IDelayedCall | None = None
        self._retry_call: IDelayedCall | None = None
        #: asks how a sync run after a reply went, when no operation would tell soon (_report_sync)
        self._report_call: IDelayedCall | None = None
        self._flushing = False
        self._flush_interval = flush_interval
        self._last_flush = float("-inf")
        self._flush_waiters: list[Deferred[None]] = []
        # records put / written so far, and who waits for a given count
        self._put_seq = 0
        self._written_seq = 0
        #: bytes of the records put and not yet written (they are in memory meanwhile)
        self._backlog_bytes = 0
        #: the node's count of the same over all its queues (its --max-unwritten-bytes bound)
        self._unwritten = unwritten if unwritten is not None else UnwrittenBytes(1 << 62)
        self._written_waiters: deque[tuple[int, Deferred[None]]] = deque()
        self._write_error: str | None = None
        #: why the last sync (fsync, metadata) failed, until one succeeds
        self._sync_error: str | None = None
        #: why the queue could not be loaded (its metadata or segments could not be read), until it is
        self.load_error: str | None = None
        #: whether the disk state holds a descriptor (as its last operation said); an idle queue gives
        #: them back at a tick of the sync schedule (:meth:`sync_tick`)
        self._files_open = False
        #: records were written, read ahead or read since the last tick of the sync schedule
        self._active = False
        #: what the health listener was last told
        self._reported_health: str | None = None
        #: told of every change of :meth:`health` (the node's list of failing queues)
        self._health_listener: Callable[[object, str | None], None] | None = None
        self._corruption: str | None = None
        #: segments renamed to ``.bad`` since the queue was opened (an nsqtw /stats field)
        self.segments_set_aside = 0
        #: told of each such renaming too: the node's count, which a filtered /stats reads
        #: without walking every queue
        self._on_set_aside = on_set_aside
        #: failed hand-offs of writes to disk since the queue was opened (retries count again;
        #: ``/metrics``' nsqd_disk_write_errors_total)
        self.write_errors = 0

        self._dirty = False

        #: a graceful stop's one syncfs for every queue closing (when armed), instead of fsyncs of its own
        self._group_sync = group_sync
        #: told as a close moves on (its records written, the close ended well or not): a graceful
        #: stop waits while its queues keep moving
        self._on_progress = on_progress
        #: --sync-timeout: shared by every queue of a node (one timer), or this queue's own
        self._sync_schedule = sync_schedule if sync_schedule is not None else SyncSchedule(clock, sync_timeout)

        #: fires once the first load was tried (:attr:`load_error` says if it failed; it is retried)
        self.loaded: Deferred[None] = self._submit(self._disk.load).addErrback(self._load_failed)

    @classmethod
    def default_executor(cls, reactor: IReactorFromThreads, name: str = "diskqueue") -> ThreadPoolDiskExecutor:
        """The ordered one-thread executor a queue uses unless it is given one."""
        return ThreadPoolDiskExecutor(reactor, name=f"diskqueue-{name}")

    # -- IBackendQueue -------------------------------------------------------

    def put(self, data: bytes) -> None:
        self._check_writable()
        self._check_size(data)
        self._pending.append(data)
        self._depth += 1
        self._put_seq += 1
        self._grow_backlog(len(data))
        self._schedule_flush()

    def put_many(self, records: Iterable[bytes]) -> None:
        self._check_writable()
        records = list(records)
        if not records:
            return
        sizes = list(map(len, records))  # the sizes in C, not a check per record in Python
        if min(sizes) < self._min_msg_size or max(sizes) > self._max_msg_size:
            for data in records:
                self._check_size(data)  # raises for the first bad one
        self._pending.extend(records)
        self._depth += len(records)
        self._put_seq += len(records)
        self._grow_backlog(sum(sizes))
        self._schedule_flush()

    def written(self) -> Deferred[None]:
        """Fires once every record put so far has been written to its file.

        Written means the ``write()`` returned, so a kill -9 cannot lose it
        (fsync follows ``--sync-every``/``--sync-timeout``). Fails with
        BackendError if the write failed; the records stay queued for retry.
        """
        if self._written_seq >= self._put_seq:
            return defer.succeed(None)
        d: Deferred[None] = Deferred()
        self._written_waiters.append((self._put_seq, d))
        if self._pending:
            self._schedule_flush()
        return d

    def backlog(self) -> int:
        return self._put_seq - self._written_seq

    def backlog_bytes(self) -> int:
        return self._backlog_bytes

    def _grow_backlog(self, nbytes: int) -> None:
        self._backlog_bytes += nbytes
        self._unwritten.add(nbytes)

    def _shrink_backlog(self, nbytes: int) -> None:
        self._backlog_bytes -= nbytes
        self._unwritten.remove(nbytes)

    def _release_written(self, error: str | None = None) -> None:
        waiters = self._written_waiters
        if error is not None:
            # every waiter of now hears of the failure; one that waits again at once
            # (from its errback) waits for the next attempt, not for this loop
            waiters, self._written_waiters = waiters, deque()
        while waiters and (waiters[0][0] <= self._written_seq or error is not None):
            target, d = waiters.popleft()
            if target <= self._written_seq:
                d.callback(None)
            else:
                d.errback(BackendError(error))

    def depth(self) -> int:
        return self._depth

    def empty(self) -> Deferred[None]:
        if self._closed:
            return defer.fail(BackendError("exiting"))
        self.log.info("DISKQUEUE({name}): emptying", name=self.name)
        self._drop_everything()
        d = self._submit(self._disk.empty)
        d.addCallback(lambda _: None)
        d.addErrback(self._op_failed, "empty")
        return d

    def delete(self) -> Deferred[None]:
        if self._closed:
            return defer.fail(BackendError("exiting"))
        self.log.info("DISKQUEUE({name}): deleting", name=self.name)
        self._closed = True
        self._stop_timers()
        self._drop_everything()
        return defer.ensureDeferred(self._delete())

    def close(self) -> Deferred[None]:
        if self._closed:
            return defer.succeed(None)
        self.log.info("DISKQUEUE({name}): closing", name=self.name)
        self._closed = True
        self._stop_timers()
        return defer.ensureDeferred(self._close())

    def health(self) -> str | None:
        """The write or sync failure while there is one, so the node is unhealthy.

        A failed fsync leaves the records in the page cache (a kill -9 keeps
        them) but not safe from a power loss, and the metadata not updated:
        the node says so until a sync succeeds (Go nsqd only logs it).

        Corruption found while reading (a segment set aside as ``.bad``, a depth
        fixed at the tail) is logged as an ERROR and counted
        (:attr:`segments_set_aside`, :attr:`corruption`) but leaves the queue
        healthy, as in Go nsqd: later data still flows, and a load balancer
        must not take the node out of service for it.
        """
        return self.load_error or self._write_error or self._sync_error or self._read_error

    def watch_health(self, listener: Callable[[object, str | None], None]) -> None:
        self._health_listener = listener
        self._reported_health = self.health()
        if self._reported_health is not None:
            listener(self, self._reported_health)

    def _health_changed(self, error: str | None) -> None:
        self._write_error = error
        self._report_health()

    def _report_health(self) -> None:
        now = self.health()
        if now != self._reported_health:
            self._reported_health = now
            if self._health_listener is not None:
                self._health_listener(self, now)

    # -- extras ----------------------------------------------------------------

    @property
    def write_error(self) -> str | None:
        """Why writes fail right now (the records wait in memory for the retry), or ``None``."""
        return self._write_error

    @property
    def corruption(self) -> str | None:
        """The last corruption go-diskqueue's rules recovered from, or ``None``."""
        return self._corruption

    # -- plumbing --------------------------------------------------------------

    def _submit(self, fn: Callable[..., Any], *args: Any, waited: bool = False) -> Deferred[Any]:
        """Run ``fn`` on the disk thread, telling it what ``read`` has consumed so far.

        ``waited``: a read-ahead or a write, whose result comes back before
        the sync and segment removal it makes due (``DiskState.run_waited``).
        """
        consumption: Consumption | None = None
        if self._consumed_pos is not None:
            consumption = (self._consumed_count, *self._consumed_pos)
            self._consumed_count = 0
            self._consumed_pos = None
            self._dirty = True
        epoch = self._epoch
        # a Reply from run_waited reaches the Deferred as its value (IDiskExecutor.submit)
        d = cast("Deferred[OpResult]", self._executor.submit(self._disk.run_waited if waited else self._disk.run,
                                                             consumption, fn, *args))
        d.addCallback(self._after_op, epoch)
        return d

    def _after_op(self, result: OpResult, epoch: int) -> Any:
        for level, fmt, kw in result.events:
            self.log.emit(level, fmt, **kw)
        self._files_open = result.files_open
        if result.files_open and not self._closed:
            self._sync_schedule.watch(self)  # given back once the queue idles (sync_tick)
        if epoch == self._epoch:
            self._depth += result.depth_delta
            self._disk_more = result.more
            if result.corruption is not None:
                self._corruption = result.corruption
            if result.set_aside:
                self.segments_set_aside += result.set_aside
                if self._on_set_aside is not None:
                    self._on_set_aside(result.set_aside)
            if result.sync_error is not None:
                self._sync_done(result.sync_error or None)
            if result.sync_follows and self._report_call is None and not self._closed:
                self._report_call = self._clock.callLater(SYNC_REPORT_DELAY, self._report_sync)
        if result.read_error is not None:
            self._read_done(result.read_error or None)
        if result.loaded is not None:
            self._load_done(result.loaded, epoch)
        return result.value

    def _report_sync(self) -> None:
        """Hear how the sync a reply left behind went, unless an operation under way or
        scheduled tells: a queue nobody reads (a topic without channels) between writes has
        none, and a failing fsync would otherwise make it unhealthy only at the next
        ``--sync-timeout`` tick. On the disk lane this operation runs after the sync."""
        self._report_call = None
        if self._closed or self._flushing or self._refilling or self._flush_call is not None:
            return
        self._submit(self._disk.report).addErrback(self._op_failed, "sync")

    def _sync_done(self, error: str | None) -> None:
        self._sync_error = error
        if error is not None and not self._closed:
            # the disk thread keeps its need to sync: try again at the next --sync-timeout tick
            self._dirty = True
            self._sync_schedule.mark(self)
        self._report_health()

    def _op_failed(self, failure: Failure, what: str) -> None:
        if failure.check(OSError):  # a disk or resource error, said in its message; no traceback
            self.log.error("DISKQUEUE({name}) {what} failed - {error}", name=self.name, what=what,
                           error=failure.getErrorMessage())
        else:
            self.log.failure("DISKQUEUE({name}) {what} failed", failure, name=self.name, what=what)

    def _load_done(self, depth: int, epoch: int) -> None:
        if epoch == self._epoch:  # else emptied or deleted since: its records are gone
            self._depth += depth
        self._loaded = True
        if self.load_error is not None:
            self.log.info("DISKQUEUE({name}) loaded", name=self.name)
            self.load_error = None
            self._report_health()
        # what is on disk is read ahead once the queue is first read, not now: a topic without
        # channels or a channel without clients never reads, and a node restarting with 30,000
        # of them would otherwise open, read and hold a read-ahead of each
        self._tell_readable()

    def _load_failed(self, failure: Failure) -> None:
        """The load could not read the metadata or the segments: unhealthy, and tried again.

        Nothing is written, read or persisted meanwhile (every operation
        tries the load first and fails the same way), so no position is
        lost; a start that meets this fails (``NSQDService``).
        """
        error = f"DISKQUEUE({self.name}) failed to load: {failure.getErrorMessage()}"
        if error != self.load_error:  # once, not at every retry
            self._op_failed(failure, "load")
        self.load_error = error
        self._report_health()
        if not self._closed:
            self._clock.callLater(self._retry_interval, self._retry_load)

    def _retry_load(self) -> None:
        if self._closed or self._loaded:
            return
        self._submit(self._disk.load).addErrback(self._load_failed)

    def _check_writable(self) -> None:
        # A write error does not refuse puts: the records wait in ``_pending``
        # (bounded by the callers' backlog checks) and the retry writes them
        # in order once the disk accepts again; refusing would drop them.
        if self._closed:
            raise BackendError("exiting")

    def _check_size(self, data: bytes) -> None:
        size = len(data)
        if size < self._min_msg_size or size > self._max_msg_size:
            raise BackendError(f"invalid message write size ({size}) minMsgSize={self._min_msg_size}"
                               f" maxMsgSize={self._max_msg_size}")

    def _stop_timers(self) -> None:
        for call in (self._flush_call, self._retry_call, self._notify_call, self._read_retry, self._report_call):
            if call is not None and call.active():
                call.cancel()
        self._flush_call = self._retry_call = self._notify_call = self._read_retry = self._report_call = None
        self._sync_schedule.forget(self)

    def _drop_everything(self) -> None:
        self._epoch += 1
        self._pending = []
        # the records are gone on purpose (empty/delete): nobody waits for them
        self._written_seq = self._put_seq
        self._shrink_backlog(self._backlog_bytes)
        self._release_written()
        self._buffer.clear()
        self._buffer_count = 0
        self._buffer_bytes = 0
        self._consumed_count = 0
        self._consumed_pos = None
        self._read_total = self._committed_total = 0
        self._read_last = None
        self._depth = 0
        self._disk_more = False
        self._sync_error = None
        self._health_changed(None)
        self._corruption = None
        if self._retry_call is not None and self._retry_call.active():
            self._retry_call.cancel()
        self._retry_call = None

    # -- writing ---------------------------------------------------------------

    def _schedule_flush(self) -> None:
        """At most one hand-off to the disk thread per ``flush_interval``.

        Each hand-off costs the reactor a thread wake-up and a GIL hand-over;
        one-message publishes would otherwise pay that per message. A queue
        that was idle flushes on the next turn, and so does one that somebody
        waits on (``written()``: ``--sync-every=1``, backpressure).
        """
        self._sync_schedule.mark(self)  # the write must be synced within --sync-timeout
        if self._flushing or self._retry_call is not None:
            return  # the flush under way or the retry takes these records too
        call = self._flush_call
        if self._written_waiters:  # somebody waits for the write: flush on the next turn
            if call is None:
                self._flush_call = self._clock.callLater(0, self._flush)
            elif call.getTime() > self._clock.seconds():
                call.reset(0)
        elif call is None:  # else the flush already timed takes these records too
            delay = max(0.0, self._last_flush + self._flush_interval - self._clock.seconds())
            self._flush_call = self._clock.callLater(delay, self._flush)

    def _flush(self) -> None:
        """Hand everything pending to the disk thread as one batch (one flush at a time)."""
        self._flush_call = None
        self._retry_call = None
        if self._flushing or self._closed:
            return
        batch, self._pending = self._pending, []
        if not batch and self._write_error is None:
            return
        self._flushing = True
        self._dirty = True
        self._active = True
        self._sync_schedule.mark(self)
        self._last_flush = self._clock.seconds()
        epoch = self._epoch
        d = self._submit(self._disk.write_batch, batch, waited=True)
        d.addCallback(self._flush_done, batch, epoch)
        d.addErrback(self._flush_crashed, batch, epoch)
        d.addBoth(self._flush_finished)

    def _flush_done(self, result: tuple[int, str | None], batch: list[bytes], epoch: int) -> None:
        written, error = result
        if epoch != self._epoch:
            return  # emptied or deleted meanwhile: the failed rest is gone anyway
        if written:
            self._disk_more = True
            self._written_seq += written
            self._shrink_backlog(sum(map(len, batch if written == len(batch) else batch[:written])))
        self._release_written(error)
        if error is not None:
            self._pending[:0] = batch[written:]
            self._set_write_error(error)
        elif self._write_error is not None:
            self.log.info("DISKQUEUE({name}) writes work again", name=self.name)
            self._health_changed(None)

    def _flush_crashed(self, failure: Failure, batch: list[bytes], epoch: int) -> None:
        self._op_failed(failure, "write")
        if epoch == self._epoch:
            self._pending[:0] = batch
            error = f"DISKQUEUE({self.name}) failed to write: {failure.getErrorMessage()}"
            self._release_written(error)
            self._set_write_error(error)

    def _set_write_error(self, error: str) -> None:
        self._health_changed(error)
        self.write_errors += 1
        if not self._closed and self._retry_call is None:
            self._retry_call = self._clock.callLater(self._retry_interval, self._flush)

    def _flush_finished(self, _: object) -> None:
        self._flushing = False
        waiters, self._flush_waiters = self._flush_waiters, []
        for waiter in waiters:
            waiter.callback(None)
        if not self._closed:
            self._more_on_disk()
            if self._pending and self._write_error is None:
                self._schedule_flush()

    async def _flush_idle(self) -> None:
        if self._flushing:
            waiter: Deferred[None] = Deferred()
            self._flush_waiters.append(waiter)
            await waiter

    # -- sync, close, delete ---------------------------------------------------

    def sync_tick(self) -> None:
        """A tick of the :class:`SyncSchedule`: recent activity reaches the disk (--sync-timeout),
        a queue idle since the last tick gives its descriptors back, and one not read since
        the last tick its read-ahead (:meth:`ReadAhead._let_go_if_unread`).

        A node of 30,000 topics must not hold a descriptor for each: the
        ones that are written or read keep theirs, the others hold none. A
        queue that was read is looked at again at the next tick, until it
        is read no more.
        """
        if self._closed:
            return
        active, self._active = self._active or self._consumed_pos is not None, False
        if self._sync_schedule.syncs and (self._dirty or self._consumed_pos is not None):
            self._dirty = False
            self._submit(self._disk.sync_if_dirty).addErrback(self._op_failed, "sync")
        elif self._files_open and not active and not self._flushing and not self._refilling:
            self._submit(self._disk.release_files).addErrback(self._op_failed, "release files")
            self._let_go_if_unread()  # after the release on the lane: its files stay closed
            return
        self._let_go_if_unread()
        if self._files_open or self._read_asked:
            self._sync_schedule.watch(self)  # busy since the last tick: look again at the next

    async def _close(self) -> None:
        await self._flush_idle()
        batch, self._pending = self._pending, []
        group = self._group_sync if self._group_sync is not None and self._group_sync.armed else None
        try:
            written, error, grouped = await self._submit(self._disk.close, batch, group is not None)
            self._written_seq += written  # what is left is what the stop could not flush
            if grouped and group is not None:
                self._progressed()
                epoch = self._epoch
                result = await group.sync(partial(self._disk.run, None, self._disk.finish_close))
                self._after_op(result, epoch)
        finally:
            # written or not, none of it is in this node's memory any more
            self._shrink_backlog(self._backlog_bytes)
            self._executor.stop()
            self._progressed()
        if error is not None:
            raise BackendError(f"{error} ({len(batch) - written} records lost on close)")

    def _progressed(self) -> None:
        if self._on_progress is not None:
            self._on_progress()

    async def _delete(self) -> None:
        await self._flush_idle()
        try:
            await self._submit(self._disk.delete)
        finally:
            self._executor.stop()
