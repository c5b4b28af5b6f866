"""A segmented file queue that reads and writes go-diskqueue's on-disk format.

Go nsqd keeps each topic's and channel's overflow in nsqio/go-diskqueue files:
``NAME.diskqueue.%06d.dat`` segments of ``[int32 big-endian size][data]``
records and ``NAME.diskqueue.meta.dat`` holding
``depth\\nreadFileNum,readPos\\nwriteFileNum,writePos\\n``.  nsqtw reads a
data dir Go left behind and leaves one Go can read.

Two halves:

* :class:`_DiskState` owns the files and go-diskqueue's positions.  It runs
  only on the queue's own one-thread executor and touches only bytes and
  files; what it wants logged travels back with each result.
* :class:`DiskQueue` lives on the reactor thread.  ``put`` only appends to a
  pending list (one disk write per reactor turn); ``read`` pops from a
  read-ahead buffer the disk thread refills in chunks.  The read position on
  disk only moves past records ``read`` has returned, so buffered records
  survive a restart.
"""

from __future__ import annotations

import errno
import os
import queue
import random
import re
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import (
    IDelayedCall,
    IReactorCore,
    IReactorFromThreads,
    IReactorTime,
)
from twisted.internet.task import LoopingCall
from twisted.logger import LogLevel
from twisted.python.failure import Failure
from zope.interface import implementer

from nsqtw.errors import BackendError
from nsqtw.interfaces import IDurableBackendQueue
from nsqtw.log import Logger

__all__ = [
    "MIN_VALID_MSG_LENGTH",
    "DiskQueue",
    "IDiskExecutor",
    "SynchronousDiskExecutor",
    "ThreadPoolDiskExecutor",
    "nsqd_msg_size_limits",
]

T = TypeVar("T")

#: nsqd's smallest valid disk record: 16-byte ID + 8-byte timestamp + 2-byte attempts.
MIN_VALID_MSG_LENGTH = 16 + 8 + 2
#: seconds between two hand-offs of a queue's writes to its disk thread
FLUSH_INTERVAL = 0.005

_SIZE = struct.Struct(">i")
_META_RE = re.compile(rb"\A(-?\d+)\n(-?\d+),(-?\d+)\n(-?\d+),(-?\d+)\n")

#: (level, format, fields) of a log event produced on the disk thread
_LogEvent = tuple[LogLevel, str, dict[str, Any]]
#: (count, file_num, pos): records consumed since the last disk operation,
#: and the position just past the last of them
_Consumption = tuple[int, int, int]
#: a record read ahead, with the position just past it
_ReadRecord = tuple[bytes, int, int]


def nsqd_msg_size_limits(max_msg_size: int) -> tuple[int, int]:
    """The (min, max) record sizes nsqd gives go-diskqueue for ``--max-msg-size``."""
    return MIN_VALID_MSG_LENGTH, max_msg_size + MIN_VALID_MSG_LENGTH


class IDiskExecutor(Protocol):
    """Runs functions one at a time, in submission order, off the reactor thread."""

    def submit(self, fn: Callable[..., T], *args: Any) -> Deferred[T]:
        """Run ``fn(*args)``; the Deferred fires on the reactor thread with its result."""

    def stop(self) -> None:
        """Stop accepting work and release the thread."""


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


class _ReadError(Exception):
    """A record at the read position could not be read (short file or bad size)."""


@dataclass
class _OpResult:
    """What one disk-thread operation hands back to the reactor."""

    value: Any
    events: list[_LogEvent]
    depth_delta: int
    corruption: str | None
    more: bool


