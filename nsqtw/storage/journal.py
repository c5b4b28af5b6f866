"""The per-channel journal of ``--durable-delivery``.

A channel's backlog stays in its go-diskqueue files; what leaves them (a
message taken for delivery, a DPUB message waiting for its time) would live
only in memory.  The journal is an append-only file beside the queue that
records those messages and what happens to them, so a restart after kill -9
rebuilds exactly the unfinished ones:

========  ==========================================  =====================================
type      payload                                     meaning
========  ==========================================  =====================================
``M``     id, timestamp, attempts, due (ms), body     the message is now owned by the journal
``A``     id, attempts, due (ms)                      new attempts / due time of an owned one
``F``     id                                          FIN: forget it
``T``     queue file number, position                 the channel's disk queue was read to here
``H``     topic file number, position                 the topic's records up to here are safe here
``C``     (none)                                      the channel was emptied
``D``     id, due (ms)                                topic journal: a DPUB message's due time
========  ==========================================  =====================================

A topic has a journal too, for ``D`` records only: nsqd's queue record has
no field for a DPUB message's due time.

Each record is ``[4-byte length][type][payload][4-byte CRC-32 of type+payload]``
after an 8-byte header.  Appends made while a write is running go together
in the next write, and each write is fsynced before anyone waiting on it is
told (group commit).  Replay stops at the first record that is short or
fails its CRC (a torn tail) and cuts the file there.  When the file grows to
more than twice what its live messages need, the next write replaces it with
a snapshot of the live ones (compaction): the reactor only lists them (a tuple
per message, nothing encoded); the records are built and written on the
journal's disk lane.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred, ensureDeferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure

from nsqtw.core.message import Message
from nsqtw.interfaces import IDiskExecutor, Position
from nsqtw.log import Logger
from nsqtw.storage.atomic import atomic_write, check_room, fsync_dir
from nsqtw.storage.executor import ThreadPoolDiskExecutor

__all__ = [
    "MAGIC",
    "SUFFIX",
    "Journal",
    "JournalError",
    "JournalState",
    "find_journals",
    "journal_path",
    "replay",
]

MAGIC = b"NSQTWJ1\n"
SUFFIX = ".nsqtw.journal"
#: a journal smaller than this is never compacted
COMPACT_MIN_BYTES = 4 << 20
#: past this many bytes of records not yet fsynced, the journal is behind: its channel takes no
#: more messages for delivery and its topic hands off nothing more until it catches up
PENDING_LIMIT_BYTES = 8 << 20

REC_MESSAGE = ord("M")
REC_STATE = ord("A")
REC_FIN = ord("F")
REC_TAKEN = ord("T")
REC_HANDOFF = ord("H")
REC_CLEAR = ord("C")
REC_DUE = ord("D")

_HEAD = struct.Struct(">IB")  # length of type + payload, type
_CRC = struct.Struct(">I")
_MSG = struct.Struct(">16sqHq")  # id, timestamp ns, attempts, due ms
_STATE = struct.Struct(">16sHq")  # id, attempts, due ms
_POS = struct.Struct(">qq")  # file number, position
_DUE = struct.Struct(">16sq")  # id, due ms
_TYPES = {t: bytes((t,)) for t in (REC_MESSAGE, REC_STATE, REC_FIN, REC_TAKEN, REC_HANDOFF, REC_CLEAR,
                                   REC_DUE)}
_CRC_SEED = {t: zlib.crc32(b) for t, b in _TYPES.items()}


class JournalError(Exception):
    """A journal file nsqtw cannot use (not a journal at all)."""


def journal_path(data_path: str, name: str) -> str:
    return os.path.join(data_path, name + SUFFIX)


def find_journals(data_path: str) -> list[str]:
    """Disk thread: the backend names (``topic:channel``) that have a journal file."""
    try:
        names = os.listdir(data_path)
    except FileNotFoundError:
        return []
    return sorted(n[: -len(SUFFIX)] for n in names if n.endswith(SUFFIX))


# -- records -------------------------------------------------------------------


def _record(rtype: int, payload: bytes) -> bytes:
    crc = zlib.crc32(payload, _CRC_SEED[rtype])
    return _HEAD.pack(len(payload) + 1, rtype) + payload + _CRC.pack(crc)


def _due_ms(due: float) -> int:
    return int(due * 1000) if due > 0 else 0


def message_record(msg: Message, attempts: int, due: float) -> bytes:
    payload = _MSG.pack(msg.id, msg.timestamp, min(attempts, 0xFFFF), _due_ms(due)) + msg.body
    return _record(REC_MESSAGE, payload)


def state_record(msg_id: bytes, attempts: int, due: float) -> bytes:
    return _record(REC_STATE, _STATE.pack(msg_id, min(attempts, 0xFFFF), _due_ms(due)))


def fin_record(msg_id: bytes) -> bytes:
    return _record(REC_FIN, msg_id)


def position_record(rtype: int, pos: Position) -> bytes:
    return _record(rtype, _POS.pack(*pos))


def due_record(msg_id: bytes, due: float) -> bytes:
    return _record(REC_DUE, _DUE.pack(msg_id, _due_ms(due)))


CLEAR_RECORD = _record(REC_CLEAR, b"")

#: what compaction keeps: (id, timestamp, attempts, due, body) per live message, the due times,
#: the taken and handed-off positions
_Snapshot = tuple[list[tuple[bytes, int, int, float, bytes]], list[tuple[bytes, float]],
                  "Position | None", "Position | None"]


def build_snapshot(snap: _Snapshot) -> bytes:
    """Disk lane: a whole journal file holding only ``snap`` (compaction)."""
    items, dues, taken, handoff = snap
    parts = [MAGIC]
    for msg_id, ts, attempts, due, body in items:
        payload = _MSG.pack(msg_id, ts, min(attempts, 0xFFFF), _due_ms(due)) + body
        parts.append(_record(REC_MESSAGE, payload))
    parts.extend(due_record(i, t) for i, t in dues)
    if taken is not None:
        parts.append(position_record(REC_TAKEN, taken))
    if handoff is not None:
        parts.append(position_record(REC_HANDOFF, handoff))
    return b"".join(parts)
_DUE_RECORD_SIZE = len(due_record(b"0" * 16, 0.0))


# -- replay (disk thread) --------------------------------------------------------


@dataclass
class JournalState:
    """What a journal file says: the unfinished messages and the two read positions."""

    #: id -> [timestamp ns, attempts, due (unix ms, 0 = ready), body], in journal order
    messages: dict[bytes, list[Any]] = field(default_factory=dict)
    taken: Position | None = None
    handoff: Position | None = None
    #: topic journals: id -> due (unix ms) of DPUB messages in the topic's queue
    dues: dict[bytes, int] = field(default_factory=dict)
    #: bytes of valid records (the file's size after the torn tail is cut)
    size: int = 0
    #: bytes cut off the end because they did not form whole, valid records
    torn: int = 0


def replay(path: str) -> JournalState:
    """Disk thread: read a journal, cut a torn tail off the file, return its state."""
    state = JournalState()
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return state
    n = len(data)
    if not data.startswith(MAGIC):
        if MAGIC.startswith(data):  # the header itself was torn: nothing was ever recorded
            state.torn = n
            _truncate(path, 0)
            return state
        raise JournalError(f"{path} is not an nsqtw journal (bad header {data[:8]!r})")
    msgs = state.messages
    off = len(MAGIC)
    while n - off >= _HEAD.size + _CRC.size:
        length, rtype = _HEAD.unpack_from(data, off)
        body_end = off + 4 + length
        if length < 1 or body_end + 4 > n:
            break
        (crc,) = _CRC.unpack_from(data, body_end)
        if crc != zlib.crc32(data[off + 4:body_end]):
            break
        p = off + 5
        if rtype == REC_MESSAGE and length - 1 >= _MSG.size:
            msg_id, ts, attempts, due = _MSG.unpack_from(data, p)
            msgs.pop(msg_id, None)  # keep journal order for a message taken again
            msgs[msg_id] = [ts, attempts, due, data[p + _MSG.size:body_end]]
        elif rtype == REC_STATE and length - 1 == _STATE.size:
            msg_id, attempts, due = _STATE.unpack_from(data, p)
            entry = msgs.get(msg_id)
            if entry is not None:
                entry[1] = attempts
                entry[2] = due
        elif rtype == REC_FIN and length - 1 == 16:
            msgs.pop(data[p:body_end], None)
        elif rtype == REC_DUE and length - 1 == _DUE.size:
            msg_id, due = _DUE.unpack_from(data, p)
            state.dues[msg_id] = due
        elif rtype in (REC_TAKEN, REC_HANDOFF) and length - 1 == _POS.size:
            pos = _POS.unpack_from(data, p)
            if rtype == REC_TAKEN:
                state.taken = max(state.taken or pos, pos)
            else:
                state.handoff = max(state.handoff or pos, pos)
        elif rtype == REC_CLEAR and length == 1:
            msgs.clear()
        else:
            break  # a record this version does not know: treat like damage
        off = body_end + 4
    state.size = off
    state.torn = n - off
    if state.torn:
        _truncate(path, off)
    return state


def _truncate(path: str, size: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, offset)
        view = view[done:]
        offset += done


class _JournalFile:
    """The file; every method runs on the journal's own thread."""

    def __init__(self, path: str, fsync_fn: Callable[[int], None], keep_free: int = 0) -> None:
        self.path = path
        self.dir = os.path.dirname(path) or "."
        self.fsync_fn = fsync_fn
        #: appends leave this many bytes free (a compaction, which gives space back, may use them)
        self.keep_free = keep_free
        self.fd: int | None = None
        self.size = 0

    def _open(self) -> int:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        size = os.lseek(fd, 0, os.SEEK_END)
        try:
            if size == 0:
                _write_all(fd, MAGIC, 0)
                self.fsync_fn(fd)
                fsync_dir(self.dir)
                size = len(MAGIC)
        except OSError:
            os.close(fd)
            raise
        self.fd, self.size = fd, size
        return fd

    def append(self, data: bytes) -> int:
        """Write and fsync; a failed write is cut back off so no half record stays."""
        if self.keep_free:
            check_room(self.dir, len(data), self.keep_free, "the queues' metadata")
        fd = self.fd if self.fd is not None else self._open()
        start = self.size
        try:
            _write_all(fd, data, start)
            self.fsync_fn(fd)
        except OSError:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass
            self.close()
            raise
        self.size = start + len(data)
        return self.size

    def rewrite(self, data: bytes) -> int:
        """Replace the file with ``data`` (a snapshot): temp file, fsync, rename."""
        atomic_write(self.path, data, fsync=self.fsync_fn)
        self.close()
        self.size = len(data)
        return self.size

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def remove(self) -> None:
        self.close()
        try:
            os.remove(self.path)
        except FileNotFoundError:
            return
        fsync_dir(self.dir)


