"""The owner's side: each publish's copy sent to the topic's replica, its OK held until acked.

One :class:`PeerLink` per replica node, carrying every topic this node
placed there. The publishes of one reactor turn to a topic leave as one
``PUB`` record at the turn's end, which is kept (:class:`Pending`) until
the replica's ``ACK`` covers it; its publishers' Deferreds fire then. A
link lost or silent for a third of ``--replica-timeout`` is dropped, its
replica set aside, its topics placed anew and its unacked records sent to
the new replica, so a publish waiting on a lost replica is answered by the
next one. A publish not acked within ``--replica-wait`` is refused
(:class:`~nsqtw.errors.ReplicaError`); its message stays queued here.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence
from itertools import groupby
from operator import itemgetter
from typing import Any

from twisted.internet.defer import Deferred, ensureDeferred, succeed
from twisted.internet.task import deferLater
from twisted.python.failure import Failure

from nsqtw.errors import ReplicaError
from nsqtw.log import Logger
from nsqtw.net.turn import turn_end_caller
from nsqtw.replica.choice import Candidate, Choice
from nsqtw.replica.link import Link, beat_interval, open_link
from nsqtw.replica.records import (
    Kind,
    decode_ack,
    decode_json,
    decode_need,
    encode_fin,
    encode_json,
    encode_snap,
    encode_snap_ids,
    frame,
    frame_pub,
    pub_messages,
    select_messages,
)
from nsqtw.replica.standby import Handed, Standby

__all__ = ["OPEN_RECORD_BYTES", "OwnerSide", "Pending", "PeerLink", "SNAP_IDS_MAX"]

#: ID values per SNAP_IDS record at most (128 KiB of record): the replica handles a record in one
#: reactor turn (:meth:`~nsqtw.replica.standby.Standby.confirm`), and the next goes once it is acked
SNAP_IDS_MAX = 16384

#: messages of a log segment looked at per reactor turn while finding what a new replica lacks
#: (:meth:`~nsqtw.replica.standby.Standby.live_runs`, Python a message: a 16 MiB segment of
#: 200-byte messages held the reactor 80 ms in one go, a slice of this many about 4 ms)
LIVE_RUNS_SLICE = 4096

#: message bytes a turn's publishes to a topic gather into one PUB record at most: a record is
#: made of them whole, so an MPUB that would take it past this starts the next one (many large
#: MPUBs in a turn must not make a record past what a replica takes, records.MAX_RECORD)
OPEN_RECORD_BYTES = 1 << 20


class Pending:
    """A record kept until its replica acks it, with the publishers waiting on it.

    While its turn lasts it is open (:attr:`parts`): the turn's publishes to
    its topic add their messages, and the record is made at the turn's end
    (:meth:`OwnerSide._close_open`), when its messages go into the topic's
    own log too, in one append. Its publishers are answered once the
    replica acked it and, with ``--durable-delivery``, that append is
    written (:meth:`answer`)."""

    __slots__ = ("topic", "record", "waiters", "since", "number", "sent", "parts", "size", "count", "publishes",
                 "own_values", "own_sizes", "own_unwritten", "acked")

    def __init__(self, topic: str, record: bytes, since: float) -> None:
        self.topic = topic
        self.record = record
        #: while open, the messages of its publishes as :func:`pub_messages` made them (None: closed)
        self.parts: list[bytes] | None = None
        #: the bytes of those parts
        self.size = 0
        #: messages, and publishes, it carries
        self.count = 0
        self.publishes = 0
        self.waiters: list[Deferred[None]] = []
        #: when it was published (its publishers' --replica-wait counts from here)
        self.since = since
        #: its number on the link it was sent on (0: not sent yet)
        self.number = 0
        #: when it was given to its replica now, or sent on that replica's link (a replica lost
        #: before acking it hands it to the next one: that one's time to ack counts from here)
        self.sent = since
        #: while open, its messages' ID values and body sizes for the own log (None: no own log)
        self.own_values: list[int] | None = None
        self.own_sizes: list[int] | None = None
        #: --durable-delivery: its own log append is not written yet (its publishers wait for it)
        self.own_unwritten = False
        #: its replica acked it (its publishers are answered once the own log's write is done too)
        self.acked = False

    def answer(self) -> None:
        """Its publishers' OK, once both halves are done: the replica's ACK and the own log's write."""
        if self.acked and not self.own_unwritten:
            for d in self.waiters:
                if not d.called:
                    d.callback(None)

    def own_written(self, _: object) -> None:
        """The own log's append of it is written (or failed: the replica's copy stands, and
        :meth:`OwnerSide.own_failed` says so)."""
        self.own_unwritten = False
        self.answer()


