"""The driver-side NSQ consumer behind the streaming source.

NSQ has no offsets and a message can only be FINed on the connection it came
in on, so the consumer lives in the one long-lived process that Spark keeps
for a stream source on the driver host. It holds every message it receives
until Spark has committed the micro-batch holding it, and only then FINs it;
if the process dies, nsqd gets the unFINed messages back and redelivers them.

A micro-batch can hold as many messages as are in flight, so the consumer
opens several connections to each nsqd when ``max_in_flight`` is more than
one connection's RDY may be (nsqd's ``--max-rdy-count``), and spreads
``max_in_flight`` over them as RDY. Messages are kept in :class:`Block`\\ s
(columns per network read), never as one object each.

An offset (:mod:`nsqtw.spark.offsets`) numbers the messages of batches and
lists, per nsqd, those of the batch that ends at it. A new process cannot
FIN what the old one held, so when Spark shows it an offset from before its
time (a committed batch whose FINs may not have gone out), it FINs those
messages on sight when nsqd redelivers them instead of emitting them again.
The same holds for a batch of this process whose connection was lost after
it was planned: the batch keeps those messages, and what nsqd redelivers of
them once the batch is committed is FINed on sight.

A batch planned by an earlier process and run again after a restart (Spark
replays the last uncommitted batch) is rebuilt from nsqd: the dead process's
messages come back with the same ids, and the replay waits for those its
offset lists (up to ``replay_timeout_ms``). So a committed offset's ids are
always the messages its batch wrote, whichever process ran it, and a later
process may FIN them on sight. Ids the replay did not get back in time are
written into the next offset (``missed``), so that no later process takes
them for committed; they come in a later batch when nsqd delivers them.

Two threads run beside Spark's calls: the I/O thread reads every connection,
answers heartbeats and TOUCHes held messages before ``msg_timeout``; the
discovery thread (re)connects to nsqds, fixed or found through lookupd. Both
are daemon threads: they end with the process.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from nsqtw.core.message import FRAME_TYPE_ERROR
from nsqtw.spark.blocks import IDS_DTYPE, Block, commands, encode_ids
from nsqtw.spark.client import HEARTBEAT, NSQClientError, NSQConnection, rdy
from nsqtw.spark.connections import Connections, max_rdy
from nsqtw.spark.offsets import Offset, ids_of, minus, union
from nsqtw.spark.options import ReaderOptions

log = logging.getLogger("nsqtw.spark")

#: how often the I/O thread wakes to TOUCH and notice new connections
TICK = 0.2
#: a burst of deliveries counts as complete after this much quiet...
QUIET = 0.02
#: ...or this long after the first of its messages was seen
COLLECT = 0.1
#: how long a non-availableNow plan waits for nsqd to refill freed RDY slots
REFILL_WAIT = 0.25
#: the longest a replay defers the newer messages it gives back to make room (seconds): well
#: under nsqd's default --max-req-timeout (1 hour), past which nsqd refuses the REQ
REPLAY_REQ_MAX_DELAY = 60.0
#: how long ids to drop on sight are kept (seconds; they go between one and two of these after
#: they were added): nsqd's default --max-msg-timeout, the longest a message stays in flight, so by
#: then nsqd has given back whatever a dead process held. Ids it had FINed never come back and
#: would otherwise be carried in every offset after it.
SKIP_KEEP = 15 * 60.0


class Consumer(Connections):
    """All connections for one (topic, channel) and the messages held on them.

    The connections, and the discovery thread that keeps them, are
    :class:`~nsqtw.spark.connections.Connections`'.
    """

    def __init__(self, options: ReaderOptions,
                 discover: Callable[[], set[str]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(options, discover, clock)
        self._pending: deque[Block] = deque()   # received, in no batch yet
        self._planned: deque[Block] = deque()   # in a batch (seq order), FINed on commit
        self._recovering: list[Block] = []      # a replayed batch's messages while it waits for the rest
        # committed but never FINed (by an earlier process, or on a connection since lost): FIN on sight
        self._skip: dict[str, np.ndarray] = {}
        self._skip_older: dict[str, np.ndarray] = {}  # in _skip since before _skip_turned
        self._skip_turned = clock()
        self._base: int | None = None  # seqs <= base were numbered by an earlier process
        # ends of earlier batches replayed here -> their ids nsqd did not give back in time
        self._replayed: dict[int, dict[str, np.ndarray]] = {}
        # ids of the batches replayed here and of what their offsets list as missed: never dropped
        # as committed on the word of an older offset
        self._kept: dict[str, np.ndarray] = {}
        # batched messages nsqd took back (timed out: a TOUCH came late): it delivers them again,
        # and once their batch is committed that copy is dropped on sight, not FINed or batched
        self._timed_out: dict[str, np.ndarray] = {}
        self._last_seq = 0
        self._last_arrival = 0.0
        self._paused = False  # availableNow is drained: RDY 0
        self._full = False    # max_bytes_in_flight reached: RDY 0 until FINs free room
        self._until_ns: int | None = None
        self._started = False
        self._threads: list[threading.Thread] = []
        self._rdy_sent: dict[NSQConnection, int] = {}
        self._arrived: dict[NSQConnection, float] = {}  # when each connection last delivered
        #: counters for logs and tests
        self.stats = {"received": 0, "finished": 0, "touched": 0, "skipped": 0, "requeued": 0,
                      "lost": 0, "full": 0}

    # -- life cycle --------------------------------------------------------

    def start(self) -> None:
        """Connect (errors out if no nsqd or lookupd can be reached) and start the threads."""
        if self._started:
            return
        self._started = True
        self._connect_missing(initial=True)
        for target, name in ((self._io_loop, "nsq-io"), (self._discovery_loop, "nsq-discovery")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def close(self) -> None:
        """Stop the threads and close every connection (nsqd requeues what is unFINed)."""
        self._stopped.set()
        self._wake_discovery.set()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=5)
        with self._cond:
            conns = [c for cs in self._conns.values() for c in cs]
            self._conns.clear()
            self._pending.clear()
            self._planned.clear()
        for c in conns:
            c.close()

    # -- what Spark calls (through the stream reader) --------------------

    def available_now(self) -> None:
        """Bound this run to what was published before now (``trigger(availableNow=True)``)."""
        self._until_ns = time.time_ns()

    def acknowledge(self, offset: Offset) -> None:
        """Spark has committed every batch up to ``offset``: FIN their messages."""
        self._send_all(self._acknowledge(offset))

    def plan(self, start: Offset, max_rows: int | None) -> Offset:
        """The end of the next batch after ``start`` (``start`` itself when there is nothing).

        FINs everything up to ``start`` first: Spark plans the next batch
        only after it has committed the previous one. Whatever has arrived
        is taken at once; it waits, briefly, only when nothing is there or
        when an nsqd whose slots were just freed has nothing here yet
        (:meth:`_unheard`), for that refill and the rest of its burst.
        """
        sends = self._acknowledge(start)
        available_now = self._until_ns is not None
        with self._cond:
            if self._paused or (self._full and self._held_bytes() < self.options.max_bytes_in_flight):
                self._paused = self._full = False
                sends.extend(self._rdy_updates())
        freed = bool(sends)
        # the nsqds whose messages were just FINed: they refill those connections now
        refilling = {conn.address for conn, data in sends if data.startswith(b"FIN")}
        fin_at = self.clock()
        self._send_all(sends)
        if available_now:
            first_wait = self.options.drain_timeout
        elif freed or self._base is None:
            # nsqd refills the slots just freed, or sends the first messages after SUB
            first_wait = min(REFILL_WAIT, self.options.drain_timeout)
        else:
            first_wait = 0.0
        with self._cond:
            replanned = [b for b in self._planned if b.first_seq > start.seq]
            n_replanned = sum(len(b) for b in replanned)
            limit = max_rows
            t0 = self.clock()
            # messages that arrived while Spark ran the last batch are taken at once; when
            # there were none, the first ones are waited for with the rest of their burst
            seen: float | None = t0 - COLLECT if self._eligible_count() + n_replanned else None
            while True:
                total = self._eligible_count() + n_replanned
                now = self.clock()
                if limit is not None and total >= limit:
                    break
                if self._held() >= self._capacity():
                    break  # every RDY slot is taken: nothing more will come
                if total:
                    seen = now if seen is None else seen
                    if self._unheard(refilling, fin_at):
                        # an nsqd just freed has nothing here yet: wait for its refill too, so
                        # a batch takes from every nsqd rather than from whichever came first
                        wait = seen + REFILL_WAIT - now
                    else:
                        wait = min(self._last_arrival + QUIET, seen + COLLECT) - now
                else:
                    wait = t0 + first_wait - now
                if wait <= 0:
                    break
                self._cond.wait(wait)
            take = None if limit is None else max(0, limit - n_replanned)
            batch = replanned + self._take(take)
            if not batch:
                # availableNow is drained: give back what was published after the start and
                # stop receiving, so the query ends leaving nothing in flight
                sends = self._release_late() if available_now else []
                result = start
            else:
                unfinished = {address: encode_ids(ids) for address, ids in sorted(self._skip.items()) if len(ids)}
                missed = {address: encode_ids(ids)
                          for address, ids in sorted(self._replayed.get(start.seq, {}).items())}
                result = Offset(batch[-1].last_seq, ids_of(batch), unfinished, missed)
                sends = []
        self._send_all(sends)
        return result

    def messages(self, start: Offset, end: Offset) -> list[Block]:
        """The messages of the batch ``(start, end]``, those of a connection lost since included.

        A batch planned here keeps what it was planned with: its rows do not
        change when Spark runs it again or a connection goes; what nsqd
        redelivers of a lost connection's messages is dropped once the batch
        is committed (:meth:`_acknowledge`). A batch planned by an earlier
        process (a replay after a restart) is rebuilt from what nsqd gives
        back of its ids (:meth:`_replay`).
        """
        with self._cond:
            self._last_seq = max(self._last_seq, end.seq)
            replay = self._earlier(end) and end.seq not in self._replayed
            if not replay:
                return [b for b in self._planned if start.seq < b.first_seq and b.last_seq <= end.seq]
        return self._replay(start, end)

    # -- internals (callers hold self._cond unless said otherwise) --------

    def _earlier(self, offset: Offset) -> bool:
        """True for an offset planned by an earlier process (before we numbered anything)."""
        return self._base is None or offset.seq <= self._base

    def _replay(self, start: Offset, end: Offset) -> list[Block]:
        """Rebuild a batch an earlier process planned: wait for nsqd to redeliver its ids.

        The process that planned ``end`` held its messages unFINed, so nsqd
        gives them back (at once when that process's connections closed,
        after ``msg_timeout`` when they vanished) with the same ids. Waiting
        for them keeps "a committed offset's ids were written" true for every
        batch, replayed or not, which is what lets the next process drop the
        ids of a committed offset on sight. Those not back within
        ``replay_timeout_ms`` go into the next offset as ``missed``.

        ``start`` was committed before ``end`` was planned: its messages (and
        those it lists as unfinished) are dropped when nsqd redelivers them,
        except the ones ``end`` holds or lists as missed (a replay of
        ``start`` that could not write them).
        """
        with self._cond:
            self._kept = union(self._kept, union(end.id_arrays(), end.missed_arrays()))
            committed = union(start.id_arrays(), start.unfinished_arrays())
            sends = self._skip_ids(minus(committed, self._kept))
        self._send_all(sends)
        wanted = {address: ids for address, ids in end.id_arrays().items() if len(ids)}
        expected = sum(len(ids) for ids in wanted.values())
        deadline = self.clock() + self.options.replay_timeout
        found = self._recovering = []  # TOUCHed with the rest while the wait goes on
        while True:
            sends = []
            with self._cond:
                found.extend(self._take_ids(wanted))
                now = self.clock()
                if not wanted or now >= deadline or self._stopped.is_set():
                    break
                if self._held() >= self._capacity():
                    # every RDY slot holds newer messages: give them back so the batch's can come,
                    # deferred until the wait ends so that they do not come straight back (a REQ
                    # without a delay turned into a loop of REQs while the batch's did not come)
                    sends = self._requeue_pending(min(max(deadline - now, 1.0), REPLAY_REQ_MAX_DELAY))
                else:
                    self._cond.wait(min(TICK, deadline - now))
            self._send_all(sends)
        with self._cond:
            seq = start.seq
            for b in found:
                b.first_seq = seq + 1
                seq += len(b)
            self._planned = deque(sorted([*self._planned, *found], key=lambda b: b.first_seq))
            self._recovering = []
            self._replayed[end.seq] = wanted
        missing = sum(len(ids) for ids in wanted.values())
        if missing:
            log.warning("NSQ replay of batch (%d, %d]: %d of its %d messages came back from nsqd within"
                        " replay_timeout_ms; the rest are written by a later batch when they come",
                        start.seq, end.seq, expected - missing, expected)
        else:
            log.info("NSQ replay of batch (%d, %d]: its %d messages came back from nsqd",
                     start.seq, end.seq, expected)
        return found

    def _take_ids(self, wanted: dict[str, np.ndarray]) -> list[Block]:
        """Move the pending messages with these ids out of pending; ``wanted`` keeps the rest."""
        out: list[Block] = []
        keep: deque[Block] = deque()
        for b in self._pending:
            ids = wanted.get(b.conn.address)
            if ids is None or b.conn.closed:
                keep.append(b)
                continue
            hit = np.isin(b.ids, ids)
            if not hit.any():
                keep.append(b)
                continue
            out.append(b.select(hit))
            if not hit.all():
                keep.append(b.select(~hit))
            rest = np.setdiff1d(ids, b.ids[hit])
            if len(rest):
                wanted[b.conn.address] = rest
            else:
                del wanted[b.conn.address]
        self._pending = keep
        return out

    def _requeue_pending(self, delay: float) -> list[tuple[NSQConnection, bytes]]:
        """REQ every pending message (in no batch yet): nsqd delivers them again after ``delay`` seconds."""
        tail = b" %d\n" % int(delay * 1000)
        live = [b for b in self._pending if not b.conn.closed]
        self.stats["requeued"] += sum(len(b) for b in live)
        self._pending.clear()
        return [(b.conn, commands(b"REQ", b.ids, tail)) for b in live]

    def _acknowledge(self, offset: Offset) -> list[tuple[NSQConnection, bytes]]:
        sends: list[tuple[NSQConnection, bytes]] = []
        with self._cond:
            self._last_seq = max(self._last_seq, offset.seq)
            if self._earlier(offset):
                if offset.seq not in self._replayed:
                    # committed by an earlier process, whose FINs may never have gone out: drop its
                    # messages (and those of earlier batches it lists as unfinished) when nsqd
                    # redelivers them, except what a replay here holds or could not write
                    committed = union(offset.id_arrays(), offset.unfinished_arrays())
                    return self._skip_ids(minus(committed, self._kept))
                # replayed here: its messages are planned below; what it lists as unfinished
                # was committed before it
                sends.extend(self._skip_ids(minus(offset.unfinished_arrays(), self._kept)))
            planned = self._planned
            while planned and planned[0].last_seq <= offset.seq:
                b = planned.popleft()
                ids = b.ids
                gone = self._timed_out.get(b.conn.address)
                if gone is not None:
                    hit = np.isin(ids, gone)
                    if hit.any():
                        # nsqd took these back while they were batched: its next copy is
                        # dropped, like those of a lost connection below
                        self._timed_out[b.conn.address] = np.setdiff1d(gone, ids[hit])
                        sends.extend(self._skip_ids({b.conn.address: ids[hit]}))
                        ids = ids[~hit]
                if not b.conn.closed:
                    sends.append((b.conn, commands(b"FIN", ids)))
                    self.stats["finished"] += len(ids)
                else:
                    # committed, but its connection is gone and the FIN with it: nsqd redelivers
                    # these (the same ids, on another connection or after the node's restart),
                    # and they are FINed on sight instead of coming in a second batch
                    sends.extend(self._skip_ids({b.conn.address: ids}))
        return sends

    def _skip_ids(self, ids: dict[str, np.ndarray]) -> list[tuple[NSQConnection, bytes]]:
        """Drop these messages: FIN the ones already received, the rest when they arrive."""
        sends = []
        keep: deque[Block] = deque()
        for b in self._pending:
            wanted = ids.get(b.conn.address)
            if wanted is None or not len(wanted):
                keep.append(b)
                continue
            hit = np.isin(b.ids, wanted)
            if hit.any():
                sends.append((b.conn, commands(b"FIN", b.ids[hit])))
                self.stats["skipped"] += int(hit.sum())
                ids[b.conn.address] = np.setdiff1d(wanted, b.ids[hit])
                rest = b.select(~hit)
                if len(rest):
                    keep.append(rest)
            else:
                keep.append(b)
        self._pending = keep
        for address, wanted in ids.items():
            if len(wanted):
                old = self._skip.get(address)
                self._skip[address] = wanted if old is None else np.union1d(old, wanted)
        return sends

    def _unheard(self, addresses: set[str], since: float) -> bool:
        """Whether an nsqd of ``addresses`` has nothing for the next batch: no message waiting
        here and no delivery since ``since`` (its freed RDY slots not refilled yet).

        An nsqd with messages already waiting is in the batch whatever its
        other connections do; waiting for each of its connections to refill
        cost a batch tens of milliseconds at 40 connections, for no message
        that the next batch would not take anyway.
        """
        if not addresses:
            return False
        have = {b.conn.address for b in self._pending if not b.conn.closed}
        have.update(c.address for c, t in self._arrived.items() if t >= since and not c.closed)
        return not addresses <= have

    def _eligible_count(self) -> int:
        until = self._until_ns
        live = [b for b in self._pending if not b.conn.closed]
        if until is None:
            return sum(len(b) for b in live)
        return sum(int((b.timestamps <= until).sum()) for b in live)

    def _held(self) -> int:
        return sum(len(b) for q in (self._pending, self._planned, self._recovering) for b in q)

    def _held_bytes(self) -> int:
        return sum(b.size for q in (self._pending, self._planned, self._recovering) for b in q)

    def _take(self, limit: int | None) -> list[Block]:
        """Number up to ``limit`` eligible pending messages and move them to planned."""
        out: list[Block] = []
        keep: deque[Block] = deque()
        pending = self._pending
        until = self._until_ns
        if self._base is None:
            self._base = self._last_seq
        while pending and (limit is None or limit > 0):
            b = pending.popleft()
            if b.conn.closed:
                continue
            gone = self._timed_out.get(b.conn.address)
            if gone is not None and len(gone):
                # nsqd's new copy of a message an uncommitted batch holds: it waits for that
                # batch (dropped once it is committed), it is not batched twice
                again = np.isin(b.ids, gone)
                if again.any():
                    keep.append(b.select(again))
                    b = b.select(~again)
                    if not len(b):
                        continue
            if until is not None:
                eligible = b.timestamps <= until
                if not eligible.all():
                    late = b.select(~eligible)
                    keep.append(late)
                    b = b.select(eligible)
                    if not len(b):
                        continue
            if limit is not None:
                if len(b) > limit:
                    pending.appendleft(b.slice(limit, len(b)))
                    b = b.slice(0, limit)
                limit -= len(b)
            b.first_seq = self._last_seq + 1
            self._last_seq += len(b)
            out.append(b)
        keep.extend(pending)
        self._pending = keep
        self._planned.extend(out)
        return out

    def _release_late(self) -> list[tuple[NSQConnection, bytes]]:
        self._paused = True
        return self._rdy_updates() + self._requeue_pending(0.0)

    def _capacity(self) -> int:
        return sum(self._rdy_sent.values()) or 1

    def _rdy_updates(self) -> list[tuple[NSQConnection, bytes]]:
        """RDY for every connection: max_in_flight spread over them (0 while paused or full)."""
        conns = [c for cs in self._conns.values() for c in cs if not c.closed]
        sends = []
        for c in conns:
            if self._paused or self._full:
                count = 0
            else:
                count = max(1, self.options.max_in_flight // len(conns))
                count = min(count, max_rdy(c))
            if self._rdy_sent.get(c) != count:
                self._rdy_sent[c] = count
                sends.append((c, rdy(count)))
        return sends

    def _lost(self, conn: NSQConnection) -> None:
        """A connection is gone: nsqd requeues what it held, so forget its messages."""
        conn.close()
        with self._cond:
            conns = self._conns.get(conn.address, [])
            if conn in conns:
                conns.remove(conn)
                self._rdy_sent.pop(conn, None)
                self._arrived.pop(conn, None)
                dropped = sum(len(b) for b in self._pending if b.conn is conn)
                self._pending = deque(b for b in self._pending if b.conn is not conn)
                lost = sum(len(b) for b in self._planned if b.conn is conn)
                self.stats["lost"] += dropped + lost
                sends = self._rdy_updates()
                log.warning("NSQ %s: disconnected; %d received messages go back to nsqd; %d batched ones stay"
                            " in their batch (what nsqd redelivers of them is dropped once it is committed)",
                            conn.address, dropped, lost)
            else:
                sends = []
            self._cond.notify_all()
        self._wake_discovery.set()
        self._send_all(sends)

    # -- the I/O thread --------------------------------------------------

    def _io_loop(self) -> None:
        while not self._stopped.is_set():
            with self._cond:
                conns = [c for cs in self._conns.values() for c in cs if not c.closed]
            if not conns:
                self._stopped.wait(TICK)
                continue
            ready = [c for c in conns if c.pending()]
            if not ready:
                try:
                    ready, _, _ = select.select(conns, [], [], TICK)
                except (OSError, ValueError):
                    ready = []  # a connection closed under us; the next round sorts it out
            for conn in ready:
                self._read(conn)
            self._touch_due()
            self._expire_skips()

    def _read(self, conn: NSQConnection) -> None:
        try:
            data, starts, others = conn.read_messages()
            block = Block.parse(conn, data, starts, self.clock()) if starts else None
        except (NSQClientError, ValueError) as e:
            log.warning("NSQ %s: %s", conn.address, e)
            self._lost(conn)
            return
        replies: list[bytes] = []
        rdy_sends: list[tuple[NSQConnection, bytes]] = []
        touch_failed: list[bytes] = []
        fin_failed: list[bytes] = []
        for ftype, frame in others:
            if frame == HEARTBEAT:
                replies.append(b"NOP\n")
            elif ftype == FRAME_TYPE_ERROR:
                code, _, rest = frame.partition(b" ")
                msg_id = rest.split(b" ")[1] if rest.count(b" ") >= 2 else b""
                if code in (b"E_TOUCH_FAILED", b"E_FIN_FAILED") and len(msg_id) == 16:
                    (fin_failed if code == b"E_FIN_FAILED" else touch_failed).append(msg_id)
                elif code == b"E_REQ_FAILED":
                    pass  # given back already (a REQ forgets them here): nsqd sends them again anyway
                else:
                    log.warning("NSQ %s: %s", conn.address, frame.decode("utf-8", "replace"))
        if touch_failed or fin_failed:
            with self._cond:
                replies.extend(data for _, data in self._taken_back(conn, touch_failed, fin_failed))
        if block is not None:
            with self._cond:
                self.stats["received"] += len(block)
                again = block.attempts > 1
                if again.any():
                    self._redelivered(conn.address, block.ids[again])
                skip = self._skip.get(conn.address)
                if skip is not None and len(skip):
                    hit = np.isin(block.ids, skip)
                    if hit.any():
                        replies.append(commands(b"FIN", block.ids[hit]))
                        self.stats["skipped"] += int(hit.sum())
                        self._skip[conn.address] = np.setdiff1d(skip, block.ids[hit])
                        block = block.select(~hit)
                if len(block):
                    self._pending.append(block)
                self._last_arrival = self._arrived[conn] = block.touched
                if not self._full and self._held_bytes() >= self.options.max_bytes_in_flight:
                    # hold no more message data: RDY 0 until Spark's commits let us FIN
                    self._full = True
                    self.stats["full"] += 1
                    rdy_sends = self._rdy_updates()
                self._cond.notify_all()
        self._send_all(rdy_sends)
        if replies:
            self._send_all((conn, r) for r in replies)

    def _taken_back(self, conn: NSQConnection, touch_failed: list[bytes],
                    fin_failed: list[bytes]) -> list[tuple[NSQConnection, bytes]]:
        """nsqd answered a TOUCH or FIN with "not in flight": it timed those messages out (this
        process was held up past ``msg_timeout``) and delivers them again, same ids.

        FIN failed: their batch is committed; the copy to come is dropped on sight. TOUCH
        failed: a copy in no batch is forgotten (the next one is taken instead), a batched one is
        remembered so its batch's commit drops the next copy (see :meth:`_redelivered`).
        """
        address = conn.address
        log.warning("NSQ %s: nsqd timed out %d held messages (a TOUCH came too late) and delivers them"
                    " again; those already in a batch are dropped when they come back",
                    address, len(touch_failed) + len(fin_failed))
        if touch_failed:
            self._redelivered(address, np.array(touch_failed, dtype=IDS_DTYPE))
        if not fin_failed:
            return []
        return self._skip_ids({address: np.array(fin_failed, dtype=IDS_DTYPE)})

    def _redelivered(self, address: str, ids: np.ndarray) -> None:
        """nsqd no longer holds our copies of ``ids`` (it timed them out, and may have sent them
        again): an unbatched copy is forgotten, a batched one keeps its batch's rows and the
        batch's commit drops the new copy (held back from batches meanwhile by :meth:`_take`)."""
        keep: deque[Block] = deque()
        for b in self._pending:
            if b.conn.address == address:
                old = np.isin(b.ids, ids)
                if old.any():
                    b = b.select(~old)
                    if not len(b):
                        continue
            keep.append(b)
        self._pending = keep
        for queue in (self._planned, self._recovering):
            for b in queue:
                if b.conn.address == address:
                    hit = np.isin(b.ids, ids)
                    if hit.any():
                        self._timed_out = union(self._timed_out, {address: b.ids[hit]})

    def _expire_skips(self) -> None:
        """Forget ids to drop on sight that have waited ``SKIP_KEEP`` for a redelivery that never came."""
        now = self.clock()
        if now - self._skip_turned < SKIP_KEEP:
            return
        with self._cond:
            self._skip_turned = now
            before = sum(len(ids) for ids in self._skip.values())
            # those in both were already there at the last turn: one to two SKIP_KEEP ago
            self._skip = {a: ids for a, ids in minus(self._skip, self._skip_older).items() if len(ids)}
            self._skip_older = dict(self._skip)
            n = before - sum(len(ids) for ids in self._skip.values())
        if n:
            log.info("NSQ: %d committed messages were not redelivered within %.0f s; no longer waiting for them",
                     n, SKIP_KEEP)

    def _touch_due(self) -> None:
        """TOUCH held messages halfway to their timeout, so holding them across idle time is safe."""
        now = self.clock()
        sends = []
        with self._cond:
            for queue in (self._pending, self._planned, self._recovering):
                for b in queue:
                    timeout = (b.conn.settings.get("msg_timeout") or 60000) / 1000.0
                    if now - b.touched >= timeout / 2 and not b.conn.closed:
                        b.touched = now
                        ids = b.ids
                        gone = self._timed_out.get(b.conn.address)
                        if gone is not None and len(gone) and queue is not self._pending:
                            ids = ids[~np.isin(ids, gone)]  # nsqd took them back: nothing to TOUCH
                        if len(ids):
                            sends.append((b.conn, commands(b"TOUCH", ids)))
                            self.stats["touched"] += len(ids)
        self._send_all(sends)