# -- the reactor side --------------------------------------------------------------


class Journal:
    """One durable channel's journal, driven from the reactor thread.

    Recording is a plain append to a pending list; one write (with its
    fsync) runs at a time on the journal's own thread and takes everything
    pending.  ``on_synced``/``synced`` wait for the records appended so far.
    """

    log = Logger()

    def __init__(self, name: str, data_path: str, clock: IReactorTime,
                 executor: IDiskExecutor | None = None, state: JournalState | None = None, *,
                 compact_min_bytes: int = COMPACT_MIN_BYTES, retry_interval: float = 1.0,
                 fsync_fn: Callable[[int], None] = os.fsync, keep_free: int = 0) -> None:
        self.name = name
        self.path = journal_path(data_path, name)
        self._clock = clock
        if executor is None:
            executor = ThreadPoolDiskExecutor(clock, name=f"journal-{name}")  # type: ignore[arg-type]
        self._executor = executor
        self._file = _JournalFile(self.path, fsync_fn, keep_free)
        self._compact_min = compact_min_bytes
        self._retry_interval = retry_interval
        state = state or JournalState()
        #: what replay found, for the channel to take back (then cleared)
        self.recovered = state.messages
        #: positions below which the queues' records were already taken over before a restart
        self.taken_floor: Position | None = state.taken
        self.handoff_floor: Position | None = state.handoff
        self._taken = state.taken
        self._handoff = state.handoff
        self._live: dict[bytes, int] = {}
        for msg_id, entry in state.messages.items():
            self._live[msg_id] = len(entry[3]) + _MSG.size + 9
        #: topic journals: due times (unix seconds) of DPUB messages in the queue
        self.dues: dict[bytes, float] = {i: ms / 1000.0 for i, ms in state.dues.items()}
        self._live_bytes = sum(self._live.values()) + _DUE_RECORD_SIZE * len(self.dues)
        self._file_bytes = state.size
        #: the channel's live messages with their due times, for compaction
        self.snapshot: Callable[[], Iterable[tuple[Message, float]]] | None = None

        self._pending: list[bytes] = []
        #: bytes in ``_pending`` plus the write under way (what an fsync that never
        #: succeeds would otherwise let grow without bound)
        self._pending_bytes = 0
        self._writing_bytes = 0
        self._seq = 0
        self._synced_seq = 0
        self._waiters: deque[tuple[int, Callable[[], object]]] = deque()
        self._flushing = False
        self._flush_call: IDelayedCall | None = None
        self._retry_call: IDelayedCall | None = None
        self._idle: list[Deferred[None]] = []
        self._closed = False
        self.error: str | None = None
        self._health_listener: Callable[[object, str | None], None] | None = None
        self.compactions = 0

    def __repr__(self) -> str:
        return f"<Journal {self.name}>"

    # -- recording -----------------------------------------------------------

    def _append(self, data: bytes) -> None:
        if self._closed:
            return
        self._pending.append(data)
        self._pending_bytes += len(data)
        self._seq += 1
        self._file_bytes += len(data)
        if self._flush_call is None and not self._flushing and self._retry_call is None:
            self._flush_call = self._clock.callLater(0, self._flush)

    def behind(self) -> bool:
        """Whether unsynced records passed :data:`PENDING_LIMIT_BYTES` (writers must wait)."""
        return self._pending_bytes + self._writing_bytes > PENDING_LIMIT_BYTES

    def unsynced(self) -> int:
        """Records appended and not yet fsynced (what a stop could not flush)."""
        return self._seq - self._synced_seq

    def is_live(self, msg_id: bytes) -> bool:
        return msg_id in self._live

    def delivering(self, msgs: list[Message]) -> None:
        """These are about to be sent (their attempts go up by one)."""
        live = self._live
        recs = []
        for m in msgs:
            if m.id in live:
                recs.append(state_record(m.id, m.attempts + 1, 0.0))
            else:
                rec = message_record(m, m.attempts + 1, 0.0)
                live[m.id] = len(rec)
                self._live_bytes += len(rec)
                recs.append(rec)
        self._append(b"".join(recs))

    def deferred(self, msg: Message, due: float) -> None:
        """The message waits until ``due`` (unix seconds): DPUB or REQ with a delay."""
        if msg.id in self._live:
            self._append(state_record(msg.id, msg.attempts, due))
        else:
            rec = message_record(msg, msg.attempts, due)
            self._live[msg.id] = len(rec)
            self._live_bytes += len(rec)
            self._append(rec)

    def finished(self, msg_id: bytes) -> None:
        self.finished_many([msg_id])

    def finished_many(self, msg_ids: list[bytes]) -> None:
        if not msg_ids:
            return
        live = self._live
        for msg_id in msg_ids:
            self._live_bytes -= live.pop(msg_id, 0)
        self._append(b"".join(fin_record(i) for i in msg_ids))
        if self._retry_call is not None and self._should_compact():
            # writes fail (a full disk) and these FINs made a compaction worth trying: now,
            # not at the next retry, so a consumer draining a full disk is not paced by it
            self._retry_call.reset(0)

    def taken(self, pos: Position) -> None:
        """The channel's queue was read up to ``pos``; the records before it are journaled."""
        self._taken = max(self._taken or pos, pos)
        self._append(position_record(REC_TAKEN, pos))

    def handed_off(self, pos: Position) -> None:
        """The topic's records up to ``pos`` are safe in this channel."""
        self._handoff = max(self._handoff or pos, pos)
        self._append(position_record(REC_HANDOFF, pos))

    def due(self, msg_id: bytes, when: float) -> None:
        """Topic journal: the DPUB message ``msg_id`` is due at ``when``."""
        self.dues[msg_id] = when
        self._live_bytes += _DUE_RECORD_SIZE
        self._append(due_record(msg_id, when))

    def drop_dues(self, ids: Iterable[bytes]) -> None:
        """Topic journal: these went to every channel; their due times are theirs now.

        Nothing is written: the next compaction leaves them out.
        """
        dues = self.dues
        for msg_id in ids:
            if dues.pop(msg_id, None) is not None:
                self._live_bytes -= _DUE_RECORD_SIZE

    def cleared(self) -> None:
        self._live.clear()
        self._live_bytes = 0
        self._append(CLEAR_RECORD)

    def on_synced(self, fn: Callable[[], object]) -> None:
        """Call ``fn`` once everything recorded so far is fsynced (now, if it is)."""
        if self._synced_seq >= self._seq:
            fn()
        else:
            self._waiters.append((self._seq, fn))

    def synced(self) -> Deferred[None]:
        if self._synced_seq >= self._seq or self._closed:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._waiters.append((self._seq, lambda: d.callback(None)))
        return d

    def health(self) -> str | None:
        return self.error

    # -- writing -------------------------------------------------------------

    def _should_compact(self) -> bool:
        """Past :data:`COMPACT_MIN_BYTES` and twice what the live messages need; after a failed
        write at any size: on a full disk the space its finished records take is the space
        the next write needs (two channels' journals of 4 MiB each filled an 8 MiB disk)."""
        size = self._file_bytes
        return (size >= self._compact_min or self.error is not None) and size > 2 * self._live_bytes

    def _take_snapshot(self) -> _Snapshot:
        """The live state, taken on the reactor without encoding anything (cheap: a tuple per
        message); :func:`build_snapshot` turns it into the file's bytes on the disk lane."""
        items = [(m.id, m.timestamp, m.attempts, due, m.body)
                 for m, due in (self.snapshot() if self.snapshot is not None else ())]
        overhead = _HEAD.size + _MSG.size + _CRC.size
        live = {i[0]: overhead + len(i[4]) for i in items}
        if self.dues:
            now = self._clock.seconds()
            # a due time already past changes nothing: the message goes out at once anyway
            self.dues = {i: t for i, t in self.dues.items() if t > now}
        self._live = live
        self._live_bytes = sum(live.values()) + _DUE_RECORD_SIZE * len(self.dues)
        return items, list(self.dues.items()), self._taken, self._handoff

    def _rewrite(self, snap: _Snapshot) -> int:
        """Disk lane: encode the snapshot and replace the file with it."""
        return self._file.rewrite(build_snapshot(snap))

    def _flush(self) -> None:
        self._flush_call = None
        self._retry_call = None
        if self._flushing or self._closed or not self._pending:
            return
        target = self._seq
        batch, self._pending = self._pending, []
        self._writing_bytes, self._pending_bytes = self._pending_bytes, 0
        compact = self._should_compact()
        if compact:
            d = self._executor.submit(self._rewrite, self._take_snapshot())
        else:
            d = self._executor.submit(self._file.append, b"".join(batch))
        self._flushing = True
        d.addCallbacks(self._flush_done, self._flush_failed,
                       callbackArgs=(target, compact), errbackArgs=(batch,))
        d.addErrback(lambda f: self.log.failure("JOURNAL({name}): write callback failed", f, name=self.name))

    def _flush_done(self, size: int, target: int, compact: bool) -> None:
        self._flushing = False
        self._writing_bytes = 0
        if compact:
            self.compactions += 1
            self._file_bytes = size + sum(len(p) for p in self._pending)
            self.log.info("JOURNAL({name}): compacted to {size} bytes ({count} unfinished messages)",
                          name=self.name, size=size, count=len(self._live))
        if self.error is not None:
            self.log.info("JOURNAL({name}): writes work again", name=self.name)
            self._health_changed(None)
        self._synced_seq = target
        self._release(target)
        self._went_idle()
        if self._pending and not self._closed:
            self._flush()  # group commit: whatever arrived meanwhile goes now

    def _flush_failed(self, failure: Failure, batch: list[bytes]) -> None:
        self._flushing = False
        self._pending[:0] = batch
        self._pending_bytes += self._writing_bytes
        self._writing_bytes = 0
        error = f"JOURNAL({self.name}) failed to write: {failure.getErrorMessage()}"
        if error != self.error:
            self.log.error("{error}", error=error)
        self._health_changed(error)
        self._went_idle()
        if not self._closed:
            self._retry_call = self._clock.callLater(self._retry_interval, self._flush)

    def _release(self, upto: int) -> None:
        waiters = self._waiters
        while waiters and waiters[0][0] <= upto:
            _, fn = waiters.popleft()
            try:
                fn()
            except Exception:
                self.log.failure("JOURNAL({name}): callback failed", name=self.name)

    def _went_idle(self) -> None:
        idle, self._idle = self._idle, []
        for d in idle:
            d.callback(None)

    # -- closing -------------------------------------------------------------

    def close(self) -> Deferred[None]:
        """Write and fsync what is pending, then close the file (it stays for the next start)."""
        return ensureDeferred(self._close(remove=False))

    def remove(self) -> Deferred[None]:
        """Drop the journal and its file (the channel was deleted, or converted at a graceful stop)."""
        self._health_changed(None)
        return ensureDeferred(self._close(remove=True))

    def watch_health(self, listener: Callable[[object, str | None], None]) -> None:
        """Call ``listener(self, error)`` each time :attr:`error` changes (``None`` once removed)."""
        self._health_listener = listener
        if self.error is not None:
            listener(self, self.error)

    def _health_changed(self, error: str | None) -> None:
        if error != self.error:
            self.error = error
            if self._health_listener is not None:
                self._health_listener(self, error)

    async def _close(self, remove: bool) -> None:
        if self._closed:
            return
        self._closed = True
        for call in (self._flush_call, self._retry_call):
            if call is not None and call.active():
                call.cancel()
        self._flush_call = self._retry_call = None
        try:
            while self._flushing:
                d: Deferred[None] = Deferred()
                self._idle.append(d)
                await d
            if remove:
                self._pending = []
                await self._executor.submit(self._file.remove)
            else:
                if self._pending:
                    data, self._pending = b"".join(self._pending), []
                    await self._executor.submit(self._file.append, data)
                await self._executor.submit(self._file.close)
            self._synced_seq = self._seq
            self._release(self._seq)
        finally:
            self._waiters.clear()
            self._executor.stop()