@dataclass
class _DiskState:
    """go-diskqueue's file state; every method runs on the disk thread only.

    ``read_*`` is the position past the last record ``read()`` returned (what
    go-diskqueue persists as readFileNum/readPos); ``cursor_*`` is how far
    read-ahead got, never behind ``read_*``.
    """

    name: str
    data_path: str
    max_bytes_per_file: int
    min_msg_size: int
    max_msg_size: int
    sync_every: int
    write_fn: Callable[[int, Any], int] = os.write
    fsync_fn: Callable[[int], None] = os.fsync
    #: --durable-delivery: every write batch is fsynced before it counts as
    #: written, and records past a lagging metadata writePos are adopted at load
    durable: bool = False

    read_file_num: int = 0
    read_pos: int = 0
    write_file_num: int = 0
    write_pos: int = 0
    depth: int = 0
    cursor_file_num: int = 0
    cursor_pos: int = 0
    count: int = 0
    need_sync: bool = False

    _wfd: int | None = None
    _truncate_on_open: bool = False
    _rfd: int | None = None
    _rfd_num: int = -1
    _random: random.Random = field(default_factory=random.Random)

    # outputs of the operation in progress
    _events: list[_LogEvent] = field(default_factory=list)
    _depth_delta: int = 0
    _corruption: str | None = None

    # -- names -------------------------------------------------------------

    def file_name(self, num: int) -> str:
        return os.path.join(self.data_path, f"{self.name}.diskqueue.{num:06d}.dat")

    def meta_file_name(self) -> str:
        return os.path.join(self.data_path, f"{self.name}.diskqueue.meta.dat")

    # -- operation frame ---------------------------------------------------

    def run(self, consumption: _Consumption | None, fn: Callable[..., Any], *args: Any) -> _OpResult:
        """Apply what the reactor consumed, run ``fn``, sync if due, report back."""
        self._events = []
        self._depth_delta = 0
        self._corruption = None
        self._apply_consumption(consumption)
        value = fn(*args)
        if self.count >= max(self.sync_every, 1):
            self.need_sync = True
        if self.need_sync:
            self._sync()
        return _OpResult(value, self._events, self._depth_delta, self._corruption, self._has_more())

    def _log(self, level: LogLevel, fmt: str, **kw: Any) -> None:
        self._events.append((level, fmt, kw))

    def _has_more(self) -> bool:
        return (self.cursor_file_num, self.cursor_pos) < (self.write_file_num, self.write_pos)

    # -- metadata ----------------------------------------------------------

    def load(self) -> int:
        """Read the metadata file (go-diskqueue's retrieveMetaData); returns the depth."""
        path = self.meta_file_name()
        try:
            with open(path, "rb") as f:
                text = f.read()
        except FileNotFoundError:
            if not self.durable:
                return 0
            # a crash before the first metadata write: records fsynced in
            # segment 0 were acknowledged, so take them in (below)
            text = b"0\n0,0\n0,0\n"
        except OSError as e:
            self._log(LogLevel.error, "DISKQUEUE({name}) failed to retrieveMetaData - {error}",
                      name=self.name, error=str(e))
            return 0
        m = _META_RE.match(text)
        if m is None:
            self._log(LogLevel.error, "DISKQUEUE({name}) failed to retrieveMetaData - bad format {text!r}",
                      name=self.name, text=text[:100])
            return 0
        depth, rnum, rpos, wnum, wpos = (int(g) for g in m.groups())
        self.depth = depth
        self.read_file_num, self.read_pos = rnum, rpos
        self.cursor_file_num, self.cursor_pos = rnum, rpos
        self.write_file_num, self.write_pos = wnum, wpos

        # metadata not synced before a crash can lag the write segment: writing
        # at writePos would clobber records, so go-diskqueue starts a new
        # segment and lets the reader salvage what lies past writePos
        wpath = self.file_name(wnum)
        try:
            size: int | None = os.stat(wpath).st_size
        except OSError:
            size = None
            if wpos > 0:
                self._log(LogLevel.error, "DISKQUEUE({name}) failed to retrieveMetaData - {path} is missing",
                          name=self.name, path=wpath)
        if size is not None and wpos < size and self.durable:
            self._adopt_tail(wpath, size)
        elif size is not None and wpos < size:
            self._log(LogLevel.warn,
                      "DISKQUEUE({name}) {path} metadata writePos {write_pos} < file size of {size},"
                      " skipping to new file",
                      name=self.name, path=wpath, write_pos=wpos, size=size)
            self.write_file_num += 1
            self.write_pos = 0
        self._normalize_consumed(self.read_file_num)
        self._check_tail_corruption()
        # the reactor takes the depth as loaded, corrections included
        self._depth_delta = 0
        return self.depth

    def _adopt_tail(self, path: str, size: int) -> None:
        """Durable mode: take in the whole records fsynced after the last metadata write.

        Publishers were answered once those records were fsynced, so they are
        part of the queue; a torn record at the end was never acknowledged and
        is cut off.
        """
        with open(path, "r+b") as f:
            f.seek(self.write_pos)
            tail = f.read(size - self.write_pos)
            off = count = 0
            while len(tail) - off >= 4:
                (rsize,) = _SIZE.unpack_from(tail, off)
                if rsize < self.min_msg_size or rsize > self.max_msg_size or off + 4 + rsize > len(tail):
                    break
                off += 4 + rsize
                count += 1
            if off < len(tail):
                f.truncate(self.write_pos + off)
                os.fsync(f.fileno())
        self._log(LogLevel.info,
                  "DISKQUEUE({name}): recovered {count} records written after the last metadata sync"
                  " (cut {torn} torn bytes)",
                  name=self.name, count=count, torn=len(tail) - off)
        self.write_pos += off
        self.depth += count
        self.need_sync = True

    def _persist_metadata(self) -> None:
        """Write the metadata to a temp file, fsync it and rename it into place."""
        path = self.meta_file_name()
        tmp = f"{path}.{self._random.getrandbits(63)}.tmp"
        text = (f"{self.depth}\n{self.read_file_num},{self.read_pos}\n"
                f"{self.write_file_num},{self.write_pos}\n").encode("ascii")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(text)
            while view:
                view = view[os.write(fd, view):]
            try:
                self.fsync_fn(fd)
            except OSError:
                pass  # go-diskqueue ignores the temp file's Sync error too
        except BaseException:
            os.close(fd)
            _remove_quietly(tmp)
            raise
        os.close(fd)
        os.replace(tmp, path)

    def _sync(self) -> bool:
        """fsync the write segment and persist metadata (go-diskqueue's sync)."""
        if self._wfd is not None:
            try:
                self.fsync_fn(self._wfd)
            except OSError as e:
                self._close_write()
                self._truncate_on_open = True
                self._log(LogLevel.error, "DISKQUEUE({name}) failed to sync - {error}",
                          name=self.name, error=str(e))
                return False
        try:
            self._persist_metadata()
        except OSError as e:
            self._log(LogLevel.error, "DISKQUEUE({name}) failed to sync - {error}",
                      name=self.name, error=str(e))
            return False
        self.need_sync = False
        self.count = 0
        return True

    # -- files -------------------------------------------------------------

    def _close_write(self) -> None:
        if self._wfd is not None:
            os.close(self._wfd)
            self._wfd = None

    def _close_read(self) -> None:
        if self._rfd is not None:
            os.close(self._rfd)
            self._rfd = None
            self._rfd_num = -1

    def _remove_segment(self, num: int) -> None:
        path = self.file_name(num)
        if self._rfd_num == num:
            self._close_read()
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            self._log(LogLevel.error, "DISKQUEUE({name}) failed to Remove({path}) - {error}",
                      name=self.name, path=path, error=str(e))

    def _segment_size(self, num: int) -> int | None:
        try:
            return os.stat(self.file_name(num)).st_size
        except OSError:
            return None

    # -- writing -----------------------------------------------------------

    def write_batch(self, batch: Sequence[bytes]) -> tuple[int, str | None]:
        """Append records, rolling segments as go-diskqueue v1.1 does.

        Each segment touched gets one write call.  Returns how many leading
        records are on disk and, if the rest failed, why.
        """
        written = 0
        parts: list[bytes] = []
        chunk_count = chunk_bytes = 0
        try:
            for data in batch:
                size = len(data)
                if size < self.min_msg_size or size > self.max_msg_size:
                    raise ValueError(f"invalid message write size ({size}) minMsgSize={self.min_msg_size}"
                                     f" maxMsgSize={self.max_msg_size}")
                total = 4 + size
                pos = self.write_pos + chunk_bytes
                # roll *before* a record that would pass the limit, unless the
                # segment is empty (a record bigger than a segment gets its own)
                if pos > 0 and pos + total > self.max_bytes_per_file:
                    if parts:
                        self._write_chunk(parts, chunk_count, chunk_bytes)
                        written += chunk_count
                        parts, chunk_count, chunk_bytes = [], 0, 0
                    self._roll()
                parts.append(_SIZE.pack(size))
                parts.append(data)
                chunk_count += 1
                chunk_bytes += total
            if parts:
                self._write_chunk(parts, chunk_count, chunk_bytes)
                written += chunk_count
            if self.durable and self._wfd is not None:
                synced, written = written, 0  # none counts until the fsync succeeds
                self._fsync_written()
                written = synced
        except (OSError, ValueError) as e:
            self._log(LogLevel.error, "DISKQUEUE({name}) failed to write {count} records - {error}",
                      name=self.name, count=len(batch) - written, error=str(e))
            return written, f"DISKQUEUE({self.name}) failed to write: {e}"
        return written, None

    def _fsync_written(self) -> None:
        """Durable mode: a batch counts as written only once fsynced.

        If fsync fails the records may or may not be on disk: the batch is
        reported failed (and retried later, so it may be delivered twice) and
        writing continues in a fresh segment, never over those records.
        """
        try:
            self.fsync_fn(cast(int, self._wfd))
        except OSError:
            self._close_write()
            self.write_file_num += 1
            self.write_pos = 0
            self._truncate_on_open = False
            raise

    def _write_chunk(self, parts: list[bytes], count: int, nbytes: int) -> None:
        if self._wfd is None:
            path = self.file_name(self.write_file_num)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                if self._truncate_on_open:
                    # drop whatever a failed write left past writePos
                    os.ftruncate(fd, self.write_pos)
                os.lseek(fd, self.write_pos, os.SEEK_SET)
            except OSError:
                os.close(fd)
                raise
            self._wfd = fd
            self._truncate_on_open = False
            if self.durable:
                fsync_dir(self.data_path)  # the new segment's name must survive power loss too
            self._log(LogLevel.info, "DISKQUEUE({name}): writeOne() opened {path}", name=self.name, path=path)
        view = memoryview(b"".join(parts))
        try:
            while view:
                view = view[self.write_fn(self._wfd, view):]
        except OSError:
            self._close_write()
            self._truncate_on_open = True
            raise
        self.write_pos += nbytes
        self.depth += count
        self.count += count

    def _roll(self) -> None:
        self.write_file_num += 1
        self.write_pos = 0
        # sync every time we start writing to a new file (fsyncs the old one)
        self._sync()
        self._close_write()

    # -- reading -----------------------------------------------------------

    def _apply_consumption(self, consumption: _Consumption | None) -> None:
        """go-diskqueue's moveForward for a batch of records the reactor handed out."""
        old = self.read_file_num
        if consumption is not None:
            count, num, pos = consumption
            self.read_file_num, self.read_pos = num, pos
            self.depth -= count
            self.count += count
            self._cursor_at_least(num, pos)
        self._normalize_consumed(old)
        self._check_tail_corruption()

    def _cursor_at_least(self, num: int, pos: int) -> None:
        self.cursor_file_num, self.cursor_pos = max((self.cursor_file_num, self.cursor_pos), (num, pos))

    def _normalize_consumed(self, old: int) -> None:
        """Step the read position past fully-read finished segments and delete them."""
        while self.read_file_num < self.write_file_num:
            size = self._segment_size(self.read_file_num)
            if size is None or self.read_pos < size:
                break
            self.read_file_num += 1
            self.read_pos = 0
        self._cursor_at_least(self.read_file_num, self.read_pos)
        if self.read_file_num != old:
            # sync every time we start reading from a new file
            self.need_sync = True
            for num in range(old, self.read_file_num):
                self._remove_segment(num)

    def _check_tail_corruption(self) -> None:
        """At the tail the depth must be 0 and the positions equal; fix them if not."""
        read = (self.read_file_num, self.read_pos)
        write = (self.write_file_num, self.write_pos)
        if read < write:
            return
        if self.depth != 0:
            if self.depth < 0:
                text = (f"DISKQUEUE({self.name}) negative depth at tail ({self.depth}),"
                        " metadata corruption, resetting 0...")
            else:
                text = f"DISKQUEUE({self.name}) positive depth at tail ({self.depth}), data loss, resetting 0..."
            self._log(LogLevel.error, "{text}", text=text)
            self._corruption = text
            self._depth_delta -= self.depth
            self.depth = 0
            self.need_sync = True
        if read != write:
            if self.read_file_num > self.write_file_num:
                text = (f"DISKQUEUE({self.name}) readFileNum > writeFileNum ({self.read_file_num} >"
                        f" {self.write_file_num}), corruption, skipping to next writeFileNum and resetting 0...")
            else:
                text = (f"DISKQUEUE({self.name}) readPos > writePos ({self.read_pos} > {self.write_pos}),"
                        " corruption, skipping to next writeFileNum and resetting 0...")
            self._log(LogLevel.error, "{text}", text=text)
            self._corruption = text
            self._skip_to_next_rw_file()
            self.need_sync = True

    def _skip_to_next_rw_file(self) -> None:
        """Remove every segment from the read one to the write one and start afresh after them."""
        self._close_read()
        self._close_write()
        for num in range(min(self.read_file_num, self.write_file_num), self.write_file_num + 1):
            self._remove_segment(num)
        self.write_file_num = max(self.read_file_num, self.write_file_num) + 1
        self.write_pos = 0
        self.read_file_num = self.cursor_file_num = self.write_file_num
        self.read_pos = self.cursor_pos = 0
        self._truncate_on_open = False
        self._depth_delta -= self.depth
        self.depth = 0

    def _normalize_cursor(self) -> None:
        """Step read-ahead past fully-read finished segments.

        Reaching the end of a finished segment is not an error: the writer may
        have rolled after read-ahead got to the end of what was then the
        write segment.  (go-diskqueue v1.1.0, which nsqd 1.3.0 ships, renames
        such a segment to ``.bad``; later go-diskqueue just deletes it.)
        """
        while self.cursor_file_num < self.write_file_num:
            size = self._segment_size(self.cursor_file_num)
            if size is None or self.cursor_pos < size:
                return
            if (self.read_file_num, self.read_pos) == (self.cursor_file_num, self.cursor_pos):
                self.read_file_num, self.read_pos = self.cursor_file_num + 1, 0
                self.need_sync = True
                self._remove_segment(self.cursor_file_num)
            elif self._rfd_num == self.cursor_file_num:
                self._close_read()
            self.cursor_file_num += 1
            self.cursor_pos = 0

    def read_chunk(self, max_records: int, max_bytes: int) -> list[_ReadRecord]:
        """Read ahead from the cursor: up to ``max_records`` records or about ``max_bytes``."""
        out: list[_ReadRecord] = []
        nbytes = 0
        while len(out) < max_records and nbytes < max_bytes:
            self._normalize_cursor()
            if not self._has_more():
                break
            try:
                nbytes += self._read_records(max_records - len(out), max_bytes - nbytes, out)
            except _ReadError as e:
                if out or (self.read_file_num, self.read_pos) != (self.cursor_file_num, self.cursor_pos):
                    # deal with it once everything before it has been consumed,
                    # as go-diskqueue does (it reads one record at a time)
                    break
                self._handle_read_error(str(e))
        return out

    def _read_records(self, max_records: int, max_bytes: int, out: list[_ReadRecord]) -> int:
        num, pos = self.cursor_file_num, self.cursor_pos
        path = self.file_name(num)
        if self._rfd_num != num or self._rfd is None:
            self._close_read()
            try:
                self._rfd = os.open(path, os.O_RDONLY)
            except OSError as e:
                raise _ReadError(str(e)) from e
            self._rfd_num = num
            self._log(LogLevel.info, "DISKQUEUE({name}): readOne() opened {path}", name=self.name, path=path)
        fd = self._rfd
        if num == self.write_file_num:
            end = self.write_pos
        else:
            end = self._segment_size(num) or 0
        try:
            buf = os.pread(fd, max(min(end - pos, max_bytes), 4), pos)
        except OSError as e:
            raise _ReadError(str(e)) from e
        off = count = 0
        while count < max_records and off < max_bytes:
            remaining = len(buf) - off
            if remaining == 0 and count:
                break
            if remaining < 4:
                if count:
                    break
                raise _ReadError("EOF" if remaining == 0 else "unexpected EOF")
            (size,) = _SIZE.unpack_from(buf, off)
            if size < self.min_msg_size or size > self.max_msg_size:
                if count:
                    break
                # no reasonable guarantee where the next record would begin
                raise _ReadError(f"invalid message read size ({size})")
            total = 4 + size
            if remaining < total:
                if count:
                    break
                try:
                    rec = os.pread(fd, total, pos)
                except OSError as e:
                    raise _ReadError(str(e)) from e
                if len(rec) < total:
                    raise _ReadError("unexpected EOF")
                data = rec[4:]
            else:
                data = buf[off + 4:off + total]
            off += total
            count += 1
            out.append((data, num, pos + off))
        self.cursor_pos = pos + off
        return off

    def _handle_read_error(self, error: str) -> None:
        """Rename the unreadable segment to ``.bad`` and jump to the next one."""
        num = self.read_file_num
        bad = self.file_name(num)
        text = f"DISKQUEUE({self.name}) reading at {self.read_pos} of {bad} - {error}"
        self._log(LogLevel.error, "{text}", text=text)
        if num == self.write_file_num:
            # can't read the current write file: skip it too
            self._close_write()
            self._truncate_on_open = False
            self.write_file_num += 1
            self.write_pos = 0
        self._close_read()
        renamed = bad + ".bad"
        self._log(LogLevel.warn, "DISKQUEUE({name}) jump to next file and saving bad file as {path}",
                  name=self.name, path=renamed)
        try:
            os.rename(bad, renamed)
        except OSError as e:
            self._log(LogLevel.error, "DISKQUEUE({name}) failed to rename bad diskqueue file {src} to {dst} - {error}",
                      name=self.name, src=bad, dst=renamed, error=str(e))
        self.read_file_num = self.cursor_file_num = num + 1
        self.read_pos = self.cursor_pos = 0
        self._corruption = f"{text}; saved bad file as {renamed}"
        self.need_sync = True
        self._check_tail_corruption()

    # -- whole-queue operations --------------------------------------------

    def sync_if_dirty(self) -> None:
        """The sync timer: sync when anything happened since the last sync."""
        if self.count > 0:
            self.need_sync = True

    def empty(self) -> None:
        """Drop every record: remove the segments, restart after them, persist metadata."""
        self._skip_to_next_rw_file()
        self._depth_delta = 0  # the reactor already counts the queue as empty
        self.count = 0
        self.need_sync = True

    def close(self, batch: Sequence[bytes]) -> tuple[int, str | None]:
        """Write what is pending, then fsync, persist metadata and close the files."""
        result = self.write_batch(batch)
        self._apply_consumption(None)
        self._sync()
        self.need_sync = False
        self._close_read()
        self._close_write()
        return result

    def delete(self) -> None:
        """Remove the segments and the metadata; nothing is persisted afterwards."""
        self._skip_to_next_rw_file()
        self._remove_meta()
        self.count = 0
        self.need_sync = False

    def _remove_meta(self) -> None:
        try:
            os.remove(self.meta_file_name())
        except FileNotFoundError:
            pass
        except OSError as e:
            self._log(LogLevel.error, "DISKQUEUE({name}) failed to remove metadata file - {error}",
                      name=self.name, error=str(e))


