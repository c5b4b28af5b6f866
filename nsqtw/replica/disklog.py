"""A replication log's files: its segments, appended on the disk lane, and its journal.

One :class:`StandbyLog` per log (a standby's copies of an owner's topic, or
a node's own log of a replicated topic): the messages as their records
carried them, in segments deleted once every message in them is done, and
the journal of its bookkeeping (:mod:`nsqtw.replica.journal`). Appends of a
reactor turn go to the lane as one job; :class:`~nsqtw.replica.standby.Standby`
keeps what is in memory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from itertools import groupby
from operator import itemgetter
from typing import Any, Final

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure

from nsqtw.core.nsqd import all_of
from nsqtw.core.unwritten import UnwrittenBytes
from nsqtw.interfaces import IDiskExecutor
from nsqtw.replica.journal import Entry, encode_json_entry, remove_files, replace_journal

__all__ = ["FLUSH_BYTES", "FLUSH_DELAY", "SEGMENT_BYTES", "STANDBY_SUFFIX", "StandbyLog", "log_prefix"]

#: a standby's log starts a new segment past this size (a done segment is deleted whole)
SEGMENT_BYTES: Final = 16 * 1024 * 1024
#: without --durable-delivery, a log's appends are written together this long after the first...
FLUSH_DELAY: Final = 0.1
#: ... or once this many bytes wait
FLUSH_BYTES: Final = 1024 * 1024
#: what a standby log's segment file names end with (Go nsqd reads none of them)
STANDBY_SUFFIX: Final = ".nsqtw.standby"

def log_prefix(owner: str, topic: str) -> str:
    """A standby's segment files start with this: the owner (``host:port``, made file-safe) and topic."""
    return f"{re.sub(r'[^A-Za-z0-9._-]', '_', owner)}~{topic}{STANDBY_SUFFIX}"


def _append_all(writes: list[tuple[str, bytes]], fsync: bool, journal: str = "", notes: bytes = b"",
                sync_notes: bool = False) -> None:
    """Disk thread: append each run of data to its segment (in order; a run per segment opened once),
    then the journal's entries of the same while (fsynced only when ``sync_notes``: see
    :meth:`StandbyLog.note`)."""
    for path, run in groupby(writes, key=itemgetter(0)):
        with open(path, "ab") as f:
            f.write(b"".join(data for _, data in run))
            if fsync:
                f.flush()
                os.fsync(f.fileno())
    if notes:
        with open(journal, "ab") as f:
            f.write(notes)
            if sync_notes:
                f.flush()
                os.fsync(f.fileno())


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class _Job:
    """One append job on the lane: who waits for it (None once it ended), its bytes, its failure."""

    __slots__ = ("waiters", "nbytes", "failure")

    def __init__(self, waiters: list[Deferred[None]], nbytes: int) -> None:
        self.waiters: list[Deferred[None]] | None = waiters
        self.nbytes = nbytes
        self.failure: Failure | None = None


