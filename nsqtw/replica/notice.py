"""After a takeover: telling the owner, back on its disk, which of its messages were delivered elsewhere.

A replica that takes over hands every copy it holds into its own channels
(:meth:`~nsqtw.replica.standby.Standby.take_over`). An owner that was only
away (a kill -9 with ``--durable-delivery``, a machine rebooted, a network
split) still holds the same messages on its disk: without a word from the
replica it would deliver all of them a second time. So the takeover also
writes down, per channel, the owner's IDs it really handed in (a segment
it could not read names none of its messages), as ``TAKEN`` records
(:meth:`Notices.add`) for the owner's incarnation of then; the file outlives
the replica's process (:func:`notes_file`, :func:`read_notes`). While any
are kept, the replica asks the owner's ``/replication`` every second: the
same incarnation answering means the owner is back on its disk, and the
notes go to it on a short link of their own (:func:`send_notice`, a
``HELLO`` whose ``role`` is ``notice``); once it acknowledges them they
are forgotten. Another incarnation answering means the owner's data is
gone with what it held: the notes are dropped. The owner leaves those
messages out as they leave its queues (``Channel.drop_taken``). So that
the notes come before it delivers any of them, a node with
``--replicas=2`` holds the delivery of the topics it finds at its start
(:meth:`Notices.hold`) until the replicas have said whether they hold notes
for it: its first read of lookupd asks every node ``GET /replication?owner=``
(:class:`~nsqtw.replica.choice.Choice`), whose answer names the incarnation
its notes are for (:func:`notes_info`). None for this incarnation: the
delivery starts at once; some: once all the notes of each of those
replicas have come (a notice link's ``HELLO`` says how many records it
carries: one that breaks before they came keeps the hold, and the replica
sends them again), :data:`HOLD_MAX` seconds after the start at most.
Lookupd not read: :data:`HOLD` seconds, as it cannot tell.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any, Final

from twisted.internet.defer import Deferred, ensureDeferred

from nsqtw.interfaces import IDiskExecutor
from nsqtw.log import Logger
from nsqtw.replica.choice import http_get
from nsqtw.replica.journal import remove_files
from nsqtw.replica.link import Link, beat_interval, open_link
from nsqtw.replica.ownerstate import OwnerState
from nsqtw.replica.records import Kind, decode_ack, decode_fin, encode_json, encode_taken, frame, split_records
from nsqtw.storage.atomic import atomic_write

__all__ = ["HOLD", "HOLD_MAX", "NOTES_KEPT", "NOTES_SUFFIX", "NOTE_IDS", "Notices", "notes_file", "notes_path",
           "is_notice", "notes_info", "read_notes", "send_notice", "taken_elsewhere", "taken_records"]

#: a file of notes for one owner: ``<owner, made file-safe>.nsqtw.taken``
NOTES_SUFFIX: Final = ".nsqtw.taken"
#: IDs per TAKEN record at most (1.6 MB of record)
NOTE_IDS: Final = 100_000
#: seconds notes are kept for an owner that does not come back (a machine lost for good, or replaced
#: at another address): then they are dropped, and the owner's return costs duplicates, never a loss
NOTES_KEPT: Final = 24 * 3600.0
#: seconds a start holds the delivery of the topics it found (:meth:`Notices.hold`) while no lookupd
#: says which nodes to ask: a replica that took them over asks the owner's ``/replication`` every
#: second, then sends its notes at once
HOLD: Final = 3.0
#: seconds at most a start waits for the notes of the replicas that said they hold some for it
HOLD_MAX: Final = 10.0

_log = Logger(namespace="nsqtw.replica.notice")


class Notices:
    """A replica's notes to the owners it took over (see the module)."""

    log = Logger()

    def __init__(self, reactor: Any, data_path: str, lane: Callable[[], IDiskExecutor],
                 hello: Callable[[], dict[str, Any]], timeout: float, secret: bytes | None = None) -> None:
        self.reactor = reactor
        self.secret = secret
        self.data_path = data_path
        self.lane = lane
        self.hello = hello
        self.timeout = timeout
        self._holding: list[Any] = []
        self._holding_topics: list[Any] = []
        self._release: Any = None
        self._held_at = 0.0
        #: the replicas whose notes a start still waits for (None: no lookupd read yet), and the
        #: notice links that ended meanwhile (notes may come before the answer that names them)
        self._awaited: set[str] | None = None
        self._told: set[str] = set()
        #: the notes read so far on each notice link open to this node
        self._read: dict[Link, int] = {}

    def hold(self, nsqd: Any) -> None:
        """At a start, before the node serves: the channels of the topics it found deliver nothing
        for :data:`HOLD` seconds once it runs (:meth:`start`), and a topic found without channels
        copies nothing to one made meanwhile, so that a replica that took them over while this node
        was away has asked its ``/replication`` and said what it delivered."""
        self._holding = [c for t in nsqd.topics.values() if not t.ephemeral for c in t.channels.values()]
        for channel in self._holding:
            channel.held = True
        # a topic without channels copies nothing to those made meanwhile (a consumer's SUB)
        self._holding_topics = [t for t in nsqd.topics.values() if not t.ephemeral and not t.channels]
        for topic in self._holding_topics:
            topic.held_for_notes = True

    def start(self) -> None:
        if self._holding or self._holding_topics:
            self.log.info("REPLICATION: delivery of {count} channel(s) and {topics} topic(s) without one held"
                          " until the replicas have said whether they delivered any of them while this node was"
                          " away ({hold:g}s if no lookupd answers, {most:g}s at most)",
                          count=len(self._holding), topics=len(self._holding_topics), hold=HOLD, most=HOLD_MAX)
            self._held_at = self.reactor.seconds()
            self._release = self.reactor.callLater(HOLD, self._release_held, f"no lookupd answered within {HOLD:g}s")

    def peers_answered(self, answers: dict[str, dict[str, Any]], failed: list[str], incarnation: str) -> None:
        """The start's first read of lookupd: ``answers`` are the ``/replication`` of the nodes it
        names that replicate (:func:`notes_info`'s ``notes`` in each), ``failed`` those that did not
        answer. The hold ends now if none holds notes for this ``incarnation`` (and every node
        answered: else at :data:`HOLD`), or once their notice links ended (:meth:`notice_ended`)."""
        if self._release is None or self._awaited is not None:
            return
        self._awaited = {address for address, info in answers.items()
                         if isinstance(info.get("notes"), dict) and info["notes"].get("incarnation") == incarnation}
        self._awaited -= self._told
        if self._awaited:
            self.log.info("REPLICATION: {replicas} delivered messages of this node while it was away: delivery"
                          " held until they have said which", replicas=sorted(self._awaited))
            self._release_after(HOLD_MAX, f"the notes of {', '.join(sorted(self._awaited))} did not come within"
                                          f" {HOLD_MAX:g}s")
        elif failed:
            self._release_after(HOLD, f"{', '.join(sorted(failed))} did not answer")
        else:
            self._release_held("the replicas' notes came" if self._told else "no replica holds notes for this node")

    def _release_after(self, seconds: float, why: str) -> None:
        """The hold ends ``seconds`` after the start instead (at once if that is past), for ``why``."""
        self._release.cancel()
        self._release = self.reactor.callLater(max(0.0, self._held_at + seconds - self.reactor.seconds()),
                                               self._release_held, why)

    def notice_record(self, nsqd: Any, link: Link, kind: int, payload: bytes) -> int:
        """A record on a notice link to this node (``TAKEN`` only): what it names is left out here
        (:func:`taken_elsewhere`). Returns how many IDs it named."""
        if kind != Kind.TAKEN:
            raise ValueError(f"record {kind} on a notice link")
        assert link.hello is not None  # (a notice link is one whose HELLO said so)
        self._read[link] = self._read.get(link, 0) + 1
        return taken_elsewhere(nsqd, str(link.hello["node"]), *decode_fin(payload))

    def notice_lost(self, link: Link) -> None:
        """A notice link to this node ended. Its ``HELLO`` says how many notes it carries: all of
        them read, the replica's notes came (:meth:`notice_ended`); fewer (the link broke on the
        way), the hold goes on, as the replica sends them all again at its next ask."""
        assert link.hello is not None
        read = self._read.pop(link, 0)
        replica, count = str(link.hello["node"]), link.hello.get("records")
        if not isinstance(count, int) or read >= count:  # (a replica that does not say: whole)
            self.notice_ended(replica)
        elif self._release is not None:
            self.log.warn("REPLICATION({replica}): its notice link ended after {read} of its {count} records"
                          " of notes: delivery still held until it sends them again", replica=replica, read=read,
                          count=count)

    def notice_ended(self, replica: str) -> None:
        """All the notes of ``replica`` came, on a notice link that ended."""
        if self._release is None:
            return
        self._told.add(replica)
        if self._awaited is not None and replica in self._awaited:
            self._awaited.discard(replica)
            if not self._awaited:
                self._release_held("the replicas' notes came")

    def stop(self) -> None:
        if self._release is not None and self._release.active():
            self._release.cancel()
        self._release = None  # (a read of lookupd that ends after the stop changes nothing)

    def _release_held(self, why: str) -> None:
        if self._release is not None and self._release.active():
            self._release.cancel()
        self._release = None
        self.log.info("REPLICATION: delivery released {seconds:.2f}s after the start - {why}",
                      seconds=self.reactor.seconds() - self._held_at, why=why)
        held, self._holding = self._holding, []
        for channel in held:
            channel.held = False
            channel.wake()
        topics, self._holding_topics = self._holding_topics, []
        for topic in topics:
            topic.held_for_notes = False
            topic.wake()

    def held_again(self, owners: dict[str, OwnerState], found: list[tuple[dict[str, Any], list[bytes]]]) -> None:
        """At a start: the notes files :func:`read_notes` found, kept again for their owners."""
        for head, records in found:
            owner = str(head.get("owner") or "")
            if not owner or not records:
                continue
            state = owners.get(owner)
            if state is None:
                state = owners[owner] = OwnerState(owner)
                state.incarnation = str(head.get("incarnation") or "")
                state.host = str(head.get("host") or "")
                state.http_port = int(head.get("http_port") or 0)
            state.notes, state.noted = records, int(head.get("ids") or 0)
            state.noted_since = float(head.get("since") or self.reactor.seconds())
            state.notes_for = str(head.get("incarnation") or "")

    def begin(self, state: OwnerState) -> bool:
        """A takeover of the owner begins: its notes are for its incarnation of now (those of an older
        one dropped). False: it has none known (nothing can be told to it)."""
        if not state.incarnation:
            return False
        if state.notes_for != state.incarnation or not state.notes:
            state.notes, state.noted, state.noted_since = [], 0, self.reactor.seconds()
        state.notes_for = state.incarnation
        return True

    def add(self, state: OwnerState, topic: str, owners: dict[str, list[bytes]]) -> None:
        """A slice of the takeover handed in the owner's ``owners`` (IDs per channel) of ``topic``:
        noted, in memory (written by :meth:`save` once the topic's takeover ends)."""
        records, count = taken_records(topic, owners)
        state.notes = state.notes + records  # (a new list: one being sent is told apart)
        state.noted += count
        state.noted_at = 0.0

    def save(self, state: OwnerState) -> None:
        """The owner's notes file written again as they are now (removed once there are none)."""
        path = notes_path(self.data_path, state.name)
        if state.notes:
            head = {"owner": state.name, "incarnation": state.notes_for, "host": state.host,
                    "http_port": state.http_port, "ids": state.noted, "since": state.noted_since}
            d = self.lane().submit(atomic_write, path, notes_file(head, state.notes))
        else:
            d = self.lane().submit(remove_files, [path])
        d.addErrback(lambda f: self.log.error("REPLICATION({owner}): its notes file could not be written - {error}",
                                              owner=state.name, error=f.getErrorMessage()))

    def forget(self, state: OwnerState, why: str) -> None:
        self.log.info("REPLICATION({owner}): {why}: the notes of {count} message(s) delivered here are dropped",
                      owner=state.name, why=why, count=state.noted)
        state.notes, state.noted, state.notes_for = [], 0, ""
        self.save(state)

    def tick(self, state: OwnerState, now: float, every: float) -> None:
        """The replica's tick: an owner with notes is asked every ``every`` seconds (:meth:`tell`)."""
        if state.notes and not state.noting and now - state.noted_at >= every:
            state.noting = True
            state.noted_at = now
            ensureDeferred(self.tell(state))

    async def tell(self, state: OwnerState) -> None:
        """The owner's ``/replication``: its incarnation of the takeover answering means it is back on
        its disk: it is sent the notes (a notice link), then they are forgotten; another incarnation
        answering: its data is gone, and the notes with it; no answer: asked again in a second."""
        try:
            if self.reactor.seconds() - state.noted_since > NOTES_KEPT:
                self.forget(state, f"not back in {NOTES_KEPT / 3600:g} hours")
                return
            url = f"http://{state.host}:{state.http_port}/replication"
            try:
                code, body = await http_get(self.reactor, url, 1.0)
                incarnation = str(json.loads(body).get("incarnation") or "") if code == 200 else ""
            except Exception:  # noqa: BLE001 - no answer: asked again
                return
            if not incarnation or not state.notes:
                return
            if incarnation != state.notes_for:
                self.forget(state, "back without its data")
                return
            records, count = state.notes, state.noted
            hello = {**self.hello(), "role": "notice", "owner_incarnation": incarnation, "records": len(records)}
            if not await send_notice(self.reactor, state.host, state.http_port, hello, records, self.timeout,
                                     self.secret):
                return
            if state.notes is records:
                state.notes, state.noted = [], 0
                self.save(state)
            self.log.info("REPLICATION({owner}): back on its disk after its takeover here: told it of the {count}"
                          " message(s) delivered here, which it will not deliver", owner=state.name, count=count)
        finally:
            state.noting = False


