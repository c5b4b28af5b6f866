"""The driver-side NSQ consumer behind the streaming source.

NSQ has no offsets and a message can only be FINed on the connection it came
in on, so the consumer lives in the one long-lived process that Spark keeps
for a stream source on the driver host. It holds every message it receives
until Spark has committed the micro-batch holding it, and only then FINs it;
if the process dies, nsqd gets the unFINed messages back and redelivers them.

Offsets are ``{"seq": n, "ids": {address: "<id><id>..."}}``: ``seq`` numbers
batches' messages in this process and continues from whatever offset Spark
shows us first (a restart resumes from the checkpoint); ``ids`` lists the
messages of the batch that ends at that offset. A new process cannot FIN
what the old one held, so when Spark shows it an offset from before its
time (a committed batch whose FINs may not have gone out), it FINs those
messages on sight when nsqd redelivers them instead of emitting them again.

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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from nsqtw.core.message import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, decode_message
from nsqtw.spark.client import HEARTBEAT, NSQClientError, NSQConnection, fin, rdy, req, touch
from nsqtw.spark.discovery import LookupdUnavailable, lookup_topic
from nsqtw.spark.options import ReaderOptions, lookupd_url

log = logging.getLogger("nsqtw.spark")

ID_LEN = 16
#: how often the I/O thread wakes to TOUCH and notice new connections
TICK = 0.2
#: the quiet gap after which a burst of deliveries counts as complete
GAP = 0.1
#: how long a non-availableNow plan waits for nsqd to refill freed RDY slots
REFILL_WAIT = 0.25


@dataclass(frozen=True)
class Offset:
    """A position in this source: the last sequence number and the ids of its batch."""

    seq: int
    ids: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any) -> Offset:
        try:
            seq = int(data["seq"])
            ids = {str(k): str(v) for k, v in (data.get("ids") or {}).items()}
        except (TypeError, KeyError, ValueError, AttributeError):
            raise ValueError(f"not an nsq offset: {data!r}") from None
        return cls(seq, ids)

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "ids": self.ids}

    def id_set(self) -> set[tuple[str, bytes]]:
        out = set()
        for address, joined in self.ids.items():
            raw = joined.encode()
            for i in range(0, len(raw), ID_LEN):
                out.add((address, raw[i:i + ID_LEN]))
        return out


class Held:
    """A message this process holds in flight (received, not yet FINed)."""

    __slots__ = ("id", "body", "timestamp", "attempts", "conn", "touched", "seq")

    def __init__(self, conn: NSQConnection, data: bytes, now: float) -> None:
        msg = decode_message(data)
        self.id = msg.id
        self.body = msg.body
        self.timestamp = msg.timestamp
        self.attempts = msg.attempts
        self.conn = conn
        self.touched = now
        self.seq = 0


class Consumer:
    """All connections for one (topic, channel) and the messages held on them."""

    def __init__(self, options: ReaderOptions,
                 discover: Callable[[], set[str]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options
        self.clock = clock
        self._discover = discover or self._default_discover
        self._cond = threading.Condition()
        self._conns: dict[str, NSQConnection] = {}
        self._pending: deque[Held] = deque()   # received, in no batch yet
        self._planned: deque[Held] = deque()   # in a batch (seq order), FINed on commit
        self._skip: set[tuple[str, bytes]] = set()  # committed before this process
        self._base: int | None = None  # seqs <= base were numbered by an earlier process
        self._replayed: set[int] = set()  # ends of earlier batches replayed here as empty
        self._last_seq = 0
        self._last_arrival = 0.0
        self._paused = False
        self._until_ns: int | None = None
        self._started = False
        self._stopped = threading.Event()
        self._wake_discovery = threading.Event()
        self._threads: list[threading.Thread] = []
        self._rdy_sent: dict[str, int] = {}
        #: counters for logs and tests
        self.stats = {"received": 0, "finished": 0, "touched": 0, "skipped": 0, "requeued": 0,
                      "lost": 0}

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
            conns = list(self._conns.values())
            self._conns.clear()
            self._pending.clear()
            self._planned.clear()
        for c in conns:
            c.close()

    def addresses(self) -> list[str]:
        with self._cond:
            return sorted(self._conns)

    # -- what Spark calls (through the stream reader) --------------------

    def available_now(self) -> None:
        """Bound this run to what was published before now (``trigger(availableNow=True)``)."""
        self._until_ns = time.time_ns()

    def acknowledge(self, offset: Offset) -> None:
        """Spark has committed every batch up to ``offset``: FIN their messages."""
        sends = self._acknowledge(offset)
        self._send_all(sends)

    def plan(self, start: Offset, max_rows: int | None) -> Offset:
        """The end of the next batch after ``start`` (``start`` itself when there is nothing).

        FINs everything up to ``start`` first: Spark plans the next batch
        only after it has committed the previous one.
        """
        sends = self._acknowledge(start)
        available_now = self._until_ns is not None
        with self._cond:
            if self._paused:
                self._paused = False
                sends.extend(self._rdy_updates())
        freed = any(data.startswith(b"FIN") for _c, data in sends)
        self._send_all(sends)
        if available_now:
            first_wait = self.options.drain_timeout
        elif freed or self._base is None:
            # nsqd refills the slots just freed, or sends the first messages after SUB
            first_wait = min(REFILL_WAIT, self.options.drain_timeout)
        else:
            first_wait = 0.0
        with self._cond:
            replanned = [h for h in self._planned if h.seq > start.seq and not h.conn.closed]
            limit = max_rows
            t0 = self.clock()
            hard_deadline = t0 + first_wait + 1.0
            while True:
                total = self._eligible_count() + len(replanned)
                now = self.clock()
                if limit is not None and total >= limit:
                    break
                if len(self._pending) + len(self._planned) >= self._capacity():
                    break  # every RDY slot is taken: nothing more will come
                if total:
                    wait = self._last_arrival + GAP - now  # collect the rest of a burst
                else:
                    wait = t0 + first_wait - now
                wait = min(wait, hard_deadline - now)
                if wait <= 0:
                    break
                self._cond.wait(wait)
            take = None if limit is None else max(0, limit - len(replanned))
            planned = self._take(take)
            batch = replanned + planned
            if not batch:
                if available_now:
                    # drained: give back what was published after the start and stop
                    # receiving, so the query ends leaving nothing in flight
                    sends = self._release_late()
                else:
                    sends = []
                result = start
            else:
                result = Offset(batch[-1].seq, _ids_of(batch))
                sends = []
        self._send_all(sends)
        return result

    def messages(self, start: Offset, end: Offset) -> list[Held]:
        """The messages of the batch ``(start, end]`` still held on a live connection.

        A batch planned by an earlier process (a replay after a restart) has
        none here: nsqd redelivers its messages, and they come in a later batch.
        """
        sends: list[tuple[NSQConnection, bytes]] = []
        with self._cond:
            self._last_seq = max(self._last_seq, end.seq)
            if self._earlier(end):
                if start.seq not in self._replayed:
                    sends = self._skip_ids(start.id_set())  # committed: FIN on redelivery
                self._replayed.add(end.seq)  # not processed: emit on redelivery
                batch = []
            else:
                batch = [h for h in self._planned if start.seq < h.seq <= end.seq and not h.conn.closed]
        self._send_all(sends)
        return batch

    # -- internals (callers hold self._cond unless said otherwise) --------

    def _earlier(self, offset: Offset) -> bool:
        """True for an offset planned by an earlier process (before we numbered anything)."""
        return self._base is None or offset.seq <= self._base

    def _acknowledge(self, offset: Offset) -> list[tuple[NSQConnection, bytes]]:
        sends: list[tuple[NSQConnection, bytes]] = []
        with self._cond:
            self._last_seq = max(self._last_seq, offset.seq)
            if self._earlier(offset):
                # its FINs may never have gone out: drop its messages when nsqd redelivers
                # them, unless this process replayed it as empty (never processed)
                if offset.seq not in self._replayed:
                    sends.extend(self._skip_ids(offset.id_set()))
                return sends
            planned = self._planned
            while planned and planned[0].seq <= offset.seq:
                h = planned.popleft()
                if not h.conn.closed:
                    sends.append((h.conn, fin(h.id)))
            self.stats["finished"] += len(sends)
        return sends

    def _skip_ids(self, ids: set[tuple[str, bytes]]) -> list[tuple[NSQConnection, bytes]]:
        """Drop these messages: FIN the ones already received, the rest when they arrive."""
        sends = []
        keep: deque[Held] = deque()
        for h in self._pending:
            key = (h.conn.address, h.id)
            if key in ids:
                ids.discard(key)
                sends.append((h.conn, fin(h.id)))
            else:
                keep.append(h)
        self._pending = keep
        self._skip.update(ids)
        self.stats["skipped"] += len(sends)
        return sends

    def _eligible(self, h: Held) -> bool:
        return not h.conn.closed and (self._until_ns is None or h.timestamp <= self._until_ns)

    def _eligible_count(self) -> int:
        if self._until_ns is None:
            return len(self._pending)
        return sum(1 for h in self._pending if self._eligible(h))

    def _take(self, limit: int | None) -> list[Held]:
        """Number up to ``limit`` eligible pending messages and move them to planned."""
        out: list[Held] = []
        keep: deque[Held] = deque()
        pending = self._pending
        if self._base is None:
            self._base = self._last_seq
        while pending and (limit is None or len(out) < limit):
            h = pending.popleft()
            if not self._eligible(h):
                keep.append(h)
                continue
            self._last_seq += 1
            h.seq = self._last_seq
            out.append(h)
        keep.extend(pending)
        self._pending = keep
        self._planned.extend(out)
        return out

    def _release_late(self) -> list[tuple[NSQConnection, bytes]]:
        self._paused = True
        sends = self._rdy_updates()
        late = [h for h in self._pending if not h.conn.closed]
        sends.extend((h.conn, req(h.id)) for h in late)
        self.stats["requeued"] += len(late)
        self._pending.clear()
        return sends

    def _capacity(self) -> int:
        return sum(self._rdy_sent.values()) or 1

    def _rdy_updates(self) -> list[tuple[NSQConnection, bytes]]:
        """RDY for every connection: max_in_flight spread over them (0 while paused)."""
        conns = [c for c in self._conns.values() if not c.closed]
        sends = []
        for c in conns:
            if self._paused:
                count = 0
            else:
                count = max(1, self.options.max_in_flight // len(conns))
                max_rdy = int(c.settings.get("max_rdy_count") or 2500)
                count = min(count, max_rdy)
            if self._rdy_sent.get(c.address) != count:
                self._rdy_sent[c.address] = count
                sends.append((c, rdy(count)))
        return sends

    def _send_all(self, sends: Iterable[tuple[NSQConnection, bytes]]) -> None:
        """Send grouped per connection, outside the lock (nsqd may be waiting on our reads)."""
        grouped: dict[NSQConnection, list[bytes]] = {}
        for conn, data in sends:
            grouped.setdefault(conn, []).append(data)
        for conn, parts in grouped.items():
            try:
                conn.send(b"".join(parts))
            except NSQClientError as e:
                log.warning("NSQ %s: %s", conn.address, e)
                self._lost(conn)

    def _lost(self, conn: NSQConnection) -> None:
        """A connection is gone: nsqd requeues what it held, so forget its messages."""
        conn.close()
        with self._cond:
            if self._conns.get(conn.address) is conn:
                del self._conns[conn.address]
                self._rdy_sent.pop(conn.address, None)
                dropped = [h for h in self._pending if h.conn is conn]
                self._pending = deque(h for h in self._pending if h.conn is not conn)
                lost = sum(1 for h in self._planned if h.conn is conn)
                self.stats["lost"] += len(dropped) + lost
                sends = self._rdy_updates()
                log.warning("NSQ %s: disconnected; %d received and %d batched messages go back to nsqd",
                            conn.address, len(dropped), lost)
            else:
                sends = []
            self._cond.notify_all()
        self._wake_discovery.set()
        self._send_all(sends)

    # -- connections and discovery ---------------------------------------

    def _default_discover(self) -> set[str]:
        ep = self.options.endpoints
        if ep.nsqd_tcp_addresses:
            return set(ep.nsqd_tcp_addresses)
        urls = [lookupd_url(a) for a in ep.lookupd_http_addresses]
        return lookup_topic(urls, self.options.topic, timeout=ep.connect.connect_timeout)

    def _connect_missing(self, initial: bool = False) -> None:
        try:
            wanted = self._discover()
        except LookupdUnavailable as e:
            if initial:
                raise NSQClientError(str(e)) from e
            log.warning("NSQ discovery: %s", e)
            return
        with self._cond:
            missing = sorted(wanted - set(self._conns))
        errors = []
        for address in missing:
            conn = NSQConnection(address, self.options.endpoints.connect)
            try:
                conn.connect()
                conn.subscribe(self.options.topic, self.options.channel)
            except NSQClientError as e:
                conn.close()
                errors.append(str(e))
                log.warning("NSQ %s: %s", address, e)
                continue
            log.info("NSQ %s: subscribed to %s/%s", address, self.options.topic, self.options.channel)
            with self._cond:
                self._conns[address] = conn
                sends = self._rdy_updates()
            self._send_all(sends)
        if initial and missing and len(errors) == len(missing):
            raise NSQClientError("cannot subscribe to any nsqd: " + "; ".join(errors))

    def _discovery_loop(self) -> None:
        ep = self.options.endpoints
        interval = ep.lookupd_poll_interval
        while not self._stopped.is_set():
            with self._cond:
                have_all = bool(self._conns) and (
                    not ep.nsqd_tcp_addresses or set(self._conns) >= set(ep.nsqd_tcp_addresses))
            # reconnect lost nsqds after a second; ask lookupd every poll interval
            self._wake_discovery.wait(interval if have_all else 1.0)
            self._wake_discovery.clear()
            if self._stopped.is_set():
                return
            try:
                self._connect_missing()
            except Exception:  # keep discovering whatever happens
                log.exception("NSQ discovery failed")

    # -- the I/O thread --------------------------------------------------

    def _io_loop(self) -> None:
        while not self._stopped.is_set():
            with self._cond:
                conns = [c for c in self._conns.values() if not c.closed]
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

    def _read(self, conn: NSQConnection) -> None:
        try:
            frames = conn.read_frames()
        except NSQClientError as e:
            log.warning("NSQ %s: %s", conn.address, e)
            self._lost(conn)
            return
        now = self.clock()
        replies: list[bytes] = []
        with self._cond:
            for ftype, data in frames:
                if ftype == FRAME_TYPE_MESSAGE:
                    h = Held(conn, data, now)
                    self.stats["received"] += 1
                    key = (conn.address, h.id)
                    if key in self._skip:
                        self._skip.discard(key)
                        self.stats["skipped"] += 1
                        replies.append(fin(h.id))
                        continue
                    self._pending.append(h)
                elif data == HEARTBEAT:
                    replies.append(b"NOP\n")
                elif ftype == FRAME_TYPE_ERROR:
                    log.warning("NSQ %s: %s", conn.address, data.decode("utf-8", "replace"))
            self._last_arrival = now
            self._cond.notify_all()
        if replies:
            self._send_all((conn, r) for r in replies)

    def _touch_due(self) -> None:
        """TOUCH held messages halfway to their timeout, so holding them across idle time is safe."""
        now = self.clock()
        sends = []
        with self._cond:
            for queue in (self._pending, self._planned):
                for h in queue:
                    timeout = (h.conn.settings.get("msg_timeout") or 60000) / 1000.0
                    if now - h.touched >= timeout / 2 and not h.conn.closed:
                        h.touched = now
                        sends.append((h.conn, touch(h.id)))
            self.stats["touched"] += len(sends)
        self._send_all(sends)


def _ids_of(batch: list[Held]) -> dict[str, str]:
    ids: dict[str, list[str]] = {}
    for h in batch:
        ids.setdefault(h.conn.address, []).append(h.id.decode("ascii", "replace"))
    return {address: "".join(v) for address, v in sorted(ids.items())}