class PeerLink:
    """This node's link to one replica node."""

    log = Logger()

    def __init__(self, side: OwnerSide, candidate: Candidate) -> None:
        self.side = side
        self.candidate = candidate
        self.link: Link | None = None
        self.topics: set[str] = set()
        #: records sent or waiting to be sent, oldest first, until acked
        self.pending: deque[Pending] = deque()
        self.acked = 0
        self.dropped = False
        self.up_since: float | None = None
        #: topics whose unfinished messages are being copied to this replica (SNAP records)
        self.catching_up: set[str] = set()
        #: (record number, fired once the replica acked it)
        self._ack_waiters: list[tuple[int, Deferred[None]]] = []
        #: per topic, the ID values the replica said it lacks (NEED records, after SNAP_IDS)
        self.needed: dict[str, set[int]] = {}
        #: fired with the replica's HELLO, or None if the link is lost first
        self._hello_waiters: list[Deferred[dict[str, Any] | None]] = []

    def connect(self) -> None:
        side = self.side
        open_link(side.reactor, self.candidate.host, self.candidate.http_port, self, beat_interval(side.timeout),
                  side.timeout / 3, lambda why: self.link_lost(None, why), side.secret)

    # -- LinkHandler --------------------------------------------------------------------------

    def link_up(self, link: Link) -> None:
        if self.dropped:
            link.abort()
            return
        self.link = link
        self.up_since = self.side.clock.seconds()
        link.send(encode_json(Kind.HELLO, self.side.hello()))
        self.log.info("REPLICATION({peer}): link up, copies of {topics} go there",
                      peer=self.candidate.address, topics=sorted(self.topics))
        for topic in sorted(self.topics):
            self.side.announce_topic(self, topic)
        now = self.side.clock.seconds()
        for p in self.pending:
            p.number = link.send(p.record)
            p.sent = now

    def link_record(self, link: Link, kind: int, payload: bytes) -> None:
        if kind == Kind.ACK:
            self._acked(decode_ack(payload))
        elif kind == Kind.NEED:
            topic, values = decode_need(payload)
            self.needed.setdefault(topic, set()).update(values)
        elif kind == Kind.HELLO:
            link.hello = decode_json(payload)
            self._hello_known(link.hello)

    def hello_known(self) -> Deferred[dict[str, Any] | None]:
        """The replica's HELLO on the link now (None: no link, or it is lost before the HELLO comes)."""
        link = self.link
        if link is None or link.hello is not None:
            return succeed(None if link is None else link.hello)
        d: Deferred[dict[str, Any] | None] = Deferred()
        self._hello_waiters.append(d)
        return d

    def _hello_known(self, hello: dict[str, Any] | None) -> None:
        waiters, self._hello_waiters = self._hello_waiters, []
        for d in waiters:
            d.callback(hello)

    def link_read(self, link: Link) -> None:
        pass

    def link_lost(self, link: Link | None, reason: str) -> None:
        if link is not None and link is not self.link:
            return
        self.link = None
        self.needed = {}
        self._hello_known(None)
        if not self.dropped:
            self.log.warn("REPLICATION({peer}): link lost - {reason}", peer=self.candidate.address, reason=reason)
            self.side.peer_lost(self)

    # -- records ------------------------------------------------------------------------------

    def send(self, pending: Pending) -> None:
        self.pending.append(pending)
        pending.sent = self.side.clock.seconds()
        if self.link is not None:
            pending.number = self.link.send(pending.record)

    def send_now(self, record: bytes) -> None:
        """A record nobody waits on (FIN, CHANNEL...): sent if the link is up, else dropped
        (a new link announces the topic's channels again)."""
        if self.link is not None:
            self.link.send(record)

    def when_acked(self, number: int) -> Deferred[None]:
        """Fires once the replica acked record ``number`` (never, if the link is lost first)."""
        d: Deferred[None] = Deferred()
        if number <= self.acked:
            d.callback(None)
        else:
            self._ack_waiters.append((number, d))
        return d

    def send_counted(self, record: bytes) -> int:
        """A record nobody waits on, sent now; its number (0: the link is down)."""
        return self.link.send(record) if self.link is not None else 0

    def _acked(self, number: int) -> None:
        self.acked = number
        if self._ack_waiters:
            due = [d for n, d in self._ack_waiters if n <= number]
            self._ack_waiters = [(n, d) for n, d in self._ack_waiters if n > number]
            for d in due:
                d.callback(None)
        pending = self.pending
        while pending and 0 < pending[0].number <= number:
            p = pending.popleft()
            p.acked = True
            p.answer()

    def lag(self, now: float) -> float:
        """Seconds the oldest unacked record has waited (0 when none)."""
        return now - self.pending[0].since if self.pending else 0.0

    def drop(self) -> None:
        self.dropped = True
        if self.link is not None:
            self.link.abort()

    def say_bye(self) -> None:
        """A graceful stop: BYE, written now, then the link closes (its replica keeps the copies
        for this node's return on its disk)."""
        self.dropped = True
        link = self.link
        if link is not None:
            link.send(frame(Kind.BYE))
            link.close_now()


