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

from nsqtw.storage.atomic import atomic_write, check_room, fsync_dir, remove_quietly, write_temp
from nsqtw.storage.executor import Reply
from nsqtw.storage.formats import format_meta, frame_records, nsqd_msg_size_limits, read_size, split_records
from nsqtw.storage.segment_files import LogEvent
from nsqtw.storage.segment_load import LoadError, SegmentLoad

__all__ = ["Consumption", "DiskState", "LoadError", "OpResult", "ReadChunk", "nsqd_msg_size_limits"]


#: (count, file_num, pos): records consumed since the last disk operation,
#: and the position just past the last of them
Consumption = tuple[int, int, int]
#: records read ahead from one segment: (file_num, position of the first, their data, the bytes of
#: that data, size fields left out): the reactor keeps its read-ahead's byte count from the last,
#: not by adding up the records' lengths again (:class:`nsqtw.storage.readahead.ReadAhead`)
ReadChunk = tuple[int, int, list[bytes], int]
#: a queue read to its end whose write segment holds at least this much starts a new segment
#: and removes the old one (see :meth:`DiskState._roll_drained`)
DRAINED_ROLL_BYTES = 1 << 20
#: the most one write or read call moves (bar a single bigger record). Its buffer then stays under
#: glibc's mmap threshold, which nsqd fixes at 128 KiB (nsqtw.heap.return_big_blocks), so it comes
#: from the heap and is used again; a buffer over the threshold is mapped for the call and
#: unmapped after it, and filling it faults its pages in one by one (docs/performance.md, Memory)
IO_PIECE = 64 * 1024


class _ReadError(Exception):
    """The data at the read position is bad: a short file, a bad size, a missing segment (corruption)."""


class _CannotRead(Exception):
    """The read position's segment could not be opened or read now, through no fault of its data.

    Out of descriptors (EMFILE, ENFILE), memory (ENOMEM), an I/O error
    (EIO), a permission: nothing says the records are bad, so the segment is
    kept and the read is tried again later.
    """




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
    #: the depth the queue was loaded with, if this operation loaded it
    loaded: int | None = None
    #: a read-ahead ran in this operation: ``""`` if it could read, else why not
    read_error: str | None = None
    #: whether the queue holds a descriptor after the operation
    files_open: bool = False
    #: the operation made a sync due that runs after its reply (:meth:`DiskState.run_waited`)
    sync_follows: bool = False