def notes_info(state: OwnerState | None) -> dict[str, Any]:
    """What ``GET /replication?owner=NAME`` adds for the owner of ``state``: the incarnation this
    node's notes for it are for and how many messages they name (nothing: none). The owner asking
    is at its start: the notes are sent at the next tick, not after the next second's ask."""
    if state is None or not state.notes:
        return {}
    state.noted_at = 0.0
    return {"notes": {"incarnation": state.notes_for, "messages": state.noted}}


def taken_records(topic: str, owners: dict[str, list[bytes]]) -> tuple[list[bytes], int]:
    """The TAKEN records of the owner's IDs per channel of ``topic``, and how many IDs they name."""
    records: list[bytes] = []
    count = 0
    for channel, ids in owners.items():
        count += len(ids)
        for i in range(0, len(ids), NOTE_IDS):
            records.append(encode_taken(topic, channel, ids[i:i + NOTE_IDS]))
    return records, count


def notes_path(data_path: str, owner: str) -> str:
    return os.path.join(data_path, re.sub(r"[^A-Za-z0-9._-]", "_", owner) + NOTES_SUFFIX)


def notes_file(head: dict[str, Any], records: list[bytes]) -> bytes:
    """A notes file's bytes: a ``HELLO`` record of ``head`` (owner, incarnation, host, http_port), then the
    notes; written by the caller (atomically, on the disk lane)."""
    return encode_json(Kind.HELLO, head) + b"".join(records)


