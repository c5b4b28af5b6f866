"""``--replicas=2`` as one service: the owner's side, the replica's side, and what ties them to the node.

Installed only with ``--replicas=2``: with the default the node has no
replication object and every byte it sends is Go nsqd's. The core calls
it through :class:`~nsqtw.interfaces.IReplication` (``NSQD.replication``):
on each publish of a topic that is not ``#ephemeral`` and on each FIN; it
listens to the registry for channels and topics coming and going; the HTTP
API asks it for ``GET /replication`` and the link's upgrade.

The replica's side takes links from owners (:meth:`ReplicationService.upgrade`), holds
their copies (:class:`~nsqtw.replica.standby.Standby`), makes the owner's topic and channels
here as real ones (so lookupd lists this node as their producer before it is ever needed),
and takes over an owner whose link has been down or silent for ``--replica-timeout`` and
whose ``/ping`` fails too, or at once when it comes back with another incarnation (its data
directory is gone).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from functools import partial
from typing import Any, Final
from urllib.parse import urlencode

from twisted.application.service import Service
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.task import LoopingCall
from twisted.python.failure import Failure
from zope.interface import implementer

from nsqtw import NSQD_VERSION
from nsqtw.core.nsqd import all_of
from nsqtw.interfaces import IDiskExecutor, IReplication
from nsqtw.log import Logger
from nsqtw.names import is_ephemeral
from nsqtw.replica.choice import Choice, http_get
from nsqtw.replica.disklog import STANDBY_SUFFIX, StandbyLog, log_prefix
from nsqtw.replica.journal import Entry, Found, parse_entries, read_logs, remove_files
from nsqtw.replica.link import Link, accept_nonces, accepted_link, beat_interval
from nsqtw.replica.notice import Notices, is_notice, notes_info, read_notes
from nsqtw.replica.owner import OwnerSide
from nsqtw.replica.ownerstate import INCARNATION_FILE, OwnerState, incarnation_of
from nsqtw.replica.proof import read_secret
from nsqtw.replica.records import (
    Kind,
    decode_fin,
    decode_json,
    decode_snap,
    decode_snap_ids,
    encode_ack,
    encode_json,
    encode_need,
    select_messages,
    split_pub,
)
from nsqtw.replica.standby import Standby, unheld
from nsqtw.replica.stopped import read_stopped, save_own_logs

__all__ = ["INCARNATION_FILE", "ReplicationService", "incarnation_of"]  # (the first and last: ownerstate.py)

#: seconds between the checks of waits, silences and lost owners
TICK: Final = 0.25
#: seconds between the questions to an owner whose link is down: which incarnation runs there now?
ASK_EVERY: Final = 1.0
#: version of the link's records (2: SNAP_IDS and NEED; an owner sends SNAP_IDS to a replica of 2 only)
VERSION: Final = 2


@implementer(IReplication)
class ReplicationService(Service):
    """The node's replication: see the module's docstring."""

    log = Logger()

    def __init__(self, nsqd: Any, reactor: Any, options: Any, lookupd_addresses: Callable[[], list[str]],
                 data_path: str, executor: Callable[[], IDiskExecutor]) -> None:
        self.nsqd = nsqd
        #: the disk lane the standbys' logs are written on (asked for once the node's disk threads run)
        self._executor = executor
        self._lane: IDiskExecutor | None = None
        self.durable = bool(options.durable_delivery)
        #: per owner link: the ACK of its last read, once its records are written (--durable-delivery)
        self._acking: dict[Link, Deferred[None]] = {}
        #: the owners' links not read while the standbys' unwritten bytes are over the node's bound
        self._paused: set[Link] = set()
        self.reactor = reactor
        self.options = options
        self.data_path = data_path
        self.timeout = float(options.replica_timeout)
        self.wait = float(options.replica_wait)
        #: the cluster's replica secret that links prove (``--replica-secret-file``), None: not asked
        self.secret = read_secret(options.replica_secret_file) if options.replica_secret_file else None
        self.incarnation = ""
        self.choice = Choice(reactor, self.own_address, "", lookupd_addresses)
        self.owner = OwnerSide(reactor, self.choice, self.own_address, self.hello, self._channels_of,
                               self.timeout, self.wait, self._own_log, durable=self.durable, secret=self.secret)
        #: standbys a start found taken over part way (taken over again once the node runs)
        self._retake: list[Standby] = []
        self.choice.changed = self._candidates_changed
        self.choice.answered = lambda answers, failed: self.notices.peers_answered(answers, failed, self.incarnation)
        #: what takeovers here delivered, for owners that come back on their disks
        self.notices = Notices(reactor, data_path, self._executor_lane, self.hello, self.timeout, self.secret)
        #: owner name -> what this node holds for it
        self.owners: dict[str, OwnerState] = {}
        self.takeovers = 0
        #: IDs of this node's messages a replica said it delivered while this node was away
        self.taken_elsewhere = 0
        #: standby logs made by this process (each log's files are named with its number)
        self._logs = 0
        #: this read's standby writes (--durable-delivery: its ACK waits for them)
        self._writes: list[Deferred[None]] = []
        self._tick = LoopingCall(self.tick)
        self._tick.clock = reactor
        nsqd.replication = self
        nsqd.listeners.append(self)

    # -- service ----------------------------------------------------------------------------------

    async def recover(self) -> None:
        """Before the node serves: the logs a previous process left in the data directory, read on
        the disk lane and replayed (:meth:`Standby.restore`). Standbys are held again for their
        owners (whose silence, ``/ping`` and incarnation decide as before); own logs come back with
        ``--durable-delivery``, without it after a clean stop only (:mod:`nsqtw.replica.stopped`); a
        standby whose takeover had begun is taken over again (:meth:`startService`). A replicated
        topic here without its own log back is :attr:`OwnerSide.incomplete`."""
        lane = self._executor_lane()
        stopped = await lane.submit(read_stopped, self.data_path)
        found: Found = await lane.submit(read_logs, self.data_path, STANDBY_SUFFIX)
        strays = list(found.strays)
        standbys = owns = messages = 0
        for files in found.logs:
            self._logs = max(self._logs, files.number)
            entries = parse_entries(files.journal or b"")
            try:
                meta = json.loads(entries[0][2]) if entries and entries[0][0] == Entry.META else None
            except ValueError:
                meta = None
            if not isinstance(meta, dict):
                meta = None
            own_gone = meta is not None and meta.get("role") == "own" and (
                meta.get("topic") not in self.nsqd.topics  # (deleted just before a crash)
                or not self.durable and (stopped is None or meta.get("topic") in stopped))
            if meta is None or own_gone:
                strays += files.names
                continue
            try:
                owner, topic, role = str(meta["owner"]), str(meta["topic"]), str(meta["role"])
                log = self._log(files.prefix, meta, topic if role == "own" else None)
                standby = Standby.restore(owner, topic, log, files)
            except Exception as e:  # noqa: BLE001 - one log that cannot be read stops no start
                self.log.error("REPLICATION: {prefix} cannot be read back - {error}; its files are left as they are",
                               prefix=files.prefix, error=repr(e))
                continue
            messages += len(standby)
            if role == "own":
                owns += 1
                old = self.owner.own.get(topic)
                if old is not None:
                    old.disk.remove()
                self.owner.own[topic] = standby
                continue
            standbys += 1
            state = self.owners.get(owner)
            if state is None:
                state = self.owners[owner] = OwnerState(owner)
                state.incarnation = str(meta.get("incarnation") or "")
                state.host = str(meta.get("host") or "")
                state.http_port = int(meta.get("http_port") or 0)
                state.started = float(meta.get("started") or 0)
            local = self.nsqd.get_topic(topic)  # real ones here, as for copies that came by link
            for name in standby.channels:
                local.get_channel(name)
            if standby.taken_over:
                self._retake.append(standby)
            elif role == "main" and topic not in state.standbys:
                state.standbys[topic] = standby
            else:
                state.parts.setdefault(topic, []).append(standby)
        if strays:
            await lane.submit(remove_files, [os.path.join(self.data_path, name) for name in strays])
        self.notices.held_again(self.owners, await lane.submit(read_notes, self.data_path))
        self.notices.hold(self.nsqd)
        self.owner.incomplete.update(name for name, t in self.nsqd.topics.items()
                                     if not t.ephemeral and name not in self.owner.own)
        if found.logs or strays:
            self.log.info("REPLICATION: {standbys} standby log(s) and {owns} own log(s) of a previous run read back"
                          " ({messages} unfinished messages); {strays} file(s) of none removed",
                          standbys=standbys, owns=owns, messages=messages, strays=len(strays))

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self.incarnation = incarnation_of(self.data_path)
        self.choice.own_incarnation = self.incarnation
        self.log.info("REPLICATION: --replicas=2, incarnation {incarnation}: a publish is answered once a"
                      " peer holds its copy", incarnation=self.incarnation)
        self.notices.start()  # (before the first read of lookupd, whose answers may end its hold)
        self.choice.start()
        self._tick.start(TICK, now=False)
        retake, self._retake = self._retake, []
        for standby in retake:
            self.log.warn("REPLICATION({owner}): the takeover of {topic} was cut short by a stop: taking it over"
                          " again", owner=standby.owner, topic=standby.topic)
            self._hand_in(standby)

    def stopService(self) -> None:
        super().stopService()  # type: ignore[no-untyped-call]
        self.notices.stop()
        if self._tick.running:
            self._tick.stop()
        self.choice.stop()
        self.owner.stop()
        for state in self.owners.values():
            if state.link is not None:
                state.link.abort()
            for standby in state.all_held():
                standby.disk.flush()
        for own in self.owner.own.values():
            own.disk.flush()

    async def closed(self) -> None:
        """After the node closed: without --durable-delivery, the own logs written whole for the next
        start to read back (:mod:`nsqtw.replica.stopped`)."""
        if not self.durable:
            await save_own_logs(self._executor_lane(), self.data_path, self.owner.own.values(), self.owner.incomplete,
                                self.reactor)

    def lookupd_identified(self) -> None:
        """A lookupd answered this node's IDENTIFY: its /nodes read now, not at the next poll (the
        candidates, and the end of a start's hold, a second sooner)."""
        if self.running:
            self.choice.poll()

    def own_address(self) -> str:
        o = self.options
        return f"{o.broadcast_address}:{o.broadcast_http_port or self.nsqd.http_port}"

    def hello(self) -> dict[str, Any]:
        return {"node": self.own_address(), "incarnation": self.incarnation,
                "http_port": self.options.broadcast_http_port or self.nsqd.http_port,
                "started": self.nsqd.start_time_precise, "durable": bool(self.options.durable_delivery),
                "version": VERSION}

    def info(self, replica: str | None = None, owner: str | None = None) -> dict[str, Any]:
        """``GET /replication``; with ``replica``, also the topics that node must keep holding copies
        of (a replica that lost its link asks, and lets go of the others): see
        :meth:`OwnerSide.still_needs`; with ``owner``, the notes kept for it (:func:`notes_info`)."""
        out: dict[str, Any] = {"version": VERSION, "nsqd_version": NSQD_VERSION, "node": self.own_address(),
                               "incarnation": self.incarnation, "replicas": 2,
                               **(notes_info(self.owners.get(owner)) if owner is not None else {})}
        if replica is not None:
            out["topics"] = sorted(self.owner.still_needs(replica))
        return out

    def _channels_of(self, topic: str) -> list[tuple[str, bool]]:
        t = self.nsqd.topics.get(topic)
        if t is None:
            return []
        return [(name, False) for name in t.channels if not is_ephemeral(name)]

    # -- IReplication: the core's calls -------------------------------------------------------------

    def published(self, topic: str, values: Any, bodies: list[bytes], timestamp: int, delay: float) -> Deferred[None]:
        return self.owner.published(topic, values, bodies, timestamp, delay)

    def finished(self, topic: str, channel: str, ids: list[bytes]) -> None:
        if not is_ephemeral(channel):
            self.owner.finished(topic, channel, ids)

    # -- the registry (IRegistryListener) -----------------------------------------------------------

    def topic_created(self, topic: Any) -> None:
        if not topic.ephemeral:
            self.owner.peer_for(topic.name)

    def _candidates_changed(self) -> None:
        """Topics no replica could be chosen for are placed now, then their waiting records."""
        for name, topic in list(self.nsqd.topics.items()):
            if not topic.ephemeral:
                self.owner.peer_for(name)
        self.owner.candidates_changed()

    def topic_deleted(self, topic: Any) -> None:
        if not topic.ephemeral:
            self.owner.topic_gone(topic.name)

    def channel_created(self, topic: Any, channel: Any) -> None:
        if topic.ephemeral or channel.ephemeral:
            return
        # the topic's messages not yet handed out go to the new channel too: it owes them
        backlog = bool(topic.depth()) or not topic.channels or len(topic.channels) == 1
        self.owner.channel_made(topic.name, channel.name, backlog)

    def channel_deleted(self, topic: Any, channel: Any) -> None:
        if not (topic.ephemeral or channel.ephemeral):
            self.owner.channel_gone(topic.name, channel.name)

    def channel_emptied(self, topic: str, channel: str | None) -> None:
        self.owner.emptied(topic, channel)

    # -- the replica's side ---------------------------------------------------------------------------

    def upgrade(self, head: bytes) -> tuple[Callable[[Any], Link], list[bytes]]:
        """A link asked of this node's HTTP port (an owner's, or a notice): its maker, the 101's nonce line."""
        nonces, lines = accept_nonces(head)
        return partial(self.accept, nonces=nonces), lines

    def accept(self, transport: Any, nonces: tuple[bytes, bytes] = (b"", b"")) -> Link:
        return accepted_link(self, self.reactor, transport, beat_interval(self.timeout), self.secret, nonces)

    def link_up(self, link: Link) -> None:
        link.send(encode_json(Kind.HELLO, self.hello()))

    def link_record(self, link: Link, kind: int, payload: bytes) -> None:
        if kind == Kind.HELLO:
            self._hello(link, decode_json(payload))
            return
        if link.hello is not None and link.hello.get("role") == "notice":
            self.taken_elsewhere += self.notices.notice_record(self.nsqd, link, kind, payload)
            return
        state = self._state_of(link)
        if state is None:
            raise ValueError(f"record {kind} before HELLO")
        if kind == Kind.PUB:
            topic, data, values, sizes = split_pub(payload)
            state.touched.add(topic)
            standby = self._standby(state, topic)
            standby.add(data, values, sizes)
            self._keep(standby)
        elif kind == Kind.SNAP:
            topic, owing, data, values, sizes = decode_snap(payload)
            state.touched.add(topic)
            self._snap(state, topic, owing, data, values, sizes)
        elif kind == Kind.SNAP_IDS:  # held ones confirmed as a SNAP's are; the others asked for
            topic, owing, values = decode_snap_ids(payload)
            state.touched.add(topic)
            if lacking := unheld(state.held(topic), values, owing):
                link.send(encode_need(topic, lacking))
        elif kind == Kind.FIN:
            topic, channel, ids = decode_fin(payload)
            state.touched.add(topic)
            for standby in state.held(topic):
                standby.finish(channel, ids)
        elif kind == Kind.CHANNEL:
            value = decode_json(payload)
            topic, channel = str(value["topic"]), str(value["channel"])
            state.touched.add(topic)
            self._standby(state, topic)
            for standby in state.held(topic):
                standby.channel(channel, bool(value.get("backlog")))
            self.nsqd.get_topic(topic).get_channel(channel)
        elif kind == Kind.CHANNEL_GONE:
            value = decode_json(payload)
            for standby in state.held(str(value["topic"])):
                standby.channel_gone(str(value["channel"]))
        elif kind == Kind.EMPTY:
            value = decode_json(payload)
            emptied = value.get("channel")
            for standby in state.held(str(value["topic"])):
                standby.empty(None if emptied is None else str(emptied))
        elif kind == Kind.TOPIC_GONE:
            value = decode_json(payload)
            topic = str(value["topic"])
            for standby in state.held(topic):
                standby.disk.remove()
            state.standbys.pop(topic, None)
            state.parts.pop(topic, None)
        elif kind == Kind.SYNCED:
            value = decode_json(payload)
            topic = str(value["topic"])
            state.touched.add(topic)
            gone = sum(standby.synced(bool(value.get("complete"))) for standby in state.held(topic))
            if gone:
                self.log.info("REPLICATION({owner}): {count} message(s) of {topic} it finished while its link was"
                              " down let go of", owner=state.name, count=gone, topic=topic)
        elif kind == Kind.BYE:
            state.said_bye = True

    def _keep(self, standby: Standby) -> None:
        """A standby was written to: with --durable-delivery this read's ACK waits for its write (a
        failure closes the link: :meth:`_not_written`)."""
        if self.durable:
            self._writes.append(standby.disk.written())

    def _snap(self, state: OwnerState, topic: str, owing: list[str], data: bytes, values: list[int],
              sizes: list[int]) -> None:
        """Messages of the owner's topic from before this node held its copies: those not held yet go
        to a standby of their own (its IDs stay in order), owed by the channels the owner named."""
        held = state.held(topic)
        lacking = set(unheld(held, values, owing))
        fresh = [i for i, v in enumerate(values) if v in lacking]
        if not fresh:
            return
        if len(fresh) < len(values):
            data = select_messages(data, {values[i] for i in fresh})  # (a record's IDs are unique)
            values = [values[i] for i in fresh]
            sizes = [sizes[i] for i in fresh]
        self._standby(state, topic)  # the topic and its producer registration
        parts = state.parts.setdefault(topic, [])
        if not parts or parts[-1].arrivals and parts[-1].values and parts[-1].values[-1] >= values[0]:
            parts.append(self._new_standby(state.name, topic, "part", state))
            for name in state.held(topic)[0].channels:
                parts[-1].channel(name, False)
        parts[-1].add_snapshot(data, values, sizes, owing)
        self._keep(parts[-1])

    def link_read(self, link: Link) -> None:
        """One ACK per read of a link: once its records are in this process, or, with
        --durable-delivery, on this disk (after the ACKs before it)."""
        number = link.received
        writes, self._writes = self._writes, []
        if not writes and link not in self._acking:
            link.send(encode_ack(number))
        else:
            before = self._acking.get(link)
            waits = writes if before is None else [before, *writes]
            acked = all_of(waits)
            self._acking[link] = acked
            acked.addCallbacks(self._ack, self._not_written, callbackArgs=(link, number, acked),
                               errbackArgs=(link, acked))
        transport: Any = link.transport
        if self.nsqd.unwritten.over() and transport is not None:
            # the disk is behind: read no more of any owner until it catches up (owners wait for
            # ACKs, then choose another replica after a third of --replica-timeout)
            transport.pauseProducing()
            if not self._paused:
                self.nsqd.unwritten.when_under().addBoth(self._resume)
            self._paused.add(link)

    def _ack(self, _: object, link: Link, number: int, acked: Deferred[None]) -> None:
        if self._acking.get(link) is acked:
            del self._acking[link]
        if not link.closed:
            link.send(encode_ack(number))

    def _not_written(self, failure: Any, link: Link, acked: Deferred[None]) -> None:
        if self._acking.get(link) is acked:
            del self._acking[link]
        self.log.error("REPLICATION: a standby could not be written - {error}; closing the link from {peer}",
                       error=failure.getErrorMessage(), peer=link.peer_text())
        link.abort()

    def _resume(self, _: object) -> None:
        paused, self._paused = self._paused, set()
        for link in paused:
            transport: Any = link.transport
            if not link.closed and transport is not None:
                transport.resumeProducing()

    def link_lost(self, link: Link, reason: str) -> None:
        if link.hello is not None and link.hello.get("role") == "notice":
            self.notices.notice_lost(link)
        state = self._state_of(link)
        if state is not None and state.link is link:
            state.link = None
            if state.standbys:
                self.log.warn("REPLICATION({owner}): owner's link lost - {reason}; taking over its"
                              " {count} topic(s) if it stays away {timeout}s", owner=state.name,
                              reason=reason, count=len(state.standbys), timeout=self.timeout)

    def _state_of(self, link: Link) -> OwnerState | None:
        hello = link.hello
        return None if hello is None or hello.get("role") == "notice" else self.owners.get(str(hello["node"]))

    def _hello(self, link: Link, hello: dict[str, Any]) -> None:
        name = str(hello["node"])
        incarnation = str(hello["incarnation"])
        if incarnation == self.incarnation:
            raise ValueError("a link from this node itself")
        link.hello = hello
        if is_notice(hello, self.incarnation):  # a replica that took over here, with what it delivered
            return
        state = self.owners.get(name)
        if state is None:
            state = self.owners[name] = OwnerState(name)
        elif state.incarnation and state.incarnation != incarnation and (state.standbys or state.notes):
            self._replaced(state, incarnation)
        elif (state.standbys and state.started and float(hello.get("started") or 0) != state.started
              and not state.said_bye and not hello.get("durable")):
            # killed, and back on its disk: what it held only in memory is gone there, and the
            # copies here cannot tell which; delivered from here (duplicates, never a loss)
            self.log.warn("REPLICATION({owner}): restarted after a crash without --durable-delivery:"
                          " taking over the copies held for it", owner=name)
            self._take_over(state)
        if state.notes and state.notes_for == incarnation:
            state.noted_at = 0.0  # back on its disk after a takeover here: told at the next tick
        if state.link is not None and state.link is not link:
            state.link.abort()
        for standby in state.all_held():
            standby.begin_sync()  # (FINs that went while it had no link here never came)
        state.link = link
        state.linked_at = self.reactor.seconds()
        state.touched = set()
        state.placement_asked = False
        state.incarnation = incarnation
        peer = link.transport.getPeer() if link.transport is not None else None
        state.host = str(getattr(peer, "host", ""))
        state.http_port = int(hello.get("http_port") or 0)
        state.silent_since = None
        state.started = float(hello.get("started") or 0)
        state.said_bye = False

    def _executor_lane(self) -> IDiskExecutor:
        if self._lane is None:
            self._lane = self._executor()
        return self._lane

    def _new_standby(self, owner: str, topic: str, role: str, state: OwnerState | None = None) -> Standby:
        # a log of its own: one being taken over (and removed after) may still have this name's files
        self._logs += 1
        meta: dict[str, Any] = {"owner": owner, "topic": topic, "role": role}
        if state is not None:
            meta.update(incarnation=state.incarnation, host=state.host, http_port=state.http_port,
                        started=state.started)
        log = self._log(f"{log_prefix(owner, topic)}.{self._logs}", meta, topic if role == "own" else None)
        return Standby(owner, topic, log)

    def _log(self, prefix: str, meta: dict[str, Any], own: str | None) -> StandbyLog:
        """A log's files (the node's own log of topic ``own``, or a standby's): its bytes count in
        the node's unwritten bytes until written; a failed write is logged (an own log's marks its
        topic incomplete: :meth:`OwnerSide.own_failed`)."""
        on_failed = self._write_failed if own is None else partial(self.owner.own_failed, own)
        # without --durable-delivery an own log's journal is written at a clean stop only (stopped.py)
        return StandbyLog(self.data_path, prefix, self._executor_lane(), self.durable, self.reactor, meta,
                          journal=own is None or self.durable, unwritten=self.nsqd.unwritten, on_failed=on_failed)

    def _own_log(self, topic: str) -> Standby:
        """This node's own log of a topic's unfinished messages (a new replica is sent them)."""
        return self._new_standby("self", topic, "own")

    def _write_failed(self, failure: Failure) -> None:
        self.log.error("REPLICATION: a log write failed - {error}", error=failure.getErrorMessage())

    def _standby(self, state: OwnerState, topic: str) -> Standby:
        standby = state.standbys.get(topic)
        if standby is None or standby.taken_over:
            standby = state.standbys[topic] = self._new_standby(state.name, topic, "main", state)
            self.nsqd.get_topic(topic)  # a real topic here: lookupd lists this node as its producer
        return standby

    # -- every tick: the owner's waits; lost owners --------------------------------------------------

    def tick(self) -> None:
        self.owner.tick()
        now = self.reactor.seconds()
        for state in list(self.owners.values()):
            self.notices.tick(state, now, ASK_EVERY)
            for standby in state.standbys.values():
                standby.maintain()
            for topic, parts in list(state.parts.items()):
                for part in parts:
                    part.maintain()
                left = [p for p in parts if len(p) or p.disk.segments]
                if len(left) < len(parts):
                    for gone in parts:
                        if gone not in left:
                            gone.disk.remove()
                    state.parts[topic] = left
            if not (state.standbys or state.parts) or state.probing:
                continue
            link = state.link
            if link is not None and now - link.last_heard < self.timeout:
                state.silent_since = None
                if (not state.placement_asked and now - state.linked_at >= self.timeout
                        and any(t not in state.touched for t in {*state.standbys, *state.parts})):
                    # linked for another topic, yet silent about these for T: it may have placed
                    # them elsewhere while it had no link here (FINs go there now), so asked once
                    state.placement_asked = True
                    ensureDeferred(self._still_wanted(state, link))
                continue
            if link is None and not state.asking and now - state.asked >= ASK_EVERY:
                state.asking = True
                state.asked = now
                ensureDeferred(self._ask_incarnation(state))
            if state.silent_since is None:
                state.silent_since = now if link is None else link.last_heard
            if now - state.silent_since >= self.timeout:
                state.probing = True
                ensureDeferred(self._probe(state))

    async def _ask_incarnation(self, state: OwnerState) -> None:
        """The owner's link is down: which data directory does its address run on now? A node back
        there with another incarnation lost its data (a machine replaced), and its copies are
        delivered from here at once, as when its ``HELLO`` says so; it need not link here again
        first (it may choose another replica), nor stay silent for ``--replica-timeout``. No answer,
        or the same incarnation: nothing (a silence of ``T`` and the ``/ping`` still decide)."""
        try:
            code, body = await http_get(self.reactor, f"http://{state.host}:{state.http_port}/replication", 1.0)
            incarnation = str(json.loads(body).get("incarnation") or "") if code == 200 else ""
        except Exception:  # noqa: BLE001 - no answer (or not an nsqtw node's): the silence decides
            incarnation = ""
        finally:
            state.asking = False
        if (incarnation and state.incarnation and incarnation != state.incarnation and state.link is None
                and (state.standbys or state.parts)):
            self._replaced(state, incarnation)

    def _replaced(self, state: OwnerState, incarnation: str) -> None:
        """The owner's address runs another incarnation (its HELLO or its /replication says so): its
        data directory is gone, so what is held for it is delivered from here now."""
        self.log.warn("REPLICATION({owner}): back without its data (incarnation {old} now {new}):"
                      " taking over", owner=state.name, old=state.incarnation, new=incarnation)
        self._take_over(state, note=False)
        state.incarnation = incarnation
        if state.notes and state.notes_for != incarnation:
            self.notices.forget(state, "back without its data")  # (what it held went with it)

    async def _probe(self, state: OwnerState) -> None:
        """The owner's link is silent for the timeout: one /ping decides (a broken link alone is
        not a lost node)."""
        try:
            try:
                code, _ = await http_get(self.reactor, f"http://{state.host}:{state.http_port}/ping", 1.0)
                alive = code == 200
            except Exception:  # noqa: BLE001 - no answer: lost
                alive = False
            if alive:
                now = state.silent_since = self.reactor.seconds()
                link = state.link
                if link is not None and now - link.last_heard >= self.timeout:
                    # alive, yet nothing came on its link for T: that link is dead (the owner drops
                    # a link silent for T/3, and beats every second) though nothing closed it, as
                    # when the network between them drops packets. Closed here, so the owner is
                    # asked below which topics it still holds here, as after a link that closed
                    self.log.warn("REPLICATION({owner}): its link has been silent for {timeout}s though it"
                                  " answers /ping: closing the link", owner=state.name, timeout=self.timeout)
                    link.abort()
                    state.link = None
                await self._still_wanted(state)
                return
            self.log.warn("REPLICATION({owner}): silent for {timeout}s and /ping fails: taking over",
                          owner=state.name, timeout=self.timeout)
            if state.link is not None:
                state.link.abort()
            self._take_over(state)
        finally:
            state.probing = False

    async def _still_wanted(self, state: OwnerState, link: Link | None = None) -> None:
        """The owner is alive but has not linked here for ``T``: it chose another replica (this one
        was slow, or a split healed). Its topics placed elsewhere now are let go of, so a later loss
        of the owner is not delivered twice. With its ``link`` up (for other topics): the topics it
        said nothing of on that link and does not place here are let go of (one it places here
        again meanwhile brings a record first: kept)."""
        url = (f"http://{state.host}:{state.http_port}/replication?"
               f"{urlencode({'replica': self.own_address()})}")
        try:
            code, body = await http_get(self.reactor, url, 1.0)
            wanted = set(json.loads(body)["topics"]) if code == 200 else None
        except Exception:  # noqa: BLE001 - no answer: ask again after the next timeout
            return
        if wanted is None or state.link is not link:
            return
        spoken = state.touched if link is not None else set()
        for topic in [t for t in {*state.standbys, *state.parts} if t not in wanted and t not in spoken]:
            self.log.info("REPLICATION({owner}): its copies of {topic} are held elsewhere now: letting go",
                          owner=state.name, topic=topic)
            for standby in state.held(topic):
                standby.disk.remove()
            state.standbys.pop(topic, None)
            state.parts.pop(topic, None)

    def _take_over(self, state: OwnerState, note: bool = True) -> None:
        """Hand in every copy held for the owner; ``note``: the owner may come back on its disk, so
        what is handed in is written down for it first (:mod:`nsqtw.replica.notice`)."""
        standbys = state.all_held()
        state.standbys, state.parts = {}, {}
        noted = note and self.notices.begin(state)
        for standby in standbys:
            self._hand_in(standby, state if noted and not is_ephemeral(standby.topic) else None)

    def _hand_in(self, standby: Standby, state: OwnerState | None = None) -> None:
        """One standby taken over; ``state``: its owner, told what went in if it comes back on its disk."""
        self.takeovers += 1
        copy = None if is_ephemeral(standby.topic) else partial(self.owner.taken_over, standby.topic)
        noted = None if state is None else partial(self.notices.add, state, standby.topic)
        d = standby.take_over(self.nsqd, copy, noted).addCallbacks(self._took_over, lambda f: None, (standby,))
        if state is not None:
            d.addBoth(lambda _: self.notices.save(state))

    def _took_over(self, count: int, standby: Standby) -> None:
        self.log.info("REPLICATION({owner}): took over {topic}: {count} messages handed to its channels here",
                      owner=standby.owner, topic=standby.topic, count=count)
        if count and not is_ephemeral(standby.topic):
            self.owner.recopy(standby.topic)  # two copies again: this node's replica gets them

    # -- shown -------------------------------------------------------------------------------------

    def topic_stats(self, topic: str) -> dict[str, Any]:
        return self.owner.topic_stats(topic)

    def node_stats(self) -> dict[str, Any]:
        standby = [{"owner": s.owner, "topic": s.topic, "messages": len(s), "bytes": s.live_bytes,
                    "disk_bytes": s.disk.bytes(), "taken_over": s.taken_over}
                   for state in self.owners.values() for s in state.all_held()]
        return {"replica_refused": self.owner.refused, "unreplicated": self.owner.unreplicated,
                "takeovers": self.takeovers, "taken_elsewhere": self.taken_elsewhere,
                "notes_waiting": sum(state.noted for state in self.owners.values()), "standby": standby}
