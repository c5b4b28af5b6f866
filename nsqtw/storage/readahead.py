"""The read side of a disk queue: the read-ahead buffer the disk thread refills, on the reactor thread.

``read`` slices records from a buffer the disk thread refills in chunks of
up to 4,096 records or 1 MiB. Smaller chunks left a reader at 400,000
messages/s waiting for the refill (its disk thread is also writing the
copies a topic hands over); bigger ones hold the GIL longer on the disk
thread while it splits them. A queue reads 1,024 ahead until reads take
records out of it, then twice as many at each read up to the 4,096.

Nothing is read ahead before the queue is first read: a queue loaded with
records on disk, or written to, tells its reader it is readable, and its
first ``read`` starts the read-ahead. A topic without channels or a channel
without clients never reads, so a node with thousands of them (restarting,
or being written) reads and holds nothing for them
(tests/unit/test_diskqueue_fds.py, test_diskqueue.py). A queue that was
read and then is not (its channel's last client left, or paused) goes back
to that state at the second ``--sync-timeout`` tick without a read: its
read-ahead is let go and the disk thread reads again from just past the
last record handed out, so 10,000 channels whose consumers went away hold
no read-ahead either (:meth:`ReadAhead._let_go_if_unread`). The
read position on disk only moves past records ``read`` has returned, so
buffered records survive a restart.

:class:`ReadAhead` is :class:`~nsqtw.storage.diskqueue.DiskQueue`'s base;
the queue's plumbing (``_submit``, health, the epoch) is the queue's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure

from nsqtw.log import Logger
from nsqtw.storage.segments import DiskState, ReadChunk
from nsqtw.storage.sync import SyncSchedule

__all__ = ["READ_AHEAD_START", "ReadAhead"]

#: records a queue reads ahead before anything is read from it
READ_AHEAD_START = 1024


class ReadAhead:
    """The reading half of a disk queue (its read-ahead, reads, durable read marks)."""

    # what the queue holds and does, used here
    log: Logger
    name: str
    _clock: IReactorTime
    _disk: DiskState
    _sync_schedule: SyncSchedule
    _retry_interval: float
    _closed: bool
    _loaded: bool
    _epoch: int
    _depth: int
    _active: bool

    def _submit(self, fn: Callable[..., Any], *args: Any, waited: bool = False) -> Deferred[Any]:
        raise NotImplementedError

    def _op_failed(self, failure: Failure, what: str) -> None:
        raise NotImplementedError

    def _report_health(self) -> None:
        raise NotImplementedError

    def sync_tick(self) -> None:
        raise NotImplementedError

    def _init_reading(self, read_ahead_records: int, read_ahead_bytes: int) -> None:
        self._read_ahead_records = max(read_ahead_records, 1)
        #: the read-ahead now: READ_AHEAD_START records until reads take records out,
        #: then doubling up to ``read_ahead_records`` (see the module's docstring)
        self._ahead = min(READ_AHEAD_START, self._read_ahead_records)
        self._read_ahead_bytes = max(read_ahead_bytes, 1)
        #: read ahead: chunks of records, each [file_num, position of its next record,
        #: its records, index of the next, the bytes of the data from there on]; none is ever empty
        self._buffer: deque[list[Any]] = deque()
        self._buffer_count = 0
        self._buffer_bytes = 0
        self._refilling = False
        self._disk_more = False
        #: whether anything asked to read (since the read-ahead was last let go): until then
        #: nothing is read ahead (the module's docstring)
        self._read_asked = False
        #: a read since the last --sync-timeout tick (:meth:`_let_go_if_unread`)
        self._read_since_tick = False
        #: bumped when the read-ahead is let go: a read-ahead under way then is stale
        self._read_epoch = 0
        self._consumed_count = 0
        self._consumed_pos: tuple[int, int] | None = None
        self._readable_callback: Callable[[], object] | None = None
        self._want_readable = True
        self._notify_call: IDelayedCall | None = None
        #: why the last read-ahead could not read (descriptors, memory, I/O: never bad data), until one can
        self._read_error: str | None = None
        self._read_retry: IDelayedCall | None = None
        # durable mode: records handed out by read_positions() but not yet
        # committed; cumulative counts so marks commit in any order
        self._read_total = 0
        #: (file_num, position) just past the last record ``read`` or ``read_positions`` handed
        #: out: a durable read mark's end, and where a read-ahead let go starts again
        self._read_last: tuple[int, int] | None = None
        self._committed_total = 0

    def _take(self, max_count: int) -> list[tuple[int, int, list[bytes], int]]:
        """Up to ``max_count`` records from the read-ahead, as runs of one segment:
        (file_num, position just past the run, its records, the bytes of their data).

        A whole chunk's records are sliced out at once, not moved one by one,
        and its bytes are known from the read (:data:`~nsqtw.storage.segments.ReadChunk`):
        this runs for every message a consumer reads back from disk, where
        adding up every record's length, as a chunk arrived and again as it
        was taken, was a loop a message on the reactor. Only a run that
        leaves part of its chunk behind (at most one a read) adds up its own.
        """
        runs: list[tuple[int, int, list[bytes], int]] = []
        buffer = self._buffer
        want = max_count
        while buffer and want > 0:
            chunk = buffer[0]
            num, pos, data, i, left = chunk
            if i == 0 and len(data) <= want:
                run = data
                nbytes = left
                buffer.popleft()
            else:
                run = data[i:i + want]
                chunk[3] = i + len(run)
                if chunk[3] == len(data):
                    nbytes = left
                    buffer.popleft()
                else:
                    nbytes = sum(map(len, run))
                    chunk[4] = left - nbytes
            pos += 4 * len(run) + nbytes
            chunk[1] = pos
            self._buffer_bytes -= nbytes
            want -= len(run)
            runs.append((num, pos, run, nbytes))
        if runs and self._ahead < self._read_ahead_records:
            # someone reads this queue: read further ahead (see the module's docstring)
            self._ahead = min(2 * self._ahead, self._read_ahead_records)
        self._buffer_count -= max_count - want
        if runs:
            self._read_last = (runs[-1][0], runs[-1][1])
        return runs

    def read(self, max_count: int) -> list[bytes]:
        if self._closed:
            return []  # the read position is already persisted; don't hand out more
        self._reader_asks()
        runs = self._take(max_count)
        if len(runs) == 1:
            out = runs[0][2]
        else:
            out = []
            for run in runs:  # (a big read spans many chunks, one a 64 KiB piece: extend copies each in C)
                out.extend(run[2])
        if out:
            self._consumed_pos = runs[-1][:2]
            self._consumed_count += len(out)
            self._depth -= len(out)
            self._active = True
            self._sync_schedule.mark(self)
        self._after_read(len(out), max_count)
        return out

    def _reader_asks(self) -> None:
        """A read (``read`` or ``read_positions``) begins: from now on writes are read ahead
        (:meth:`_more_on_disk`), and the first read of what is on disk, loaded or written, starts it."""
        self._read_asked = self._read_since_tick = True
        if not self._buffer and self._disk_more:
            self._maybe_refill(True)

    def _after_read(self, got: int, wanted: int) -> None:
        self._maybe_refill(True)
        if got < wanted:
            if self._buffer:
                self._schedule_notify()  # a refill finished while we were in here
            else:
                self._want_readable = True

    def read_positions(self, max_count: int) -> list[tuple[bytes, int, int]]:
        """Like ``read``, with each record's end position; the read position
        on disk moves past them only when :meth:`commit_read` says so."""
        out: list[tuple[bytes, int, int]] = []
        if self._closed:
            return out
        self._reader_asks()
        for num, end, run, nbytes in self._take(max_count):
            pos = end - 4 * len(run) - nbytes
            for data in run:
                pos += 4 + len(data)
                out.append((data, num, pos))
        if out:
            self._read_total += len(out)
            self._depth -= len(out)
        self._after_read(len(out), max_count)
        return out

    def read_mark(self) -> tuple[int, int, int, int] | None:
        """A token for everything ``read_positions`` returned so far."""
        if self._read_last is None:
            return None
        return (self._epoch, self._read_total, *self._read_last)

    def commit_read(self, mark: tuple[int, int, int, int] | None) -> None:
        """The records up to ``mark`` are safe elsewhere: let the read position pass them."""
        if mark is None or self._closed:
            return
        epoch, total, num, pos = mark
        if epoch != self._epoch or total <= self._committed_total:
            return  # emptied since, or a later mark was committed already
        self._consumed_count += total - self._committed_total
        self._consumed_pos = (num, pos)
        self._committed_total = total
        self._sync_schedule.mark(self)
        if self._read_asked:  # else the queue is not read now: nothing to read ahead
            self._maybe_refill()

    def set_readable_callback(self, callback: Callable[[], object]) -> None:
        self._readable_callback = callback

    def _more_on_disk(self, _: object = None) -> None:
        """Records reached the disk (written, or a read-ahead let go): read them ahead if the queue
        is read, else say it is readable.

        A queue written but never read (a channel nobody consumes, a topic
        without channels) holds no read-ahead: its reader's first ``read``
        starts one, as after a load.
        """
        if self._closed:
            return
        if self._read_asked:
            self._maybe_refill()
        else:
            self._tell_readable()

    def _tell_readable(self) -> None:
        """Tell a reader that waits that there is more on disk, at once: this is a load's or a
        write's news, never ``read``'s inside, and a delayed call each would cost 10,000
        written or 30,000 loaded queues as many (the pump's wake already waits for a turn)."""
        if self._disk_more and self._want_readable and self._notify_call is None:
            self._want_readable = False
            self._notify()

    def _buffer_low(self) -> bool:
        return (self._buffer_count < self._ahead // 2 + 1
                and self._buffer_bytes < self._read_ahead_bytes // 2 + 1)

    def _maybe_refill(self, reading: bool = False) -> None:
        """Read ahead if the buffer runs low; ``reading``: a reader asks (keep the segment open)."""
        if self._closed or not self._loaded or self._refilling or not self._buffer_low():
            return
        if not (self._disk_more or self._consumed_pos is not None):
            return
        self._refilling = True
        self._active = True
        epoch, read_epoch = self._epoch, self._read_epoch
        d = self._submit(self._disk.read_chunk, self._ahead, self._read_ahead_bytes, reading, waited=True)
        d.addCallback(self._refill_done, epoch, read_epoch)
        d.addErrback(self._refill_failed)

    def _refill_done(self, chunks: list[ReadChunk], epoch: int, read_epoch: int) -> None:
        self._refilling = False
        if epoch != self._epoch or read_epoch != self._read_epoch or self._closed:
            return
        for num, pos, data, nbytes in chunks:
            self._buffer.append([num, pos, data, 0, nbytes])
            self._buffer_count += len(data)
            self._buffer_bytes += nbytes
        if chunks and self._want_readable:
            self._schedule_notify()
        # go again unless that made no progress and nothing new was consumed
        # (records held back behind an unread error wait for read())
        if chunks or self._consumed_pos is not None:
            self._maybe_refill()

    def _let_go_if_unread(self) -> None:
        """At a ``--sync-timeout`` tick: a queue not read since the tick before is no longer read.

        Its read-ahead (up to 4,096 records or 1 MiB, as its writes kept
        landing) is let go and its disk thread reads again from just past
        the last record ``read`` or ``read_positions`` handed out (never
        before the read position), on its lane after a read-ahead under way,
        whose result is then stale. Until the next read it is a queue never
        read: writes tell its reader, the first read reads ahead. Nothing
        moves the read position, and the depth is the same.
        """
        read, self._read_since_tick = self._read_since_tick, False
        if read or self._closed:
            return
        self._read_asked = False
        self._ahead = min(READ_AHEAD_START, self._read_ahead_records)
        if not (self._buffer or self._refilling):
            return
        self._read_epoch += 1
        self._buffer.clear()
        self._buffer_count = 0
        self._buffer_bytes = 0
        self._disk_more = True
        d = self._submit(self._disk.rewind, self._read_last)
        d.addCallback(self._more_on_disk)
        d.addErrback(self._op_failed, "read")

    def _refill_failed(self, failure: Failure) -> None:
        self._refilling = False
        if not failure.check(OSError):  # those are logged by _read_done, once
            self._op_failed(failure, "read")
        self._read_done(f"DISKQUEUE({self.name}) failed to read: {failure.getErrorMessage()}")

    def _read_done(self, error: str | None) -> None:
        """A read-ahead could read (``None``) or not: unhealthy until one can, tried again meanwhile.

        Only bad data sets a segment aside; a read that fails for want of
        descriptors, memory or a working disk leaves every record where it
        is, and the next try reads it.
        """
        if error is None and self._read_error is not None:
            self.log.info("DISKQUEUE({name}) reads work again", name=self.name)
        elif error is not None and error != self._read_error:  # once, not at every retry
            self.log.error("{text}", text=error)
        self._read_error = error
        self._report_health()
        if error is not None and self._read_retry is None and not self._closed:
            self._read_retry = self._clock.callLater(self._retry_interval, self._retry_read)

    def _retry_read(self) -> None:
        self._read_retry = None
        self._disk_more = True  # what the failed read could not reach is still there
        self._maybe_refill()

    def _schedule_notify(self) -> None:
        """Tell the consumer there is data, from a fresh reactor turn (never inside ``read``)."""
        self._want_readable = False
        if self._notify_call is None and not self._closed:
            self._notify_call = self._clock.callLater(0, self._notify)

    def _notify(self) -> None:
        self._notify_call = None
        if self._readable_callback is not None and (self._buffer or self._disk_more):
            self._readable_callback()
