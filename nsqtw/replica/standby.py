"""The replica's side: the copies it holds for each owner's topic, and the takeover.

A :class:`Standby` holds one owner's one topic. The messages themselves go
to a log on this node's disk (:class:`~nsqtw.replica.disklog.StandbyLog`), written as the ``PUB``
record carried them; memory keeps per message only its ID value (8 bytes),
body size (4) and a byte per channel of the owner saying it finished there,
in arrival order. A message is done once every channel that owes it
finished it; a channel owes the messages that arrived after it was made
(and, when the owner said its topic had a backlog then, those before too).
The finished prefix is cut from memory, and a log segment whose messages
are all done is deleted: a standby holds what its owner has not finished.

At the takeover the log is read back, a segment at a time on the disk
lane, and each message still owed is handed, with its ID, timestamp and
body, into every local channel of that name that owes it (to the local
topic when the owner had no channel), a slice per reactor turn.
"""

from __future__ import annotations

import json
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Generator
from itertools import compress
from typing import Any, Final

from twisted.internet.defer import Deferred, DeferredList
from twisted.python.failure import Failure

from nsqtw.core.message import Message
from nsqtw.log import Logger
from nsqtw.replica.disklog import StandbyLog
from nsqtw.replica.journal import (
    JOURNAL_MIN,
    Entry,
    LogFiles,
    decode_checkpoint,
    encode_checkpoint,
    encode_entry,
    encode_json_entry,
    parse_entries,
)
from nsqtw.replica.records import MESSAGE_HEADER, read_messages
from nsqtw.replica.runs import id_values, run_length

__all__ = ["TAKEOVER_SLICE", "Handed", "Standby", "still_due", "unheld"]

#: messages handed in per reactor turn at a takeover
TAKEOVER_SLICE: Final = 4096
#: the finished prefix is cut from memory once it is this long and a quarter of what is held
_CUT_MIN: Final = 4096


#: a message a takeover handed in: the channels it went to (none: the topic), its new ID value, its
#: timestamp, body and DPUB delay in milliseconds (from the timestamp, as the owner's PUB record has it)
Handed = tuple[tuple[str, ...], int, int, bytes, int]


def still_due(timestamp: int, delay_ms: int, now: float) -> float:
    """Seconds a DPUB message published at ``timestamp`` (ns) with ``delay_ms`` still waits at ``now``:
    what is left of its delay (none once it is due; never more than the whole delay, whatever the
    skew between the owner's clock and this node's)."""
    if delay_ms <= 0:
        return 0.0
    delay = delay_ms / 1000
    return min(delay, max(0.0, timestamp / 1e9 + delay - now))


def _or(a: bytes | bytearray, b: bytes | bytearray, xor: bool = False) -> bytes:
    """Two equally long runs of 0/1 flags OR-ed (or XOR-ed) byte by byte, as big integers."""
    x, y = int.from_bytes(a, "little"), int.from_bytes(b, "little")
    return (x ^ y if xor else x | y).to_bytes(len(a), "little")


def unheld(standbys: list[Standby], values: list[int], owing: list[str]) -> list[int]:
    """:meth:`Standby.confirm` across one topic's standbys: the values none of them holds."""
    for standby in standbys:
        values = standby.confirm(values, owing)
    return values


class _Debt:
    """One of the owner's channels: from which arrival on it owes messages, and, per message
    held (parallel to the standby's arrays), whether it finished it."""

    __slots__ = ("start", "finished")

    def __init__(self, start: int, held: int) -> None:
        self.start = start
        self.finished = bytearray(held)


