"""Where a disk queue's reader and writer are in its go-diskqueue files, and the files they name.

:class:`SegmentFiles` holds one queue's settings, go-diskqueue's positions
(readFileNum/readPos, writeFileNum/writePos, the depth) with the read-ahead
cursor beside them, and the segment descriptors open for reading and
writing; it names the files, closes and removes them, and keeps the
positions consistent at the tail as go-diskqueue's checkTailCorruption
does. The operations on them (load, read, write, sync) are
:class:`nsqtw.storage.segments.DiskState`'s; like those, everything here
runs on the queue's disk thread only, and what it wants logged goes back
with the operation's result.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from twisted.logger import LogLevel

__all__ = ["LogEvent", "SegmentFiles"]

#: (level, format, fields) of a log event produced on the disk thread
LogEvent = tuple[LogLevel, str, dict[str, Any]]


@dataclass(slots=True)
class SegmentFiles:
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
    #: a write that would leave less than this many bytes free on the data path's filesystem
    #: fails as if the disk were full (see :func:`nsqtw.storage.durable.keep_free`)
    keep_free: int = 0
    #: opens the metadata and the segments (``os.open``'s arguments): tests make it fail as a
    #: process out of descriptors does (EMFILE)
    open_fn: Callable[..., int] = os.open

    read_file_num: int = 0
    read_pos: int = 0
    write_file_num: int = 0
    write_pos: int = 0
    depth: int = 0
    cursor_file_num: int = 0
    cursor_pos: int = 0
    count: int = 0
    need_sync: bool = False

    #: the positions were read from the metadata (:meth:`DiskState._load`); until then nothing
    #: may be written, read or persisted
    _loaded: bool = False
    _wfd: int | None = None
    _truncate_on_open: bool = False
    _rfd: int | None = None
    _rfd_num: int = -1
    #: the last segments whose opening was logged: a descriptor closed while its queue idles
    #: is opened again without a second "opened" line (go-diskqueue opens each segment once)
    _read_logged: int = -1
    _write_logged: int = -1
    #: the sizes of finished segments looked up, by number, until they are removed or set aside.
    #: A segment the writer has left never changes size, and a read-ahead asks for it at every
    #: piece it reads (a system call, so a GIL release and take, per 64 KiB): looked up once.
    #: Only the segments at the read position and at the cursor are looked up
    _finished: dict[int, int] = field(default_factory=dict)

    # outputs of the operation in progress (the rest are DiskState's)
    _events: list[LogEvent] = field(default_factory=list)
    _depth_delta: int = 0
    _corruption: str | None = None

    # -- names and log events ----------------------------------------------

    def file_name(self, num: int) -> str:
        return os.path.join(self.data_path, f"{self.name}.diskqueue.{num:06d}.dat")

    def meta_file_name(self) -> str:
        return os.path.join(self.data_path, f"{self.name}.diskqueue.meta.dat")

    def _log(self, level: LogLevel, fmt: str, **kw: Any) -> None:
        """A log event, handed back with the operation's result."""
        self._events.append((level, fmt, kw))

    # -- positions ---------------------------------------------------------

    def _has_more(self) -> bool:
        return (self.cursor_file_num, self.cursor_pos) < (self.write_file_num, self.write_pos)

    def _cursor_at_least(self, num: int, pos: int) -> None:
        self.cursor_file_num, self.cursor_pos = max((self.cursor_file_num, self.cursor_pos), (num, pos))

    def _start_at(self, num: int) -> None:
        """Read, read-ahead and write positions all at the start of segment ``num`` (nothing queued)."""
        self.write_file_num = self.read_file_num = self.cursor_file_num = num
        self.write_pos = self.read_pos = self.cursor_pos = 0
        self._truncate_on_open = False

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
        self._start_at(max(self.read_file_num, self.write_file_num) + 1)
        self._depth_delta -= self.depth
        self.depth = 0

    # -- files -------------------------------------------------------------

    def _open_file(self, path: str, mode: str) -> IO[bytes]:
        """A file object over :attr:`open_fn` (``"rb"`` or ``"r+b"``)."""
        return os.fdopen(self.open_fn(path, os.O_RDWR if "+" in mode else os.O_RDONLY), mode)

    def _read_file(self, path: str, offset: int = 0) -> bytes:
        """The file's bytes from ``offset`` on, through :attr:`open_fn` and plain reads (a node
        loading 30,000 queues reads 30,000 metadata files; a file object each cost twice as much)."""
        fd = self.open_fn(path, os.O_RDONLY)
        try:
            chunks = [os.pread(fd, 1 << 16, offset)]
            while len(chunks[-1]) == 1 << 16:  # a short read of a regular file is its end
                offset += 1 << 16
                chunks.append(os.pread(fd, 1 << 16, offset))
            return b"".join(chunks)
        finally:
            os.close(fd)

    def files_open(self) -> bool:
        """Whether the queue holds a descriptor (an idle one is asked to give them back)."""
        return self._rfd is not None or self._wfd is not None

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
        self._forget_size(num)
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            self._log(LogLevel.error, "DISKQUEUE({name}) failed to Remove({path}) - {error}",
                      name=self.name, path=path, error=str(e))

    def _forget_size(self, num: int) -> None:
        """The segment is removed or set aside: its kept size no longer says anything."""
        self._finished.pop(num, None)

    def _segment_size(self, num: int) -> int | None:
        """The segment's size, or ``None`` if it is not there (or cannot be looked at now)."""
        kept = self._kept_size(num)
        if kept is not None:
            return kept
        try:
            return self._keep_size(num, os.stat(self.file_name(num)).st_size)
        except OSError:
            return None

    def _open_segment_size(self, num: int, fd: int) -> int:
        """The size of segment ``num``, open as ``fd``; raises OSError."""
        kept = self._kept_size(num)
        return kept if kept is not None else self._keep_size(num, os.fstat(fd).st_size)

    def _kept_size(self, num: int) -> int | None:
        return self._finished.get(num) if num < self.write_file_num else None

    def _keep_size(self, num: int, size: int) -> int:
        if num < self.write_file_num:  # finished: its size is final
            self._finished[num] = size
        return size