@dataclass(slots=True)
class DiskState(SegmentLoad):
    """The operations on go-diskqueue's files, each run on the disk thread as one
    :meth:`run` (or :meth:`run_waited`): load, read ahead, write, sync, empty, close.

    The settings, positions and open files are :class:`SegmentFiles`'s, the load
    :class:`~nsqtw.storage.segment_load.SegmentLoad`'s.
    """

    # outputs of the operation in progress, besides SegmentFiles'
    _set_aside: int = 0
    _sync_error: str | None = None
    #: an fsync of the write segment failed and none has worked since
    _segment_unsynced: bool = False
    _read_error: str | None = None
    #: the read-ahead under way was asked for by a reader (see :meth:`run_waited`)
    _reading: bool = False
    #: a grouped close's metadata, written beside the file until the group's syncfs (:meth:`close`)
    _meta_beside: str | None = None
    _removable_after: list[int] = field(default_factory=list)

    # -- operation frame ---------------------------------------------------

    def run(self, consumption: Consumption | None, fn: Callable[..., Any], *args: Any) -> OpResult:
        """Apply what the reactor consumed, run ``fn``, sync if due, report back."""
        value = self._operate(consumption, fn, args)
        self._catch_up()
        return self._result(value)

    def run_waited(self, consumption: Consumption | None, fn: Callable[..., Any], *args: Any,
                   ) -> OpResult | Reply[OpResult]:
        """:meth:`run` for what the reactor waits for, a read-ahead or a write: its result goes
        back before the work the operation made due.

        A reader waits for a read-ahead while a backlog drains, and the
        publishers of a queue whose disk thread is behind wait for its
        writes. The segments consumed (an unlink of 100 MB can take 100 ms)
        and the sync that reads and writes count towards (go-diskqueue
        syncs every ``sync_every`` of them: an fsync and a metadata write,
        milliseconds on a real disk) are done right after the reply, before
        the queue's next operation, and reported by that operation. So the
        records a write handed over count as written once ``write()``
        returned, as they do in go-diskqueue, whose publishers are answered
        before the sync that their writes made due.
        """
        result = self._result(self._operate(consumption, fn, args))
        # a descriptor stays open only where it is about to be used again: the queue is being
        # written, or being read with more to read. A read-ahead nobody reads (a topic without
        # channels, a channel without clients, thousands of them at start) gives it back at once
        reading = consumption is not None or self._reading
        if self._rfd is not None and not (self._wfd is not None or (reading and self._has_more())):
            self._close_read()
            result.files_open = self.files_open()
        if self.need_sync or self._removable:
            result.sync_follows = self.need_sync
            return Reply(result, self._catch_up)
        return result

    def _operate(self, consumption: Consumption | None, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """What both frames do first: load if not loaded yet, apply the consumption, run ``fn``,
        see whether a sync is due. A load that fails raises :class:`LoadError` before anything
        else runs (the reactor's queue hands over no consumption before it is loaded)."""
        if not self._loaded:
            try:
                self._load()
            except LoadError:
                raise
            except OSError as e:
                raise LoadError(f"DISKQUEUE({self.name}) failed to open its files - {e}") from None
        self._apply_consumption(consumption)
        value = fn(*args)
        if self.count >= max(self.sync_every, 1):
            self.need_sync = True
        return value

    def _catch_up(self) -> None:
        """Sync if due, then remove the segments read to their end (:meth:`run` at once,
        :meth:`run_waited` after): the metadata names the segment after them before they go,
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
        loaded, self._loaded_depth = self._loaded_depth, None
        read_error, self._read_error = self._read_error, None
        return OpResult(value, events, depth_delta, corruption, self._has_more(), set_aside, sync_error,
                        loaded, read_error, self.files_open())

    # -- metadata ----------------------------------------------------------

    def load(self) -> None:
        """The queue's first operation: :meth:`_operate` loads it (as it does before any operation
        while the queue is not loaded); the depth goes back as :attr:`OpResult.loaded`."""

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
        fd = self.open_fn(path, os.O_RDONLY)
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
            fd = self.open_fn(path, os.O_RDWR | os.O_CREAT, 0o600)
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
            if self._write_logged != self.write_file_num:  # not again when an idle queue opens it again
                self._write_logged = self.write_file_num
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

    def read_chunk(self, max_records: int, max_bytes: int, reading: bool = False) -> list[ReadChunk]:
        """Read ahead from the cursor: up to ``max_records`` records or about ``max_bytes``.

        ``reading``: a reader asked for it (its segment stays open while there is more to read).

        Bad data sets its segment aside (:meth:`_handle_read_error`); a segment
        that cannot be opened or read now (:class:`_CannotRead`) is kept, and the
        failure goes back as :attr:`OpResult.read_error` for the queue to retry.
        """
        out: list[ReadChunk] = []
        count = nbytes = 0
        self._read_error = ""
        self._reading = reading
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
            except _CannotRead as e:
                self._cannot_read(str(e))
                break
            out.append(got)
            count += len(got[2])
            nbytes += size
        return out

    def rewind(self, handed: tuple[int, int] | None) -> None:
        """The reactor let its read-ahead go: read again from ``handed``, just past the last
        record it handed out, or from the read position if that is further; never forward."""
        at = (self.read_file_num, self.read_pos)
        if handed is not None and handed > at:
            at = handed
        if at < (self.cursor_file_num, self.cursor_pos):
            self.cursor_file_num, self.cursor_pos = at
        self._reading = False
        self._close_read()

    def _read_records(self, max_records: int, max_bytes: int) -> tuple[ReadChunk, int]:
        """At least one record from the cursor's segment (or _ReadError), and the bytes they take there."""
        num, pos = self.cursor_file_num, self.cursor_pos
        if self._rfd_num != num or self._rfd is None:
            self._close_read()
            path = self.file_name(num)
            try:
                self._rfd = self.open_fn(path, os.O_RDONLY)
            except FileNotFoundError as e:
                raise _ReadError(str(e)) from e  # the records are not there: go-diskqueue's corruption
            except OSError as e:
                raise _CannotRead(str(e)) from e
            self._rfd_num = num
            if self._read_logged != num:  # not again when an idle queue opens it again
                self._read_logged = num
                self._log(LogLevel.info, "DISKQUEUE({name}): readOne() opened {path}", name=self.name, path=path)
        fd = self._rfd
        try:
            end = self.write_pos if num == self.write_file_num else self._open_segment_size(num, fd)
            buf = os.pread(fd, max(min(end - pos, max_bytes, IO_PIECE), 4), pos)
        except OSError as e:
            raise _CannotRead(str(e)) from e
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
                raise _CannotRead(str(e)) from e
            if len(rec) < off:
                raise _ReadError("unexpected EOF")
            data = [rec[4:]]
        self.cursor_pos = pos + off
        return (num, pos, data, off - 4 * len(data)), off

    def _cannot_read(self, error: str) -> None:
        """A resource error at the read position: report it (the queue logs it); the segment stays as it is."""
        self._close_read()
        self._read_error = f"DISKQUEUE({self.name}) failed to read {self.file_name(self.cursor_file_num)} - {error}"

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
        self._forget_size(num)
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

    def report(self) -> None:
        """Nothing: an operation run only for its result, which reports the sync before it."""

    def sync_if_dirty(self) -> None:
        """The sync timer: sync when anything happened since the last sync."""
        if self.count > 0:
            self.need_sync = True

    def release_files(self) -> None:
        """An idle queue gives its descriptors back; the next read or write opens them again.

        What was written through the write descriptor is fsynced first
        (with the metadata): a later sync would have no descriptor to fsync
        it through.
        """
        if self._wfd is not None and (self.count > 0 or self.need_sync):
            self._sync()
        self._close_read()
        self._close_write()

    def empty(self) -> None:
        """Drop every record: remove the segments, restart after them, persist metadata."""
        self._skip_to_next_rw_file()
        self._depth_delta = 0  # the reactor already counts the queue as empty
        self.count = 0
        self.need_sync = True

    def close(self, batch: list[bytes], grouped: bool = False) -> tuple[int, str | None, bool]:
        """Write what is pending, then fsync, persist metadata and close the files.

        A queue with nothing new since its last sync (or its load) writes no
        metadata: the file says what it would. ``grouped`` (a graceful stop
        with a :class:`~nsqtw.storage.groupsync.GroupSync`): the new metadata
        is written beside the old without an fsync and the third value is
        true; the queue's fsyncs are the group's ``syncfs``, after which
        :meth:`finish_close` renames it into place.
        """
        written, error = self.write_batch(batch)
        self._apply_consumption(None)
        self._close_read()
        due = self.count > 0 or self.need_sync or self._segment_unsynced
        if due and grouped and not self._segment_unsynced:
            self._close_write()  # the syncfs writes back what went through it
            path = self.meta_file_name()
            text = format_meta(self.depth, self.read_file_num, self.read_pos, self.write_file_num, self.write_pos)
            try:
                self._meta_beside = write_temp(path, text, self.open_fn)
            except OSError as e:
                self._sync_failed(e)  # the metadata stays as it was; the next start salvages the tail
            self.need_sync = False
            # removed once the metadata naming the segments after them is in place (finish_close)
            self._removable_after, self._removable = self._removable, []
            return written, error, True
        if due:
            self._sync()
        self.need_sync = False
        self._remove_consumed()
        self._close_write()
        return written, error, False

    def finish_close(self, synced: bool) -> None:
        """After the group's ``syncfs``: the metadata written beside replaces the old one, then the
        segments read to their end go. A ``syncfs`` that failed: the queue syncs on its own."""
        tmp, self._meta_beside = self._meta_beside, None
        self._removable[:0], self._removable_after = self._removable_after, []
        if synced and tmp is not None:
            try:
                os.replace(tmp, self.meta_file_name())
                self.count = 0
                self._sync_error = ""
            except OSError as e:
                self._sync_failed(e)
        else:
            if tmp is not None:
                remove_quietly(tmp)
            self._segment_unsynced = True  # fsynced through a new descriptor
            self._sync()
        self.need_sync = False

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