class Standby:
    """One owner's topic: what this node holds of it until the owner finishes it or is lost."""

    log = Logger()

    def __init__(self, owner: str, topic: str, log: StandbyLog) -> None:
        self.owner = owner
        self.topic = topic
        self.disk = log
        #: per message held, in arrival order from arrival number ``base``: ID value, body size, done
        self.values = array("Q")
        self.sizes = array("I")
        self.done = bytearray()
        self.base = 0
        self.channels: dict[str, _Debt] = {}
        #: messages held that are not done, and their body bytes
        self.live = 0
        self.live_bytes = 0
        self.taken_over = False
        #: while the owner's SNAPs after a new link come in: per message held before it
        #: (arrivals below ``mark``), whether a SNAP named it (:meth:`begin_sync`)
        self.confirmed: bytearray | None = None
        self.mark = 0

    @property
    def arrivals(self) -> int:
        """Arrival number the next message gets."""
        return self.base + len(self.values)

    def add(self, data: bytes, values: list[int], sizes: list[int]) -> None:
        """Messages of a PUB record (``data``: as the record holds them): held from now, on disk
        once ``disk.written()`` fires."""
        self.disk.append(data, self.arrivals)
        self._hold(values, sizes)

    def _hold(self, values: Any, sizes: Any) -> None:
        n = len(values)
        self.values.extend(values)
        self.sizes.extend(sizes)
        zeros = bytes(n)
        self.done.extend(zeros)
        for d in self.channels.values():
            d.finished.extend(zeros)
        self.live += n
        self.live_bytes += sum(sizes)

    def add_snapshot(self, data: bytes, values: list[int], sizes: list[int], owing: list[str]) -> None:
        """Messages a ``SNAP`` record carried: held from now, owed by exactly the channels ``owing``."""
        self.disk.note(encode_json_entry(Entry.OWING, self.arrivals, {"n": len(values), "owing": owing}))
        self.disk.append(data, self.arrivals)
        self._hold_owed(values, sizes, owing)

    def _hold_owed(self, values: Any, sizes: Any, owing: list[str]) -> None:
        first = len(self.values)
        self._hold(values, sizes)
        n = len(self.values) - first
        for name in owing:
            if name not in self.channels:
                self.channels[name] = _Debt(self.base + first, len(self.values))
        for name, d in self.channels.items():
            if name not in owing:
                d.finished[first:] = b"\x01" * n
        self._recount(first)

    def holds(self, value: int) -> bool:
        """Whether the message of ID value ``value`` is held and not done."""
        values = self.values
        i = bisect_left(values, value)
        return i < len(values) and values[i] == value and not self.done[i]

    def arrival_of(self, value: int) -> int | None:
        """The arrival number of the message of ID value ``value`` held here (done or not), or None."""
        values = self.values
        i = bisect_left(values, value)
        return self.base + i if i < len(values) and values[i] == value else None

    def live_id_runs(self, until: int, most: int) -> Generator[tuple[list[str], list[int]], None, None]:
        """The ID values of the messages not done that arrived before ``until``, as runs of (the
        channels owing them, at most ``most`` values), in order: a ``SNAP``'s runs without bodies.
        Lazily, by arrival number (the caller waits between runs, while :meth:`maintain` may cut)."""
        arrival = self.base
        owing_now: list[str] | None = None
        run: list[int] = []
        while arrival < min(until, self.arrivals):
            arrival = max(arrival, self.base)
            i = arrival - self.base
            if i < len(self.done) and self.done[i]:  # a stretch of done ones: skipped in C
                k = self.done.find(0, i)
                arrival = self.base + (len(self.done) if k < 0 else k)
                continue
            arrival += 1
            if i >= len(self.values):
                continue
            owing = self._owing(i) if self.channels else []
            value = self.values[i]  # (read before a yield: the arrays may be cut meanwhile)
            if run and (owing != owing_now or len(run) >= most):
                yield owing_now or [], run
                run = []
            owing_now = owing
            run.append(value)
        if run:
            yield owing_now or [], run

    def live_runs(self, data: bytes, pos: int, arrival: int, until: int, most: int
                  ) -> tuple[list[tuple[list[str], bytes]], int, int, bool]:
        """Of a log segment's bytes, from offset ``pos`` (the message of arrival number ``arrival``):
        the messages not done that arrived before ``until``, as runs of (the channels owing them,
        their bytes), in order, looking at no more than ``most`` messages. Also where it stopped
        (offset, arrival) and whether any is left: the walk is Python a message, so the caller
        takes a segment (tens of thousands) in slices, letting the reactor serve between them."""
        runs: list[tuple[list[str], bytes]] = []
        owing_now: list[str] | None = None
        start = end = pos
        size = len(data)
        stop = min(until, arrival + most)
        while pos + MESSAGE_HEADER <= size and arrival < stop:
            body = int.from_bytes(data[pos + MESSAGE_HEADER - 4:pos + MESSAGE_HEADER], "big")
            nxt = pos + MESSAGE_HEADER + body
            if nxt > size:
                pos = size  # a message cut short (a log being written): the end of the segment
                break
            i = arrival - self.base
            arrival += 1
            live = 0 <= i < len(self.values) and not self.done[i]
            owing = self._owing(i) if live and self.channels else []
            if live and owing_now is not None and owing == owing_now and start <= end == pos:
                end = nxt
            else:
                if owing_now is not None and end > start:
                    runs.append((owing_now, data[start:end]))
                owing_now, start, end = (owing, pos, nxt) if live else (None, nxt, nxt)
            pos = nxt
        if owing_now is not None and end > start:
            runs.append((owing_now, data[start:end]))
        return runs, pos, arrival, pos + MESSAGE_HEADER <= size and arrival < until

    def channel(self, name: str, backlog: bool) -> None:
        if name not in self.channels:
            self.disk.note(encode_json_entry(Entry.CHANNEL, self.arrivals, {"name": name, "backlog": backlog}))
            self.channels[name] = _Debt(self.base if backlog else self.arrivals, len(self.values))

    def channel_gone(self, name: str) -> None:
        if self.channels.pop(name, None) is not None:
            self.disk.note(encode_json_entry(Entry.CHANNEL_GONE, self.arrivals, {"name": name}))
            self._recount()

    def empty(self, channel: str | None) -> None:
        """The owner emptied a channel: every message so far is done there. (A topic's empty
        drops only what no channel was given yet, which the standby cannot tell: kept.)"""
        debt = None if channel is None else self.channels.get(channel)
        if debt is not None:
            self.disk.note(encode_json_entry(Entry.EMPTY, self.arrivals, {"name": channel}))
            debt.start = self.arrivals
            debt.finished = bytearray(len(self.values))
            self._recount()

    def finish(self, channel: str, ids: list[bytes]) -> None:
        """The owner's channel finished these IDs: each held message that no other channel still
        owes is done.

        This runs per message consumed, on the owner (its own log) and on the replica, so the IDs
        are read at once (:mod:`nsqtw.replica.runs`), each is looked for just after the one before
        (a reader FINs in the order it was sent, and the arrays are in ID order) before it is
        searched for, and a run of the next messages, of the only channel, is marked at once."""
        raw = b"".join(ids)
        self._note_fin(channel, raw)
        channels = self.channels
        debt = channels.get(channel)
        if debt is None:  # its CHANNEL record went with a link that failed: it owes everything
            debt = channels[channel] = _Debt(self.base, len(self.values))
        alone = len(channels) == 1
        values, done, finished = self.values, self.done, debt.finished
        found = id_values(ids, raw)
        held, n = len(values), len(found)
        i, k = -1, 0
        while k < n:
            value = found[k]
            i += 1
            if i >= held or values[i] != value:  # not the one after the last: searched for
                i = bisect_left(values, value)
                if i >= held or values[i] != value:
                    k += 1
                    continue
            if alone and k + 1 < n and i + 1 < held and values[i + 1] == found[k + 1]:
                # the usual run, the next messages in order: marked at once up to one done already
                m = run_length(values, i, found, k)
                end = done.find(1, i, i + m)
                end = i + m if end < 0 else end
                if end > i:
                    ones = b"\x01" * (end - i)
                    finished[i:end] = ones
                    self._done_where(i, ones)
                    k += end - i
                    i = end - 1
                    continue
            k += 1
            if not done[i]:
                finished[i] = 1
                if not self._owed(i):
                    self._mark_done(i)

    def _note_fin(self, channel: str, ids: bytes) -> None:
        """The journal's FIN entry (what :meth:`restore` reads back into :meth:`finish`): the IDs back to back."""
        name = channel.encode()
        self.disk.note(encode_entry(Entry.FIN, self.arrivals, len(name).to_bytes(2, "big") + name + ids),
                       structural=False)

    # -- after a link's break: what the owner still holds ------------------------------------------

    def begin_sync(self) -> None:
        """The owner linked here again: FINs sent while it had no link here never came, so every
        message held so far is unconfirmed until its ``SNAP``s (of every message it has not
        finished) name it (:meth:`confirm`); its ``SYNCED`` then lets go of the others (:meth:`synced`)."""
        self.mark = self.arrivals
        self.confirmed = bytearray(len(self.values))

    def confirm(self, values: list[int], owing: list[str]) -> list[int]:
        """The owner's ``SNAP`` or ``SNAP_IDS`` names these messages: each held here (and not done)
        is owed by exactly ``owing`` from now (channels that finished it meanwhile are told, one
        journal entry each). Returns those not held here.

        A record names up to 16,384 (``SNAP_IDS_MAX``), handled in one reactor turn: one pass
        over them: the held IDs of the span they cover are looked up in a dict built at C speed
        (a search and a call per ID took 1.8 µs each, 120 ms a record of 65,536), or searched
        for one by one where that span is mostly IDs the owner no longer names.
        """
        held = self.values
        if not values or not held:
            return list(values)
        lo, hi = bisect_left(held, min(values)), bisect_right(held, max(values))
        where = dict(zip(held[lo:hi], range(lo, hi), strict=True)) if hi - lo <= 4 * len(values) else None
        done, confirmed, owed = self.done, self.confirmed, self._owed
        others = [(name, d.finished) for name, d in self.channels.items() if name not in owing]
        fins: dict[str, list[bytes]] = {}
        lacking: list[int] = []
        for value in values:
            if where is not None:
                i = where.get(value, -1)
            else:
                i = bisect_left(held, value)
                i = i if i < len(held) and held[i] == value else -1
            if i < 0 or done[i]:
                lacking.append(value)
                continue
            if confirmed is not None and i < len(confirmed):
                confirmed[i] = 1
            for name, finished in others:
                if not finished[i]:
                    finished[i] = 1
                    fins.setdefault(name, []).append(b"%016x" % value)
            if not owed(i):
                self._mark_done(i)
        for name, ids in fins.items():
            self._note_fin(name, b"".join(ids))
        return lacking

    def synced(self, complete: bool) -> int:
        """The owner's SNAPs are all in: a message held before its link came up that none of them
        named is finished there (its FIN went while the link was down), unless the owner's own log
        is not ``complete`` (then nothing is let go). Returns how many were let go."""
        confirmed, self.confirmed = self.confirmed, None
        if confirmed is None or not complete:
            return 0
        # one flag a byte for millions of messages: the let-go set (neither done nor confirmed) is
        # made with big-int ORs in C, not a loop in Python that would hold the reactor for a second
        n = max(0, min(self.mark - self.base, len(confirmed)))
        go = _or(_or(self.done[:n], confirmed[:n]), b"\x01" * n, xor=True)
        if gone := self._done_where(0, go):
            for d in self.channels.values():
                d.finished[:n] = _or(d.finished[:n], go)
            self.disk.rewrite(self.checkpoint())  # (a replay must not hold them again)
        return gone

    def _owed(self, i: int) -> bool:
        """Whether some channel still owes message ``i`` (a loop, not ``any()`` over a generator:
        :meth:`confirm` asks it of every ID a record names)."""
        channels = self.channels
        if not channels:
            return True  # no channel yet: the first one made will owe it
        arrival = self.base + i
        for d in channels.values():
            if d.start <= arrival and not d.finished[i]:
                return True
        return False

    def _owing(self, i: int) -> list[str]:
        arrival = self.base + i
        return [name for name, d in self.channels.items() if d.start <= arrival and not d.finished[i]]

    def _mark_done(self, i: int) -> None:
        self.done[i] = 1
        self.live -= 1
        self.live_bytes -= self.sizes[i]

    def _recount(self, lo: int = 0) -> None:
        """Every message from index ``lo`` on that no channel owes (any more) is done: after a
        channel went or was emptied, or a ``SNAP``'s messages came owed by some channels only.
        A check per message held the reactor for seconds with millions held, and 0.1 s for a
        SNAP of a 16 MiB segment; the flags (a byte each) are combined as big integers instead."""
        n = len(self.values) - lo
        if not self.channels or n <= 0:
            return  # (no channel yet: the first one made will owe them all)
        ones = b"\x01" * n
        kept = bytes(self.done[lo:])  # done, or owed by some channel: stays as it is
        for d in self.channels.values():
            owes = bytearray(_or(d.finished[lo:], ones, xor=True))
            k = min(n, max(0, d.start - self.base - lo))
            owes[:k] = bytes(k)  # (arrived before the channel was made: never owed by it)
            kept = _or(kept, owes)
        self._done_where(lo, _or(kept, ones, xor=True))

    def _done_where(self, lo: int, mask: bytes) -> int:
        """:meth:`_mark_done` for each message from index ``lo`` whose flag in ``mask`` is 1 (none
        done yet), all at once; returns how many."""
        if gone := mask.count(1):
            end = lo + len(mask)
            self.done[lo:end] = _or(self.done[lo:end], mask)
            self.live -= gone
            self.live_bytes -= sum(compress(self.sizes[lo:end], mask))
        return gone

    def maintain(self) -> None:
        """Cut the done prefix from memory once it is long enough; delete done log segments; rewrite
        the journal as a checkpoint once it outgrew the state."""
        k = self.done.find(0)
        if k < 0:
            k = len(self.done)
        if k >= _CUT_MIN and 4 * k >= len(self.done):
            del self.values[:k]
            del self.sizes[:k]
            del self.done[:k]
            for d in self.channels.values():
                del d.finished[:k]
            if self.confirmed is not None:
                del self.confirmed[:k]
            self.base += k
            k = 0
        self.disk.drop_before(self.base + k)
        if self.disk.damaged or self.disk.journal_bytes > JOURNAL_MIN + 2 * len(self.values) * (1 + len(self.channels)):
            self.disk.rewrite(self.checkpoint())

    def checkpoint(self) -> bytes:
        """The journal's CHECKPOINT entry of the state now."""
        return encode_entry(Entry.CHECKPOINT, self.arrivals, encode_checkpoint(
            self.base, [(name, d.start, bytes(d.finished)) for name, d in self.channels.items()], bytes(self.done)))

    @classmethod
    def restore(cls, owner: str, topic: str, log: StandbyLog, files: LogFiles) -> Standby:
        """A log as a process left it: its segments' messages replayed beside its journal's entries
        (:mod:`nsqtw.replica.journal`). Then the journal is rewritten as one checkpoint (a torn
        entry at its end would hide those appended after it) and appends go to a new segment."""
        s = cls(owner, topic, log)
        log.recording = False
        entries = parse_entries(files.journal or b"")
        runs = [(first, values, sizes) for _, first, _, values, sizes in files.segments]
        log.adopt([[number, first, size] for number, first, size, _, _ in files.segments])
        pos = 0  # the next message of ``runs`` (run, index) not yet held, counted over every run
        start = runs[0][0] if runs else 0
        # every run's messages, at their arrival numbers from ``start``: a segment whose end was torn by
        # a failed write is followed by one that starts where the arrivals went on, and the messages
        # torn away leave a gap, held as done (its ID value the one before: the array stays sorted)
        flat_values: array[int] = array("Q")
        flat_sizes: array[int] = array("I")
        gaps: list[int] = []
        for first, values, sizes in runs:
            missing = first - (start + len(flat_values))
            if missing > 0:
                gaps.extend(range(len(flat_values), len(flat_values) + missing))
                flat_values.extend([flat_values[-1] if flat_values else 0] * missing)
                flat_sizes.extend([0] * missing)
            elif missing < 0:
                values, sizes = values[-missing:], sizes[-missing:]
            flat_values.extend(values)
            flat_sizes.extend(sizes)
        s.base = start
        cp = next((e for e in entries if e[0] == Entry.CHECKPOINT), None)
        if cp is not None:
            cp_base, channels, done = decode_checkpoint(cp[2])
            held_to = cp[1]
            if not runs:
                s.base = start = held_to
            skip = max(0, cp_base - start)  # messages before the checkpoint's base: done and cut
            s.base = start + skip
            pos = skip
            upto = min(len(flat_values), held_to - start) if held_to >= start else pos
            for name, begin, _ in channels:
                s.channels[name] = _Debt(begin, 0)
            if upto > pos:
                s._hold(flat_values[pos:upto], flat_sizes[pos:upto])
                offset = s.base - cp_base  # the checkpoint's bits start at its base
                n = upto - pos
                s.done[:] = done[offset:offset + n].ljust(n, b"\x00")
                for name, _, finished in channels:
                    s.channels[name].finished[:] = finished[offset:offset + n].ljust(n, b"\x00")
                pos = upto
            entries = entries[entries.index(cp) + 1:]

        def hold_to(arrival: int) -> None:
            nonlocal pos
            upto = min(len(flat_values), arrival - start)
            if upto > pos:
                s._hold(flat_values[pos:upto], flat_sizes[pos:upto])
                pos = upto

        def apply(kind: int, at: int, payload: bytes) -> None:
            nonlocal pos
            if kind == Entry.OWING:
                value = json.loads(payload)
                hold_to(at)
                upto = min(len(flat_values), pos + int(value["n"]))
                if upto > pos and at - start == pos:
                    s._hold_owed(flat_values[pos:upto], flat_sizes[pos:upto], [str(c) for c in value["owing"]])
                    pos = upto
                return
            hold_to(at)
            if kind == Entry.CHANNEL:
                value = json.loads(payload)
                s.channel(str(value["name"]), bool(value["backlog"]))
            elif kind == Entry.CHANNEL_GONE:
                s.channel_gone(str(json.loads(payload)["name"]))
            elif kind == Entry.EMPTY:
                name = json.loads(payload)["name"]
                s.empty(None if name is None else str(name))
            elif kind == Entry.FIN:
                n = int.from_bytes(payload[:2], "big")
                name, rest = payload[2:2 + n].decode(), payload[2 + n:]
                s.finish(name, [rest[i:i + 16] for i in range(0, len(rest) - 15, 16)])
            elif kind == Entry.TAKEN:
                s.taken_over = True
            elif kind not in (Entry.META, Entry.CHECKPOINT):
                raise ValueError(f"entry kind {kind}")

        for kind, at, payload in entries:
            try:
                apply(kind, at, payload)
            except (ValueError, KeyError, TypeError) as e:  # (json's and UTF-8's errors are ValueErrors)
                # a torn entry with more appended after it (a write failed before the journal was
                # rewritten): what follows is not trusted; the messages stay held, owed as they were
                cls.log.warn("REPLICATION: {path}: an entry that cannot be read ({error}); the entries after it"
                             " are left out", path=log.journal_path, error=e)
                break
        hold_to(start + len(flat_values))
        for g in gaps:
            i = start + g - s.base
            if 0 <= i < len(s.done):
                s.done[i] = 1
                for d in s.channels.values():
                    d.finished[i] = 1
        for d in s.channels.values():
            d.start = min(d.start, s.arrivals)  # (a torn segment's end: arrivals go on from what is held)
        s.live = s.done.count(0)
        s.live_bytes = sum(size for size, done in zip(s.sizes, s.done, strict=True) if not done)
        log.recording = True
        log.rewrite(s.checkpoint())
        return s

    def __len__(self) -> int:
        return self.live

    # -- the takeover ------------------------------------------------------------------------------

    def take_over(self, nsqd: Any, handed: Callable[[list[Handed]], None] | None = None,
                  noted: Callable[[dict[str, list[bytes]]], None] | None = None) -> Deferred[int]:
        """Hand every message still owed into this node's own topic and channels, reading the log
        a segment at a time; fires with how many messages were handed in. ``handed`` is told what
        each slice handed in (its owing channels, new ID value, timestamp and body), at the end of
        the reactor turn that made the IDs; ``noted``, the owner's IDs it handed in, per channel
        (``""``: into the topic, given no channel yet): what the owner is told if it comes back
        (:mod:`nsqtw.replica.notice`), only what really went in."""
        if not self.taken_over:
            self.disk.note(encode_entry(Entry.TAKEN, self.arrivals))
            self.disk.flush()
        self.taken_over = True
        done: Deferred[int] = Deferred()
        topic = nsqd.get_topic(self.topic)
        state = {"count": 0, "segment": 0}

        def next_segment(_: object = None) -> None:
            if state["segment"] >= len(self.disk.segments) or not self.live:
                # the log goes once what was handed in is written where it went (with
                # --durable-delivery: fsynced), so no crash between finds the copies nowhere
                queues = [topic.backend, *(c.backend for c in topic.channels.values())]
                DeferredList([q.written() for q in queues], consumeErrors=True).addBoth(
                    lambda _: self.disk.remove()).addBoth(lambda _: done.callback(state["count"]))
                return
            d = self.disk.read(state["segment"])
            state["segment"] += 1
            d.addCallback(hand_in).addErrback(failed)

        def hand_in(read: tuple[int, bytes]) -> None:
            first, data = read
            out: list[Handed] = []
            owners: dict[str, list[bytes]] = {}
            steps = self._hand_in(topic, first, data, nsqd.guid.new_value, out, owners, nsqd.clock.seconds())

            def turn() -> None:
                try:
                    try:
                        for _ in range(TAKEOVER_SLICE):
                            state["count"] += next(steps)
                    finally:
                        if out and handed is not None:
                            handed(out[:])
                        out.clear()
                        if owners and noted is not None:
                            noted(dict(owners))
                        owners.clear()
                except StopIteration:
                    next_segment()
                    return
                except Exception:  # noqa: BLE001 - the node closing: what was handed in stays
                    failed(None)
                    return
                nsqd.clock.callLater(0, turn)

            turn()

        def failed(f: Failure | None) -> None:
            self.log.failure("REPLICATION({owner}): takeover of {topic} failed", f,
                             owner=self.owner, topic=self.topic)
            done.errback(RuntimeError("takeover failed"))

        next_segment()
        return done

    def _hand_in(self, topic: Any, first: int, data: bytes, new_id: Callable[[], int],
                 out: list[Handed], owners: dict[str, list[bytes]], now: float) -> Generator[int, None, None]:
        """One segment's messages: each one still owed goes into the channels owing it, a DPUB
        deferred for what is left of its delay at ``now``.

        Each gets a new ID (``new_id``: this node's generator), the same in
        every channel, as a message published here would. The owner's ID
        cannot be kept: IDs are unique per node only, and two nodes with the
        same ``--node-id`` (every node of one host, by default) make the same
        ones, so a kept ID could meet one of this node's own messages in a
        channel, where the copy would be dropped as a duplicate in flight.
        """
        arrival = first
        for value, timestamp, delay_ms, body in read_messages(data):
            i = arrival - self.base
            arrival += 1
            if i < 0 or i >= len(self.values) or self.done[i] or self.values[i] != value:
                yield 0
                continue
            handed = 1
            if self.channels:
                owing = self._owing(i)
                if owing:
                    for name in owing:
                        owners.setdefault(name, []).append(b"%016x" % value)
                    value = new_id()
                    message_data = b"%016x%b" % (value, body)
                    wait = still_due(timestamp, delay_ms, now)
                    for name in owing:
                        if wait:
                            topic.get_channel(name).put_deferred(Message(message_data, timestamp), wait)
                        else:
                            topic.get_channel(name).put_many([Message(message_data, timestamp)])
                    out.append((tuple(owing), value, timestamp, body, delay_ms))
                handed = 1 if owing else 0  # (arrived before every channel that exists: nobody's)
            else:
                owners.setdefault("", []).append(b"%016x" % value)
                value = new_id()
                topic.publish([value], [body], timestamp, still_due(timestamp, delay_ms, now))
                out.append(((), value, timestamp, body, delay_ms))
            self._mark_done(i)
            yield handed