class StandbyLog:
    """One log's messages on disk: segments appended on the disk lane, deleted once done, and its
    journal (:mod:`nsqtw.replica.journal`).

    With a ``clock``, appends go to the lane together, as one job: at the end of the reactor turn
    with ``durable`` (a group commit), else :data:`FLUSH_DELAY` after the first or once
    :data:`FLUSH_BYTES` wait (a replicated publish costs no thread hop of its own); anything else
    asked of the lane (a read, a removal) first sends what is waiting, so the lane keeps the order
    it was asked in. Journal entries alone wait :data:`FLUSH_DELAY`.

    An append makes no Deferred: who must wait for the disk (an ACK or OK with
    --durable-delivery) asks :meth:`written` once for what it appended; the
    bytes not yet written count in ``unwritten`` (the node's bound) until their
    job ends, and a job that fails is reported to ``on_failed``, once.
    """

    def __init__(self, directory: str, prefix: str, executor: IDiskExecutor, durable: bool,
                 clock: IReactorTime | None = None, meta: dict[str, Any] | None = None, journal: bool = True,
                 unwritten: UnwrittenBytes | None = None,
                 on_failed: Callable[[Failure], None] | None = None) -> None:
        self.directory = directory
        self.prefix = prefix
        self.executor = executor
        self.durable = durable
        self.clock = clock
        #: [segment number, first arrival in it, bytes]
        self.segments: list[list[int]] = []
        self._next = 0
        #: appends not yet on the lane: (path, data), their bytes, and who waits for them (:meth:`written`)
        self._waiting: list[tuple[str, bytes]] = []
        self._buffered = 0
        self._waiters: list[Deferred[None]] = []
        #: the last append job sent to the lane: its waiters while it runs, its failure once ended
        self._last: _Job | None = None
        #: the current segment's file
        self._path = ""
        self.unwritten = unwritten
        self.on_failed = on_failed
        self._flush_call: IDelayedCall | None = None
        self.journal_path = os.path.join(directory, f"{prefix}.journal")
        #: the log's identity, the journal's first entry (kept for its rewrites)
        self.meta = encode_json_entry(Entry.META, 0, meta or {})
        #: journal entries not yet on the lane; whether one of them (or of a write not yet fsynced)
        #: is one a replay cannot do without (all but FINs), and the journal's size
        self._notes: list[bytes] = [self.meta] if journal else []
        self._structural = journal
        self.journal_bytes = 0
        #: off while a start replays the log (its entries are on disk already), and for good for a log
        #: without a journal (``journal`` false: one never read back)
        self.recording = journal
        self.journaled = journal
        #: the next append starts a new segment (a start found the last one maybe torn, or a write failed)
        self._sealed = False
        #: a write failed: the journal may end in a torn entry, and is rewritten (Standby.maintain)
        self.damaged = False

    def adopt(self, segments: list[list[int]]) -> None:
        """The segments a start found ([number, first arrival, bytes] each); the next append starts
        a new one (the last may end in a torn message)."""
        self.segments = segments
        self._next = max((s[0] for s in segments), default=-1) + 1
        self._sealed = True

    def path(self, number: int, first: int) -> str:
        return os.path.join(self.directory, f"{self.prefix}.{number:06d}.{first}.dat")

    def append(self, data: bytes, first_arrival: int) -> None:
        """Write messages that start at arrival ``first_arrival`` (:meth:`written` says when)."""
        segments = self.segments
        if not segments or segments[-1][2] >= SEGMENT_BYTES or self._sealed:
            segments.append([self._next, first_arrival, 0])
            self._next += 1
            self._sealed = False
            self._path = self.path(self._next - 1, first_arrival)
        n = len(data)
        segments[-1][2] += n
        if self.unwritten is not None:
            self.unwritten.add(n)
        self._waiting.append((self._path, data))
        self._buffered += n
        if self.clock is None:
            self._flush()
        elif self._buffered >= FLUSH_BYTES:
            self.flush()
        else:
            # durable: at the turn's end (its ACK waits for the fsync); else gathered a while, as
            # nothing waits for the write but the node's bound of unwritten bytes
            self._flush_within(0 if self.durable else FLUSH_DELAY)

    def written(self) -> Deferred[None]:
        """Fires once the last append is written (and, durable, fsynced); fails if its job did."""
        if self._waiting:
            d: Deferred[None] = Deferred()
            self._waiters.append(d)
            return d
        last = self._last
        if last is None:
            return succeed(None)
        if last.waiters is not None:
            d = Deferred()
            last.waiters.append(d)
            return d
        return succeed(None) if last.failure is None else fail(last.failure)

    def note(self, entry: bytes, structural: bool = True) -> None:
        """A journal entry, written with the next appends or :data:`FLUSH_DELAY` from now.

        Only ``--durable-delivery`` fsyncs the journal, and only with segment data (the copies an
        ACK waits for) and a ``structural`` entry since its last fsync: a replay needs those (the
        log's identity, its channels, what a SNAP brought) to deliver what the segments hold to
        every channel owing it. A FIN lost in a crash only makes a takeover deliver a finished
        message again, so FINs alone never cost an fsync."""
        if not self.recording:
            return
        self._notes.append(entry)
        self._structural = self._structural or structural
        if self.clock is None:
            self._flush()
        else:
            self._flush_within(FLUSH_DELAY)

    def _flush_within(self, delay: float) -> None:
        """A flush at most ``delay`` from now (0 or :data:`FLUSH_DELAY`): one asked for before is
        brought forward only for 0, as one asked :data:`FLUSH_DELAY` ahead before now is due sooner."""
        assert self.clock is not None
        call = self._flush_call
        if call is None:
            self._flush_call = self.clock.callLater(delay, self._flush)
        elif delay < FLUSH_DELAY and call.getTime() > self.clock.seconds() + delay:
            call.reset(delay)

    def _submit(self, writes: list[tuple[str, bytes]], notes: bytes, sync: bool) -> Deferred[None]:
        """One append job on the lane. A write that fails part way (a full disk) leaves a torn
        record at a file's end, after which nothing may be appended: the next append starts a new
        segment, and the journal is rewritten (:attr:`damaged`, :meth:`rewrite`)."""
        d: Deferred[None] = self.executor.submit(_append_all, writes, self.durable, self.journal_path, notes, sync)
        d.addErrback(self._damage)
        return d

    def _rewrite_failed(self, failure: Failure) -> None:
        self._damage(failure)  # (tried again at the next maintain)

    def _damage(self, failure: Failure) -> Failure:
        self._sealed = True
        self.damaged = True
        return failure

    def _take_notes(self, with_data: bool = True) -> tuple[bytes, bool]:
        """The entries waiting, and whether to fsync them (with segment data: see :meth:`note`)."""
        notes = b"".join(self._notes)
        self._notes = []
        self.journal_bytes += len(notes)
        sync = with_data and self.durable and self._structural
        if sync:
            self._structural = False
        return notes, sync

    def _flush(self) -> None:
        self._flush_call = None
        if not self._waiting:
            if self._notes:
                notes, _ = self._take_notes(False)
                self._submit([], notes, False).addErrback(lambda _: None)  # (damaged: rewritten)
            return
        waiting, self._waiting = self._waiting, []
        job = self._last = _Job(self._waiters, self._buffered)
        self._waiters = []
        self._buffered = 0
        notes, sync = self._take_notes()
        self._submit(waiting, notes, sync).addBoth(self._done, job)

    def _done(self, result: object, job: _Job) -> None:
        """An append job ended: its bytes leave the node's unwritten count, its waiters hear."""
        waiters, job.waiters = job.waiters, None
        if self.unwritten is not None:
            self.unwritten.remove(job.nbytes)
        if isinstance(result, Failure):
            job.failure = result
            if self.on_failed is not None:
                self.on_failed(result)
        for d in waiters or ():
            if job.failure is not None:
                d.errback(job.failure)
            else:
                d.callback(None)

    def flush(self) -> None:
        """Everything waiting to the lane now (a read, a removal, a rewrite, a takeover, the node's stop)."""
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush()

    def drop_before(self, arrival: int) -> None:
        """Delete the segments whose every message arrived before ``arrival`` (all done)."""
        self.flush()
        segments = self.segments
        n = 0
        while n + 1 < len(segments) and segments[n + 1][1] <= arrival:
            n += 1
        if n:
            gone = [self.path(s[0], s[1]) for s in segments[:n]]
            del segments[:n]
            self.executor.submit(remove_files, gone)

    def read_number(self, number: int, first: int) -> Deferred[bytes]:
        """The bytes of segment ``number`` (FileNotFoundError once it was deleted)."""
        self.flush()
        return self.executor.submit(_read, self.path(number, first))

    def read(self, index: int) -> Deferred[tuple[int, bytes]]:
        """Segment ``index`` (of :attr:`segments`): its first arrival and its bytes."""
        self.flush()
        number, first, _ = self.segments[index]
        return self.executor.submit(_read, self.path(number, first)).addCallback(lambda data: (first, data))

    def rewrite(self, checkpoint: bytes) -> None:
        """The journal replaced by its identity and one checkpoint of the state (after the appends
        already asked for: the lane keeps the order)."""
        self._notes = []  # (the checkpoint holds what they say)
        self._structural = False
        self.flush()
        self.damaged = False
        if not self.journaled:
            return
        data = self.meta + checkpoint
        self.journal_bytes = len(data)
        self.executor.submit(replace_journal, self.journal_path, data, self.durable).addErrback(self._rewrite_failed)

    def save(self, checkpoint: bytes) -> Deferred[None]:
        """At a clean stop: the journal written as the log's identity and ``checkpoint``, fsynced,
        after every append asked for (a log without a journal gets one: the next start reads it back);
        fires once written, fails if that or an append before it failed."""
        self.flush()
        written = self.written()
        return all_of([written, self.executor.submit(replace_journal, self.journal_path, self.meta + checkpoint, True)])

    def remove(self) -> Deferred[None]:
        self.flush()
        paths = [self.path(s[0], s[1]) for s in self.segments] + [self.journal_path]
        self.segments = []
        self.recording = False
        return self.executor.submit(remove_files, paths)

    def bytes(self) -> int:
        return sum(s[2] for s in self.segments)
