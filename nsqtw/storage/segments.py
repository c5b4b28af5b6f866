"""go-diskqueue's files: loads, reads, writes, syncs.

Go nsqd keeps each topic's and channel's overflow in nsqio/go-diskqueue files:
``NAME.diskqueue.%06d.dat`` segments of ``[int32 big-endian size][data]``
records and ``NAME.diskqueue.meta.dat`` holding
``depth\\nreadFileNum,readPos\\nwriteFileNum,writePos\\n``. :class:`DiskState`
owns those files and go-diskqueue's positions (held, with the open files and
the check at the tail, by the :class:`~nsqtw.storage.segment_files.SegmentFiles`
it extends); it runs only on its queue's disk executor and touches only bytes
and files; what it wants logged travels back with each result
(:class:`OpResult`). The bytes inside the files are
:mod:`nsqtw.storage.formats`'s.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from twisted.logger import LogLevel

from nsqtw.storage.atomic import atomic_write, check_room, fsync_dir
from nsqtw.storage.executor import Reply
from nsqtw.storage.formats import format_meta, frame_records, nsqd_msg_size_limits, parse_meta, read_size, split_records
from nsqtw.storage.segment_files import LogEvent, SegmentFiles

__all__ = ["Consumption", "DiskState", "OpResult", "ReadChunk", "nsqd_msg_size_limits"]


#: (count, file_num, pos): records consumed since the last disk operation,
#: and the position just past the last of them
Consumption = tuple[int, int, int]
#: records read ahead from one segment: (file_num, position of the first, their data)
ReadChunk = tuple[int, int, list[bytes]]
#: a queue read to its end whose write segment holds at least this much starts a new segment
#: and removes the old one (see :meth:`DiskState._roll_drained`)
DRAINED_ROLL_BYTES = 1 << 20
#: the most one write or read call moves (bar a single bigger record). Its buffer then stays under
#: glibc's mmap threshold, which nsqd fixes at 128 KiB (nsqtw.heap.return_big_blocks), so it comes
#: from the heap and is used again; a buffer over the threshold is mapped for the call and
#: unmapped after it, and filling it faults its pages in one by one (docs/performance.md, Memory)
IO_PIECE = 64 * 1024


class _ReadError(Exception):
    """A record at the read position could not be read (short file or bad size)."""


@dataclass
class OpResult:
    """What one disk-thread operation hands back to the reactor."""

    value: Any
    events: list[LogEvent]
    depth_delta: int
    corruption: str | None
    more: bool
    #: segments renamed to ``.bad`` during the operation
    set_aside: int = 0
    #: a sync (fsync and metadata) ran in this operation: ``""`` if it worked, else why not
    sync_error: str | None = None


@dataclass(slots=True)
class DiskState(SegmentFiles):
    """The operations on go-diskqueue's files, each run on the disk thread as one
    :meth:`run` (or :meth:`run_read`): load, read ahead, write, sync, empty, close.

    The settings, positions and open files are :class:`SegmentFiles`'s.
    """

    # outputs of the operation in progress, besides SegmentFiles'
    _set_aside: int = 0
    _sync_error: str | None = None
    #: segments read to their end, to remove (see :meth:`run_read`)
    _removable: list[int] = field(default_factory=list)
    #: an fsync of the write segment failed and none has worked since
    _segment_unsynced: bool = False

    # -- operation frame ---------------------------------------------------

    def run(self, consumption: Consumption | None, fn: Callable[..., Any], *args: Any) -> OpResult:
        """Apply what the reactor consumed, run ``fn``, sync if due, report back."""
        value = self._operate(consumption, fn, args)
        self._catch_up()
        return self._result(value)

    def run_read(self, consumption: Consumption | None, fn: Callable[..., Any], *args: Any,
                 ) -> OpResult | Reply[OpResult]:
        """:meth:`run` for a read-ahead: the records go back before the work the read made due.

        The reactor waits for a read-ahead while a backlog drains; the
        segments consumed (an unlink of 100 MB can take 100 ms) and the
        sync that reads count towards (go-diskqueue syncs every
        ``sync_every`` reads as well as writes: an fsync and a metadata
        write) are done right after the reply, before the queue's next
        operation, and reported by that operation.
        """
        result = self._result(self._operate(consumption, fn, args))
        if self.need_sync or self._removable:
            return Reply(result, self._catch_up)
        return result

    def _operate(self, consumption: Consumption | None, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """What both frames do first: apply the consumption, run ``fn``, see whether a sync is due."""
        self._apply_consumption(consumption)
        value = fn(*args)
        if self.count >= max(self.sync_every, 1):
            self.need_sync = True
        return value

    def _catch_up(self) -> None:
        """Sync if due, then remove the segments read to their end (:meth:`run` at once,
        :meth:`run_read` after): the metadata names the segment after them before they go,
        so a crash in between leaves no metadata naming a removed segment. They go even if
        the sync failed: on a full disk their space is what lets the next one work."""
        if self.need_sync:
            self._sync()
        self._remove_consumed()

    def _result(self, value: Any) -> OpResult:
        """The operation's outputs, handed over and reset for the next one."""
        events, self._events = self._events, []
        depth_delta, self._depth_delta = self._depth_delta, 0
        corruption, self._corruption = self._corruption, None
        set_aside, self._set_aside = self._set_aside, 0
        sync_error, self._sync_error = self._sync_error, None
        return OpResult(value, events, depth_delta, corruption, self._has_more(), set_aside, sync_error)

    # -- metadata ----------------------------------------------------------

    def load(self) -> int:
        """Read the metadata file (go-diskqueue's retrieveMetaData); returns the depth."""
        path = self.meta_file_name()
        try:
            with open(path, "rb") as f:
                text = f.read()
        except FileNotFoundError:
            # a new queue, or a crash before its first metadata write: records
            # already written to segment 0 were acknowledged, so they are taken
            # in (durable) or salvaged like any tail past a stale writePos below.
            # go-diskqueue starts at writePos 0 and overwrites them.
            text = b"0\n0,0\n0,0\n"
        except OSError as e:
            self._log(LogLevel.error, "DISKQUEUE({name}) failed to retrieveMetaData - {error}",
                      name=self.name, error=str(e))
            return 0
        meta = parse_meta(text)
        if meta is None:
            self._log(LogLevel.error, "DISKQUEUE({name}) failed to retrieveMetaData - bad format {text!r}",
                      name=self.name, text=text[:100])
            return 0
        depth, rnum, rpos, wnum, wpos = meta
        self.depth = depth
        self.read_file_num, self.read_pos = rnum, rpos
        self.cursor_file_num, self.cursor_pos = rnum, rpos
        self.write_file_num, self.write_pos = wnum, wpos

        # metadata not synced before a crash can lag the write segment: writing
        # at writePos would clobber records, so go-diskqueue starts a new
        # segment and lets the reader salvage what lies past writePos
        wpath = self.file_name(wnum)
        size = self._segment_size(wnum)
        if size is None and wpos > 0 and (rnum, rpos) == (wnum, wpos) and depth == 0:
            # a drained segment removed before the metadata naming its successor was
            # written (its sync failed, then a crash): carry on from the next one
            wnum, wpos = wnum + 1, 0
            self._start_at(wnum)
            self.need_sync = True
            wpath = self.file_name(wnum)
            size = self._segment_size(wnum)
        elif size is None and wpos > 0:
            self._log(LogLevel.error, "DISKQUEUE({name}) failed to retrieveMetaData - {path} is missing",
                      name=self.name, path=wpath)
        if size is not None and wpos < size and self.durable:
            self._adopt_tail(wpath, size)
        elif size is not None and wpos < size:
            self._log(LogLevel.warn,
                      "DISKQUEUE({name}) {path} metadata writePos {write_pos} < file size of {size},"
                      " skipping to new file",
                      name=self.name, path=wpath, write_pos=wpos, size=size)
            self._count_salvaged_tail(wpath, size)
            self.write_file_num += 1
            self.write_pos = 0
        if self.durable:
            self._adopt_later_segments()
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
            off, count = self._whole_records(tail)
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

    def _adopt_later_segments(self) -> None:
        """Durable mode: take in the segments begun after the last metadata write.

        A failed fsync moves writing to a new segment (:meth:`_fsync_written`)
        without writing the metadata (the fsync is what failed); the batch is
        written again there once fsyncs work, and acknowledged. A kill -9
        before the next metadata write left the metadata naming the old
        segment, and those records were lost (found by
        ``test_fault_matrix.py::test_failing_fsync[durable]``).
        """
        while True:
            path = self.file_name(self.write_file_num + 1)
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                return
            self.write_file_num += 1
            self.write_pos = 0
            self.need_sync = True
            if size:
                self._adopt_tail(path, size)

    def _whole_records(self, tail: bytes) -> tuple[int, int]:
        """How far the whole, valid records at the start of ``tail`` reach, and how many they are."""
        records, off = split_records(tail, len(tail), self.min_msg_size, self.max_msg_size)
        return off, len(records)

    def _count_salvaged_tail(self, path: str, size: int) -> None:
        """Count the records the reader will salvage past a stale writePos in the depth.

        After a kill -9 between a write and its metadata sync, the segment
        holds records the metadata's depth does not count. go-diskqueue reads
        them anyway and lets the depth go negative until the tail resets it
        (logging "metadata corruption"). Here the depth counts them from the
        start: the queue's readers take records while the depth says there
        are some, so a depth short by k would leave the last k records
        undelivered until more were written (found by the kill -9 test).
        """
        try:
            with open(path, "rb") as f:
                f.seek(self.write_pos)
                tail = f.read(size - self.write_pos)
        except OSError:
            return  # the reader meets the same error and handles it as go-diskqueue does
        _, count = self._whole_records(tail)
        self.depth += count

    def _persist_metadata(self) -> None:
        """Replace the metadata file atomically (go-diskqueue does not fsync the directory)."""
        text = format_meta(self.depth, self.read_file_num, self.read_pos, self.write_file_num, self.write_pos)
        # go-diskqueue ignores the temp file's Sync error too
        atomic_write(self.meta_file_name(), text, fsync=self.fsync_fn, ignore_fsync_error=True,
                     sync_dir=False)

    def _sync(self) -> bool:
        """fsync the write segment and persist metadata (go-diskqueue's sync).

        After a failed fsync the write file is closed (as go-diskqueue does);
        go-diskqueue's next sync then only writes metadata and calls that a
        success. Here the retry fsyncs the segment through a new descriptor
        first, so a sync counts as working (and health as OK) only once the
        segment's data really was fsynced.
        """
        if self._wfd is not None:
            try:
                self.fsync_fn(self._wfd)
            except OSError as e:
                self._close_write()
                self._truncate_on_open = True
                self._segment_unsynced = True
                return self._sync_failed(e)
        elif self._segment_unsynced:
            try:
                self._fsync_path(self.file_name(self.write_file_num))
            except FileNotFoundError:
                pass  # nothing was written to it after all
            except OSError as e:
                return self._sync_failed(e)
        self._segment_unsynced = False
        try:
            self._persist_metadata()
        except OSError as e:
            return self._sync_failed(e)
        self.need_sync = False
        self.count = 0
        self._sync_error = ""
        return True

    def _fsync_path(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            self.fsync_fn(fd)
        finally:
            os.close(fd)

    def _sync_failed(self, e: OSError) -> bool:
        # need_sync stays set: the next operation on this queue tries again
        self._log(LogLevel.error, "DISKQUEUE({name}) failed to sync - {error}", name=self.name, error=str(e))
        self._sync_error = f"DISKQUEUE({self.name}) failed to sync: {e}"
        return False

    # -- writing -----------------------------------------------------------

    def write_batch(self, batch: list[bytes]) -> tuple[int, str | None]:
        """Append records, rolling segments as go-diskqueue v1.1 does.

        Records go out in writes of at most IO_PIECE bytes.  Returns how many leading
        records are on disk and, if the rest failed, why.
        """
        written = 0
        n = len(batch)
        try:
            if self.keep_free:
                check_room(self.data_path, sum(map(len, batch)) + 4 * len(batch), self.keep_free,
                           "delivering what is queued")
            while written < n:
                size = len(batch[written])
                if size < self.min_msg_size or size > self.max_msg_size:
                    raise ValueError(f"invalid message write size ({size}) minMsgSize={self.min_msg_size}"
                                     f" maxMsgSize={self.max_msg_size}")
                # roll *before* a record that would pass the limit, unless the
                # segment is empty (a record bigger than a segment gets its own)
                if self.write_pos > 0 and self.write_pos + 4 + size > self.max_bytes_per_file:
                    self._roll()
                room = self.max_bytes_per_file - self.write_pos
                framed, count = frame_records(batch, written, room if room < IO_PIECE else IO_PIECE,
                                              self.min_msg_size, self.max_msg_size)
                self._write_chunk(framed, count)
                written += count
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

    def _write_chunk(self, framed: bytes, count: int) -> None:
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
        size = len(framed)
        try:
            done = self.write_fn(self._wfd, framed)
            while done < size:  # a short write: the rest, from where it stopped
                done += self.write_fn(self._wfd, memoryview(framed)[done:])
        except OSError:
            self._close_write()
            self._truncate_on_open = True
            raise
        self.write_pos += size
        self.depth += count
        self.count += count

    def _roll(self) -> None:
        self.write_file_num += 1
        self.write_pos = 0
        # sync every time we start writing to a new file (fsyncs the old one)
        self._sync()
        self._close_write()

    # -- reading -----------------------------------------------------------

    def _apply_consumption(self, consumption: Consumption | None) -> None:
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
        self._roll_drained()

    def _roll_drained(self) -> None:
        """A queue read to its end gives its write segment's space back.

        go-diskqueue frees space only when the reader leaves a segment, and
        the writer leaves one only at ``--max-bytes-per-file`` (100 MiB by
        default): a queue that is always drained keeps every record it ever
        held, up to that size. Under ``--durable-delivery`` every message
        passes through the topic's queue and each channel's, so a small disk
        filled with records consumers had long finished and publishing
        stopped (and the journals, which need space to deliver anything,
        stopped delivery too). Once every record of a segment of
        :data:`DRAINED_ROLL_BYTES` or more is consumed (with a smaller
        ``--max-bytes-per-file`` go-diskqueue's own roll bounds it), the next record goes
        to a new segment and the old one is removed. The files stay
        go-diskqueue's: the metadata names the new segment for both the
        read and the write position, as go-diskqueue's own roll would.
        """
        if self.write_pos < DRAINED_ROLL_BYTES:
            return  # smaller segments keep go-diskqueue's layout (and its metadata) exactly
        if (self.read_file_num, self.read_pos) != (self.write_file_num, self.write_pos):
            return
        self._close_write()
        self._removable.append(self.write_file_num)
        self._start_at(self.write_file_num + 1)
        self._segment_unsynced = False  # whatever it held was consumed
        self.need_sync = True

    def _normalize_consumed(self, old: int) -> None:
        """Step the read position past fully-read finished segments, to be removed (:meth:`_remove_consumed`)."""
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
            self._removable.extend(range(old, self.read_file_num))

    def _remove_consumed(self) -> None:
        """Remove the segments read to their end."""
        removable, self._removable = self._removable, []
        for num in removable:
            self._remove_segment(num)

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

    def read_chunk(self, max_records: int, max_bytes: int) -> list[ReadChunk]:
        """Read ahead from the cursor: up to ``max_records`` records or about ``max_bytes``."""
        out: list[ReadChunk] = []
        count = nbytes = 0
        while count < max_records and nbytes < max_bytes:
            self._normalize_cursor()
            if not self._has_more():
                break
            try:
                got, size = self._read_records(max_records - count, max_bytes - nbytes)
            except _ReadError as e:
                if out or (self.read_file_num, self.read_pos) != (self.cursor_file_num, self.cursor_pos):
                    # deal with it once everything before it has been consumed,
                    # as go-diskqueue does (it reads one record at a time)
                    break
                self._handle_read_error(str(e))
                continue
            out.append(got)
            count += len(got[2])
            nbytes += size
        return out

    def _read_records(self, max_records: int, max_bytes: int) -> tuple[ReadChunk, int]:
        """At least one record from the cursor's segment (or _ReadError), and the bytes they take there."""
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
            buf = os.pread(fd, max(min(end - pos, max_bytes, IO_PIECE), 4), pos)
        except OSError as e:
            raise _ReadError(str(e)) from e
        data, off = split_records(buf, max_records, self.min_msg_size, self.max_msg_size)
        if not data:
            # the first record is not whole and valid in what was read: find out why
            if len(buf) < 4:
                raise _ReadError("EOF" if not buf else "unexpected EOF")
            size = read_size(buf)
            if size < self.min_msg_size or size > self.max_msg_size:
                # no reasonable guarantee where the next record would begin
                raise _ReadError(f"invalid message read size ({size})")
            # bigger than the read: read it whole
            off = 4 + size
            try:
                rec = os.pread(fd, off, pos)
            except OSError as e:
                raise _ReadError(str(e)) from e
            if len(rec) < off:
                raise _ReadError("unexpected EOF")
            data = [rec[4:]]
        self.cursor_pos = pos + off
        return (num, pos, data), off

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
        self._set_aside += 1
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

    def close(self, batch: list[bytes]) -> tuple[int, str | None]:
        """Write what is pending, then fsync, persist metadata and close the files."""
        result = self.write_batch(batch)
        self._apply_consumption(None)
        self._sync()
        self.need_sync = False
        self._remove_consumed()
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
