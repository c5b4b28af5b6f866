"""Loading a disk queue: go-diskqueue's metadata, read and checked against the segments on disk.

:class:`SegmentLoad` reads ``NAME.diskqueue.meta.dat`` (go-diskqueue's
retrieveMetaData), takes in what a crash left past the recorded write
position, and steps past segments already read to their end. It is the
layer between :class:`~nsqtw.storage.segment_files.SegmentFiles` (the
positions and files) and :class:`~nsqtw.storage.segments.DiskState` (the
operations, each of which loads first while the queue is not loaded).
Disk thread only.

A metadata file or segment that cannot be read for want of descriptors,
memory or a working disk is not corruption: :class:`LoadError` is raised,
no position is taken and nothing is written, so the next operation tries
again on the same files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from twisted.logger import LogLevel

from nsqtw.storage.formats import parse_meta, split_records
from nsqtw.storage.segment_files import SegmentFiles

__all__ = ["LoadError", "SegmentLoad"]


class LoadError(OSError):
    """The queue's metadata or segments could not be read at load (never corruption).

    Nothing runs on a queue whose positions are unknown: every operation
    tries the load again first and fails with this until it works.
    """


@dataclass(slots=True)
class SegmentLoad(SegmentFiles):
    """The load of :class:`~nsqtw.storage.segments.DiskState`, and the read position's steps past
    finished segments it shares with every later operation."""

    #: segments read to their end, to remove (see :meth:`DiskState.run_waited`)
    _removable: list[int] = field(default_factory=list)
    #: the depth the queue was loaded with, handed back with the operation that loaded it
    _loaded_depth: int | None = None

    def _load(self) -> None:
        """Read the metadata file (go-diskqueue's retrieveMetaData) and check it against the segments.

        A file that cannot be read for want of descriptors, memory or a
        working disk raises :class:`LoadError` (go-diskqueue logs it and
        starts at position 0, where its next write overwrites the records);
        the positions are then not taken, and the next operation tries again.
        """
        path = self.meta_file_name()
        try:
            text = self._read_file(path)
        except FileNotFoundError:
            # a new queue, or a crash before its first metadata write: records
            # already written to segment 0 were acknowledged, so they are taken
            # in (durable) or salvaged like any tail past a stale writePos below.
            # go-diskqueue starts at writePos 0 and overwrites them.
            text = b"0\n0,0\n0,0\n"
        except OSError as e:
            raise LoadError(f"DISKQUEUE({self.name}) failed to retrieveMetaData - {e}") from None
        meta = parse_meta(text)
        if meta is None:
            self._log(LogLevel.error, "DISKQUEUE({name}) failed to retrieveMetaData - bad format {text!r}",
                      name=self.name, text=text[:100])
            self._loaded = True
            self._loaded_depth = 0
            return
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
        self._loaded = True
        self._loaded_depth = self.depth

    def _adopt_tail(self, path: str, size: int) -> None:
        """Durable mode: take in the whole records fsynced after the last metadata write.

        Publishers were answered once those records were fsynced, so they are
        part of the queue; a torn record at the end was never acknowledged and
        is cut off.
        """
        with self._open_file(path, "r+b") as f:
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
        # an error here fails the load (LoadError): a depth short by the tail would hold records back
        tail = self._read_file(path, self.write_pos)
        _, count = self._whole_records(tail)
        self.depth += count

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