def read_notes(data_path: str) -> list[tuple[dict[str, Any], list[bytes]]]:
    """Disk thread: every notes file in ``data_path``: its head and its TAKEN records (a file that
    cannot be read is skipped: its owner's return then costs duplicates, never a loss)."""
    out: list[tuple[dict[str, Any], list[bytes]]] = []
    for name in sorted(os.listdir(data_path)):
        if not name.endswith(NOTES_SUFFIX):
            continue
        try:
            with open(os.path.join(data_path, name), "rb") as f:
                records, rest = split_records(f.read())
            head = json.loads(records[0][1]) if records and records[0][0] == Kind.HELLO else None
            if rest or not isinstance(head, dict):
                raise ValueError("not a notes file")
        except (OSError, ValueError, IndexError) as e:
            _log.error("REPLICATION: {name} cannot be read back - {error}", name=name, error=e)
            continue
        out.append((head, [frame(Kind.TAKEN, p) for k, p in records[1:] if k == Kind.TAKEN]))
    return out


class _Notice:
    """The replica's end of a notice link: its ``HELLO``, the notes, then the owner's ``ACK`` of the
    last one fires ``done`` with True (a link lost before: False)."""

    def __init__(self, hello: dict[str, Any], records: list[bytes], done: Deferred[bool]) -> None:
        self.hello = hello
        self.records = records
        self.done = done
        self.last = 0
        self.link: Link | None = None

    def link_up(self, link: Link) -> None:
        self.link = link
        link.send(encode_json(Kind.HELLO, self.hello))
        for record in self.records:
            self.last = link.send(record)

    def link_record(self, link: Link, kind: int, payload: bytes) -> None:
        if kind == Kind.ACK and decode_ack(payload) >= self.last > 0:
            if not self.done.called:
                self.done.callback(True)
            link.close_now()

    def link_read(self, link: Link) -> None:
        pass

    def link_lost(self, link: Link | None, reason: str) -> None:
        if not self.done.called:
            self.done.callback(False)

    def give_up(self) -> None:
        if self.link is not None:
            self.link.abort()
        if not self.done.called:
            self.done.callback(False)