class OwnerSide:
    """Every topic of this node placed on a replica, and the links to them."""

    log = Logger()

    def __init__(self, reactor: Any, choice: Choice, own_address: Callable[[], str],
                 hello: Callable[[], dict[str, Any]], channels_of: Callable[[str], list[tuple[str, bool]]],
                 timeout: float, wait: float, make_own: Callable[[str], Standby] | None = None,
                 durable: bool = False, secret: bytes | None = None) -> None:
        self.reactor = reactor
        #: the cluster's replica secret its links prove (``--replica-secret-file``)
        self.secret = secret
        self.clock = reactor
        self.choice = choice
        self.own_address = own_address
        self.hello = hello
        self.channels_of = channels_of
        self.timeout = timeout
        self.wait = wait
        self.peers: dict[str, PeerLink] = {}
        self.placed: dict[str, PeerLink] = {}
        #: records of topics no replica could be chosen for, failed at their wait's end
        self.unplaced: deque[Pending] = deque()
        self.refused = 0
        self.unreplicated = 0
        #: per topic, this node's own log of its unfinished messages (what a new replica is sent)
        self.own: dict[str, Standby] = {}
        self._make_own = make_own
        #: topics whose own log may lack unfinished messages (they were here before it, or a write
        #: to it failed): their replica is never told to let go of what it holds (:meth:`_synced`)
        self.incomplete: set[str] = set()
        #: a publisher waits for the own log's write too (--durable-delivery: a restart replays it)
        self.durable = durable
        #: per topic, this turn's publishes, made one PUB record at the turn's end (:meth:`_close_open`):
        #: a replica takes a turn's publishes as one record, and acks it once, not one by one
        self._open: dict[str, Pending] = {}
        self._at_turn_end = turn_end_caller(reactor)

    # -- placing topics -------------------------------------------------------------------------

    def peer_for(self, topic: str) -> PeerLink | None:
        peer = self.placed.get(topic)
        if peer is not None:
            return peer
        candidate = self.choice.best(self.own_address(), topic)
        if candidate is None:
            return None
        peer = self.peers.get(candidate.address)
        if peer is None:
            peer = self.peers[candidate.address] = PeerLink(self, candidate)
            peer.connect()
        peer.topics.add(topic)
        self.placed[topic] = peer
        if peer.link is not None:
            self.announce_topic(peer, topic)
        return peer

    def announce_topic(self, peer: PeerLink, topic: str) -> None:
        """Tell a replica the topic's channels (a new link, or a topic newly placed there), then
        send it every unfinished message of the topic it may lack (SNAP records)."""
        for channel, _ in self.channels_of(topic):
            peer.send_now(encode_json(Kind.CHANNEL, {"topic": topic, "channel": channel, "backlog": False}))
        own = self.own.get(topic)
        if topic in peer.catching_up:
            return
        if own is not None and len(own):
            self._copy_log(peer, topic, own)
        else:
            self._synced(peer, topic)

    def _synced(self, peer: PeerLink, topic: str) -> None:
        """Every unfinished message of the topic went to the replica (``SNAP``s, or there were none):
        what it held from before this link and was not named is finished here, unless the own log
        is not the whole story (``complete``: :attr:`incomplete`). Without own logs, nothing is said."""
        if self._make_own is not None:
            peer.send_now(encode_json(Kind.SYNCED, {"topic": topic, "complete": topic not in self.incomplete}))

    def _copy_log(self, peer: PeerLink, topic: str, own: Standby) -> None:
        peer.catching_up.add(topic)
        d = ensureDeferred(self._snapshot(peer, topic, own))
        d.addErrback(lambda f: self.log.failure("REPLICATION({peer}): copying {topic} failed", f,
                                                peer=peer.candidate.address, topic=topic))
        d.addBoth(lambda _: peer.catching_up.discard(topic))

    def taken_over(self, topic: str, handed: list[Handed]) -> None:
        """Messages a takeover handed into this node's topic (``handed``, with IDs of this node's) go
        into the topic's own log, owed by the channels they went to, so the copies that were on
        the lost node are two again: its replica gets them once the takeover ends (:meth:`recopy`),
        and any later replica with the rest of the log."""
        self._close_open(topic)
        own = self._own(topic)
        if own is None:
            return
        for owing, group in groupby(handed, key=itemgetter(0)):
            run = list(group)
            data = b"".join(pub_messages([v], [body], ts, delay_ms / 1000) for _, v, ts, body, delay_ms in run)
            values, sizes = [v for _, v, *_ in run], [len(body) for _, _, _, body, _ in run]
            if owing:
                own.add_snapshot(data, values, sizes, list(owing))
            else:
                own.add(data, values, sizes)

    def recopy(self, topic: str) -> None:
        """Send the topic's replica its own log again (``SNAP``s; it skips what it holds): after a
        takeover added messages to the log outside the publish path."""
        peer = self.peer_for(topic)
        own = self.own.get(topic)
        if peer is not None and own is not None and len(own) and peer.link is not None:
            self._copy_log(peer, topic, own)  # (a link not up yet sends the log when it comes up)

    async def _snapshot(self, peer: PeerLink, topic: str, own: Standby) -> None:
        """The topic's unfinished messages, from its own log. To a replica of version 2, first their
        IDs (``SNAP_IDS``, from memory, each record sent once the one before is acked): it confirms
        those it holds and names the others (``NEED``), so a link that comes back costs 8 bytes a
        message it holds, not its body. Then the bodies of those needed (of every one for an older
        replica), a segment at a time, each sent once the replica acked the one before (so no more
        than a segment waits in memory)."""
        until = own.arrivals
        hello = await peer.hello_known()
        if not self._copying(peer, topic, own):
            return
        needed: set[int] | None = None  # None: every unfinished message
        if hello is not None and int(hello.get("version") or 1) >= 2:
            needed = set()
            for owing, values in own.live_id_runs(until, SNAP_IDS_MAX):
                last = peer.send_counted(encode_snap_ids(topic, owing, values))
                if last:
                    await peer.when_acked(last)  # (its NEED came before its ACK)
                if not self._copying(peer, topic, own):
                    return
                needed |= peer.needed.pop(topic, set())
        sent = 0
        segments = [list(seg) for seg in own.disk.segments]
        wanted = None if needed is None else sorted(a for a in map(own.arrival_of, needed) if a is not None)
        for k, (number, first, _) in enumerate(segments):
            if first >= until or wanted == []:
                break
            end = segments[k + 1][1] if k + 1 < len(segments) else until
            if wanted is not None and bisect_left(wanted, first) == bisect_left(wanted, end):
                continue  # none needed in it: not read
            try:
                data = await own.disk.read_number(number, first)
            except FileNotFoundError:
                continue  # every message in it was done meanwhile
            if not self._copying(peer, topic, own):
                return
            last = 0
            pos, arrival, more = 0, first, True
            while more:
                if pos:  # the segment's next slice in a later reactor turn: others are served between
                    await deferLater(self.clock, 0, lambda: None)
                    if not self._copying(peer, topic, own):
                        return
                runs, pos, arrival, more = own.live_runs(data, pos, arrival, until, LIVE_RUNS_SLICE)
                for owing, chunk in runs:
                    if needed is not None:
                        chunk = select_messages(chunk, needed)
                    if chunk:
                        last = peer.send_counted(encode_snap(topic, owing, chunk))
                        sent += 1
            if last:
                await peer.when_acked(last)
        if not self._copying(peer, topic, own):
            return
        self._synced(peer, topic)
        if sent:
            self.log.info("REPLICATION({peer}): {topic}'s unfinished messages copied", peer=peer.candidate.address,
                          topic=topic)

    def _copying(self, peer: PeerLink, topic: str, own: Standby) -> bool:
        """Whether a copy of the topic's log to ``peer`` is still wanted (its link up, the topic still
        placed there, its own log the same)."""
        return peer.link is not None and self.placed.get(topic) is peer and self.own.get(topic) is own

    def still_needs(self, replica: str) -> set[str]:
        """The topics whose copies on ``replica`` must be kept: those placed there, and those not
        yet whole on another replica (placed nowhere, its link down, or still being sent the
        topic's unfinished messages). A replica lets go only of what is safe elsewhere: one that
        restarted while this node had set it aside, with no other candidate, holds the only copies."""
        out = set()
        for topic in {*self.placed, *self.own, *self._open, *(p.topic for p in self.unplaced)}:
            peer = self.placed.get(topic)
            if (peer is None or peer.candidate.address == replica or peer.link is None
                    or topic in peer.catching_up or peer.pending or topic in self._open):
                out.add(topic)
        return out

    def peer_lost(self, peer: PeerLink) -> None:
        """A replica's link failed: set it aside, place its topics anew, resend its unacked records."""
        if self.peers.get(peer.candidate.address) is peer:
            del self.peers[peer.candidate.address]
        peer.drop()
        self.choice.set_aside(peer.candidate.address, self.timeout)
        for topic in peer.topics:
            if self.placed.get(topic) is peer:
                del self.placed[topic]
        for p in peer.pending:
            p.number = 0
            self._place(p)
        peer.pending.clear()

    def candidates_changed(self) -> None:
        """New candidates: records no replica could take yet are placed now."""
        waiting, self.unplaced = self.unplaced, deque()
        for p in waiting:
            self._place(p)

    # -- the core's calls (IReplication) ----------------------------------------------------------

    def _own(self, topic: str) -> Standby | None:
        own = self.own.get(topic)
        if own is None and self._make_own is not None:
            own = self.own[topic] = self._make_own(topic)
            for channel, _ in self.channels_of(topic):
                own.channel(channel, False)
        return own

    def published(self, topic: str, values: Sequence[int], bodies: list[bytes], timestamp: int,
                  delay: float) -> Deferred[None]:
        messages = pub_messages(values, bodies, timestamp, delay)
        p = self._open.get(topic)
        if p is not None and p.size + len(messages) > OPEN_RECORD_BYTES:
            self._close_open(topic)  # full: these start the topic's next record
            p = None
        if p is None:
            self.peer_for(topic)  # placed (and its link asked for) now; the record at the turn's end
            p = self._open[topic] = Pending(topic, b"", self.clock.seconds())
            p.parts = []
            if self._own(topic) is not None:
                p.own_values, p.own_sizes = [], []
            if len(self._open) == 1:
                # the turn's records are closed and queued on their links at its end; each link's
                # own turn-end flush then writes them in the same pass on nsqtw's reactor
                self._at_turn_end(self._close_open)
        assert p.parts is not None
        p.parts.append(messages)
        if p.own_values is not None and p.own_sizes is not None:
            p.own_values.extend(values)
            p.own_sizes.extend(map(len, bodies))
        p.size += len(messages)
        p.count += len(bodies)
        p.publishes += 1
        d: Deferred[None] = Deferred()
        p.waiters.append(d)
        return d

    def _close_open(self, topic: str | None = None) -> None:
        """The open publishes (of ``topic`` only, if given) made records and given to their
        replicas, before anything else is sent about their topic or done to its own log.
        Everything about a topic calls this first (a FIN run too: with nothing open it returns
        at once)."""
        if not self._open:
            return
        if topic is None:
            opened, self._open = list(self._open.values()), {}
        else:
            one = self._open.pop(topic, None)
            if one is None:
                return
            opened = [one]
        for p in opened:
            parts = p.parts
            assert parts is not None
            p.parts = None
            messages = parts[0] if len(parts) == 1 else b"".join(parts)
            p.record = frame_pub(p.topic, p.count, messages)
            self._add_own(p, messages)
            self._place(p)

    def _add_own(self, p: Pending, messages: bytes) -> None:
        """A closed record's messages into its topic's own log (if it has one), one append for the
        turn's publishes.

        With ``--durable-delivery`` its publishers' OK waits for that write too: a restart replays
        the own log, and a replica told ``SYNCED`` lets go of what it does not name (usually
        written long before the ACK)."""
        values, sizes = p.own_values, p.own_sizes
        p.own_values = p.own_sizes = None
        own = self.own.get(p.topic)
        if own is None or values is None or sizes is None:
            return
        own.add(messages, values, sizes)
        if self.durable:
            written = own.disk.written()
            if not written.called:
                p.own_unwritten = True
                written.addBoth(p.own_written)

    def topic_stats(self, topic: str) -> dict[str, Any]:
        """``/stats``'s per topic ``replica``: where its copies go, and how far behind that is."""
        peer = self.placed.get(topic)
        if peer is None:
            return {"peer": None, "state": "none", "unacked": 0, "lag_ms": 0}
        open_ = self._open.get(topic)
        unacked = sum(p.publishes for p in peer.pending if p.topic == topic) + (open_.publishes if open_ else 0)
        state = "connecting" if peer.link is None else "catching_up" if topic in peer.catching_up else "in_sync"
        return {"peer": peer.candidate.address, "state": state,
                "unacked": unacked, "lag_ms": int(peer.lag(self.clock.seconds()) * 1000)}

    def own_failed(self, topic: str, failure: Failure) -> None:
        """The own log could not be written: it is not the whole story of the topic any more (said
        once: a full disk fails every publish's write)."""
        if topic not in self.incomplete:
            self.incomplete.add(topic)
            self.log.error("REPLICATION: {topic}'s own log could not be written - {error}; its replica keeps"
                           " every copy it holds from now on", topic=topic, error=failure.getErrorMessage())

    def _place(self, p: Pending) -> None:
        peer = self.peer_for(p.topic)
        if peer is None:
            self.unplaced.append(p)
        else:
            peer.send(p)

    def finished(self, topic: str, channel: str, ids: list[bytes]) -> None:
        self._close_open(topic)  # (first: the own log holds the turn's publishes before anything else)
        own = self.own.get(topic)
        if own is not None:
            own.finish(channel, ids)
        peer = self.placed.get(topic)
        if peer is not None:
            peer.send_now(encode_fin(topic, channel, ids))

    def send_json(self, topic: str, kind: Kind, value: dict[str, Any]) -> None:
        self._close_open(topic)
        peer = self.placed.get(topic)
        if peer is not None:
            peer.send_now(encode_json(kind, value))

    def channel_made(self, topic: str, channel: str, backlog: bool) -> None:
        self._close_open(topic)
        own = self.own.get(topic)
        if own is not None:
            own.channel(channel, backlog)
        self.send_json(topic, Kind.CHANNEL, {"topic": topic, "channel": channel, "backlog": backlog})

    def channel_gone(self, topic: str, channel: str) -> None:
        self._close_open(topic)
        own = self.own.get(topic)
        if own is not None:
            own.channel_gone(channel)
        self.send_json(topic, Kind.CHANNEL_GONE, {"topic": topic, "channel": channel})

    def emptied(self, topic: str, channel: str | None) -> None:
        self._close_open(topic)
        own = self.own.get(topic)
        if own is not None:
            own.empty(channel)
        self.send_json(topic, Kind.EMPTY, {"topic": topic, "channel": channel})

    def topic_gone(self, topic: str) -> None:
        self._close_open(topic)
        own = self.own.pop(topic, None)
        if own is not None:
            own.disk.remove()
        self.send_json(topic, Kind.TOPIC_GONE, {"topic": topic})
        peer = self.placed.pop(topic, None)
        if peer is not None:
            peer.topics.discard(topic)

    # -- every tick: waits and silences -----------------------------------------------------------

    def tick(self) -> None:
        for topic, own in self.own.items():
            own.maintain()
            if topic not in self.placed and self.choice.candidates:
                self.peer_for(topic)  # its replica was lost: the next one gets its copies
        now = self.clock.seconds()
        oldest = now - self.wait
        for peer in list(self.peers.values()):
            link = peer.link
            silent = link is not None and now - link.last_heard >= self.timeout / 3
            lagging = peer.pending and peer.pending[0].number and now - peer.pending[0].sent >= self.timeout / 3
            if silent or lagging:
                self.log.warn("REPLICATION({peer}): {why}, choosing another replica", peer=peer.candidate.address,
                              why="silent" if silent else "not acking")
                self.peer_lost(peer)
            elif (link is None and peer.up_since is None and peer.pending
                  and now - peer.pending[0].sent >= self.timeout / 3):
                self.peer_lost(peer)  # never connected
            # (not in publish order: a lost replica's records were handed on behind newer ones)
            for p in peer.pending:
                if p.waiters and p.since <= oldest:
                    self._refuse(p)
        if self.unplaced and any(p.since <= oldest for p in self.unplaced):
            waiting: deque[Pending] = deque()
            for p in self.unplaced:
                if p.since <= oldest:
                    self._refuse(p)
                    self.unreplicated += 1  # no replica took it: it stays on this node alone
                else:
                    waiting.append(p)
            self.unplaced = waiting

    def _refuse(self, p: Pending) -> None:
        for d in p.waiters:
            if not d.called:
                self.refused += 1
                d.errback(ReplicaError("no replica acknowledged it"))
        p.waiters = []

    def stop(self) -> None:
        self._close_open()
        for peer in list(self.peers.values()):
            peer.say_bye()
        for p in self.unplaced:
            self._refuse(p)
        for peer in self.peers.values():
            for p in peer.pending:
                self._refuse(p)