def fsync_dir(path: str) -> None:
    """Make a directory's entries (a new or renamed file's name) survive power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError as e:
        if e.errno != errno.ENOENT:
            raise


@implementer(IDurableBackendQueue)
class DiskQueue:
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
        read_ahead_records: int = 1024,
        read_ahead_bytes: int = 1 << 20,
        retry_interval: float = 1.0,
        flush_interval: float = FLUSH_INTERVAL,
        write_fn: Callable[[int, Any], int] = os.write,
        fsync_fn: Callable[[int], None] = os.fsync,
        durable: bool = False,
    ) -> None:
        self.name = name
        self.data_path = data_path
        self._min_msg_size = min_msg_size
        self._max_msg_size = max_msg_size
        self._clock = clock
        if executor is None:
            executor = self.default_executor(cast(IReactorFromThreads, clock), name)
        self._executor = executor
        self._read_ahead_records = max(read_ahead_records, 1)
        self._read_ahead_bytes = max(read_ahead_bytes, 1)
        self._retry_interval = retry_interval
        self._disk = _DiskState(name, data_path, max_bytes_per_file, min_msg_size, max_msg_size,
                                sync_every, write_fn, fsync_fn, durable)

        self._depth = 0
        self._epoch = 0  # bumped by empty/delete: results of older operations are stale
        self._closed = False
        self._loaded = False

        # writing
        self._pending: list[bytes] = []
        self._flush_call: IDelayedCall | None = None
        self._retry_call: IDelayedCall | None = None
        self._flushing = False
        self._flush_interval = flush_interval
        self._last_flush = float("-inf")
        self._flush_waiters: list[Deferred[None]] = []
        # records put / written so far, and who waits for a given count
        self._put_seq = 0
        self._written_seq = 0
        #: bytes of the records put and not yet written (they are in memory meanwhile)
        self._backlog_bytes = 0
        self._written_waiters: deque[tuple[int, Deferred[None]]] = deque()
        self._write_error: str | None = None
        self._corruption: str | None = None

        # reading
        self._buffer: deque[_ReadRecord] = deque()
        self._buffer_bytes = 0
        self._refilling = False
        self._disk_more = False
        self._consumed_count = 0
        self._consumed_pos: tuple[int, int] | None = None
        self._readable_callback: Callable[[], object] | None = None
        self._want_readable = True
        self._notify_call: IDelayedCall | None = None
        self._dirty = False
        # durable mode: records handed out by read_positions() but not yet
        # committed; cumulative counts so marks commit in any order
        self._read_total = 0
        self._read_last: tuple[int, int] | None = None
        self._committed_total = 0

        self._sync_loop = LoopingCall(self._sync_tick)
        self._sync_loop.clock = clock
        if sync_timeout > 0:
            self._sync_loop.start(sync_timeout, now=False).addErrback(self._op_failed, "sync timer")

        self.loaded: Deferred[None] = self._submit(self._disk.load).addCallback(self._load_done)
        self.loaded.addErrback(self._op_failed, "load")

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
        self._backlog_bytes += len(data)
        self._schedule_flush()

    def put_many(self, records: Iterable[bytes]) -> None:
        self._check_writable()
        records = list(records)
        for data in records:
            self._check_size(data)
        self._pending.extend(records)
        self._depth += len(records)
        self._put_seq += len(records)
        self._backlog_bytes += sum(map(len, records))
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

    def _release_written(self, error: str | None = None) -> None:
        waiters = self._written_waiters
        while waiters and (waiters[0][0] <= self._written_seq or error is not None):
            target, d = waiters.popleft()
            if target <= self._written_seq:
                d.callback(None)
            else:
                d.errback(BackendError(error))

    def read(self, max_count: int) -> list[bytes]:
        out: list[bytes] = []
        if self._closed:
            return out  # the read position is already persisted; don't hand out more
        buffer = self._buffer
        while buffer and len(out) < max_count:
            data, num, pos = buffer.popleft()
            out.append(data)
            self._buffer_bytes -= len(data)
            self._consumed_pos = (num, pos)
        if out:
            self._consumed_count += len(out)
            self._depth -= len(out)
        self._after_read(len(out), max_count)
        return out

    def _after_read(self, got: int, wanted: int) -> None:
        self._maybe_refill()
        if got < wanted:
            if self._buffer:
                self._schedule_notify()  # a refill finished while we were in here
            else:
                self._want_readable = True

    # -- durable delivery: reads count as consumed only once committed -------

    def read_positions(self, max_count: int) -> list[tuple[bytes, int, int]]:
        """Like ``read``, with each record's end position; the read position
        on disk moves past them only when :meth:`commit_read` says so."""
        out: list[tuple[bytes, int, int]] = []
        if self._closed:
            return out
        buffer = self._buffer
        while buffer and len(out) < max_count:
            rec = buffer.popleft()
            out.append(rec)
            self._buffer_bytes -= len(rec[0])
        if out:
            self._read_total += len(out)
            self._read_last = (out[-1][1], out[-1][2])
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
        self._maybe_refill()

    def set_readable_callback(self, callback: Callable[[], object]) -> None:
        self._readable_callback = callback

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
        """The write failure while there is one, else the last corruption found (until emptied)."""
        return self._write_error or self._corruption

    # -- extras ----------------------------------------------------------------

    @property
    def write_error(self) -> str | None:
        """Why writes are refused right now (``put`` raises), or ``None``."""
        return self._write_error

    @property
    def corruption(self) -> str | None:
        """The last corruption go-diskqueue's rules recovered from, or ``None``."""
        return self._corruption

    # -- plumbing --------------------------------------------------------------

    def _submit(self, fn: Callable[..., Any], *args: Any) -> Deferred[Any]:
        """Run ``fn`` on the disk thread, telling it what ``read`` has consumed so far."""
        consumption: _Consumption | None = None
        if self._consumed_pos is not None:
            consumption = (self._consumed_count, *self._consumed_pos)
            self._consumed_count = 0
            self._consumed_pos = None
            self._dirty = True
        epoch = self._epoch
        d = self._executor.submit(self._disk.run, consumption, fn, *args)
        d.addCallback(self._after_op, epoch)
        return d

    def _after_op(self, result: _OpResult, epoch: int) -> Any:
        for level, fmt, kw in result.events:
            self.log.emit(level, fmt, **kw)
        if epoch == self._epoch:
            self._depth += result.depth_delta
            self._disk_more = result.more
            if result.corruption is not None:
                self._corruption = result.corruption
        return result.value

    def _op_failed(self, failure: Failure, what: str) -> None:
        self.log.failure("DISKQUEUE({name}) {what} failed", failure, name=self.name, what=what)

    def _load_done(self, depth: int) -> None:
        self._depth += depth
        self._loaded = True
        self._maybe_refill()

    def _check_writable(self) -> None:
        if self._closed:
            raise BackendError("exiting")
        if self._write_error is not None:
            raise BackendError(self._write_error)

    def _check_size(self, data: bytes) -> None:
        size = len(data)
        if size < self._min_msg_size or size > self._max_msg_size:
            raise BackendError(f"invalid message write size ({size}) minMsgSize={self._min_msg_size}"
                               f" maxMsgSize={self._max_msg_size}")

    def _stop_timers(self) -> None:
        for call in (self._flush_call, self._retry_call, self._notify_call):
            if call is not None and call.active():
                call.cancel()
        self._flush_call = self._retry_call = self._notify_call = None
        if self._sync_loop.running:
            self._sync_loop.stop()

    def _drop_everything(self) -> None:
        self._epoch += 1
        self._pending = []
        # the records are gone on purpose (empty/delete): nobody waits for them
        self._written_seq = self._put_seq
        self._backlog_bytes = 0
        self._release_written()
        self._buffer.clear()
        self._buffer_bytes = 0
        self._consumed_count = 0
        self._consumed_pos = None
        self._read_total = self._committed_total = 0
        self._read_last = None
        self._depth = 0
        self._disk_more = False
        self._write_error = None
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
        if self._flushing or self._retry_call is not None:
            return
        delay = 0.0
        if not self._written_waiters:
            delay = max(0.0, self._last_flush + self._flush_interval - self._clock.seconds())
        call = self._flush_call
        if call is None:
            self._flush_call = self._clock.callLater(delay, self._flush)
        elif delay == 0.0 and call.getTime() > self._clock.seconds():
            call.reset(0)

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
        self._last_flush = self._clock.seconds()
        epoch = self._epoch
        d = self._submit(self._disk.write_batch, batch)
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
            self._backlog_bytes -= sum(map(len, batch if written == len(batch) else batch[:written]))
        self._release_written(error)
        if error is not None:
            self._pending[:0] = batch[written:]
            self._set_write_error(error)
        elif self._write_error is not None:
            self.log.info("DISKQUEUE({name}) writes work again", name=self.name)
            self._write_error = None

    def _flush_crashed(self, failure: Failure, batch: list[bytes], epoch: int) -> None:
        self._op_failed(failure, "write")
        if epoch == self._epoch:
            self._pending[:0] = batch
            error = f"DISKQUEUE({self.name}) failed to write: {failure.getErrorMessage()}"
            self._release_written(error)
            self._set_write_error(error)

    def _set_write_error(self, error: str) -> None:
        self._write_error = error
        if not self._closed and self._retry_call is None:
            self._retry_call = self._clock.callLater(self._retry_interval, self._flush)

    def _flush_finished(self, _: object) -> None:
        self._flushing = False
        waiters, self._flush_waiters = self._flush_waiters, []
        for waiter in waiters:
            waiter.callback(None)
        if not self._closed:
            self._maybe_refill()
            if self._pending and self._write_error is None:
                self._schedule_flush()

    async def _flush_idle(self) -> None:
        if self._flushing:
            waiter: Deferred[None] = Deferred()
            self._flush_waiters.append(waiter)
            await waiter

    # -- reading ---------------------------------------------------------------

    def _buffer_low(self) -> bool:
        return (len(self._buffer) < self._read_ahead_records // 2 + 1
                and self._buffer_bytes < self._read_ahead_bytes // 2 + 1)

    def _maybe_refill(self) -> None:
        if self._closed or not self._loaded or self._refilling or not self._buffer_low():
            return
        if not (self._disk_more or self._consumed_pos is not None):
            return
        self._refilling = True
        epoch = self._epoch
        d = self._submit(self._disk.read_chunk, self._read_ahead_records, self._read_ahead_bytes)
        d.addCallback(self._refill_done, epoch)
        d.addErrback(self._refill_failed)

    def _refill_done(self, records: list[_ReadRecord], epoch: int) -> None:
        self._refilling = False
        if epoch != self._epoch or self._closed:
            return
        if records:
            self._buffer.extend(records)
            self._buffer_bytes += sum(len(r[0]) for r in records)
            if self._want_readable:
                self._schedule_notify()
        # go again unless that made no progress and nothing new was consumed
        # (records held back behind an unread error wait for read())
        if records or self._consumed_pos is not None:
            self._maybe_refill()

    def _refill_failed(self, failure: Failure) -> None:
        self._refilling = False
        self._op_failed(failure, "read")

    def _schedule_notify(self) -> None:
        """Tell the consumer there is data, from a fresh reactor turn (never inside ``read``)."""
        self._want_readable = False
        if self._notify_call is None and not self._closed:
            self._notify_call = self._clock.callLater(0, self._notify)

    def _notify(self) -> None:
        self._notify_call = None
        if self._readable_callback is not None and self._buffer:
            self._readable_callback()

    # -- sync, close, delete ---------------------------------------------------

    def _sync_tick(self) -> None:
        """--sync-timeout: make sure activity since the last tick reaches the disk."""
        if self._closed or not (self._dirty or self._consumed_pos is not None):
            return
        self._dirty = False
        d = self._submit(self._disk.sync_if_dirty)
        d.addErrback(self._op_failed, "sync")

    async def _close(self) -> None:
        await self._flush_idle()
        batch, self._pending = self._pending, []
        try:
            written, error = await self._submit(self._disk.close, batch)
        finally:
            self._executor.stop()
        if error is not None:
            raise BackendError(f"{error} ({len(batch) - written} records lost on close)")

    async def _delete(self) -> None:
        await self._flush_idle()
        try:
            await self._submit(self._disk.delete)
        finally:
            self._executor.stop()