def send_notice(reactor: Any, host: str, http_port: int, hello: dict[str, Any], records: list[bytes],
                timeout: float, secret: bytes | None = None) -> Deferred[bool]:
    """Link to the owner at ``host:http_port`` as a notice (``hello``'s ``role``), send ``records``;
    fires with whether it acknowledged them all within ``timeout`` seconds."""
    done: Deferred[bool] = Deferred()
    notice = _Notice(hello, records, done)
    open_link(reactor, host, http_port, notice, beat_interval(timeout), timeout,
              lambda why: notice.link_lost(None, why), secret)
    timer = reactor.callLater(timeout, notice.give_up)

    def settled(ok: bool) -> bool:
        if timer.active():
            timer.cancel()
        return ok

    return done.addCallback(settled)


def is_notice(hello: dict[str, Any], incarnation: str) -> bool:
    """Whether a link's ``HELLO`` opens a notice (a replica's notes to this node); ValueError for a
    notice meant for another incarnation of this node (its data directory is not the one noted)."""
    if hello.get("role") != "notice":
        return False
    if str(hello.get("owner_incarnation")) != incarnation:
        raise ValueError("a notice for another incarnation of this node")
    return True


def taken_elsewhere(nsqd: Any, replica: str, topic: str, channel: str, ids: list[bytes]) -> int:
    """A TAKEN record, at the owner: ``replica`` delivered these messages of the topic's ``channel``
    (empty: of every channel) while this node was away; left out here as they leave the channel's
    queues (``Channel.drop_taken``). Returns how many IDs it named."""
    local = nsqd.topics.get(topic)
    if local is None:
        return 0
    if not channel and not local.channels:  # (handed into the replica's topic: it had no channel either)
        local.taken_elsewhere.update(ids)
    for c in [c for name, c in local.channels.items() if not channel or name == channel]:
        c.drop_taken(ids)
    _log.info("REPLICATION({replica}): it delivered {count} message(s) of {topic}:{channel} while this node"
              " was away: not delivered here", replica=replica, count=len(ids), topic=topic,
              channel=channel or "*")
    return len(ids)
