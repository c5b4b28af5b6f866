"""``--replicas=2`` (:mod:`nsqtw.replica`) without sockets.

Records are encoded and split for real; links run over ``StringTransport``s
(or twisted's ``iosim`` pump, for an owner and a replica joined through the
replica's HTTP channel); time is a ``task.Clock`` or ``MemoryReactorClock``;
lookupd's and the nodes' HTTP answers come from an injected ``get``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, ensureDeferred, fail, succeed
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure
from twisted.test import iosim

from nsqtw.core.admission import PUBLISHED, Failed, settled
from nsqtw.core.message import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE
from nsqtw.core.nsqd import NSQD, all_of
from nsqtw.core.unwritten import UnwrittenBytes
from nsqtw.errors import ReplicaError
from nsqtw.http.base import APIError
from nsqtw.nsqd.http import HTTPAPI
from nsqtw.protocol.wire import encode_command
from nsqtw.replica.choice import Candidate, Choice, rendezvous
from nsqtw.replica.disklog import FLUSH_DELAY, STANDBY_SUFFIX, StandbyLog, log_prefix
from nsqtw.replica.journal import Entry, encode_entry, encode_json_entry, parse_entries, read_logs
from nsqtw.replica.link import BEAT_INTERVAL, UPGRADE, Link, OwnerLink, upgrade_request
from nsqtw.replica.owner import OPEN_RECORD_BYTES, OwnerSide
from nsqtw.replica.records import (
    MAX_RECORD,
    Kind,
    PubMessage,
    decode_ack,
    decode_fin,
    decode_json,
    decode_need,
    decode_pub,
    decode_snap,
    decode_snap_ids,
    encode_ack,
    encode_fin,
    encode_json,
    encode_need,
    encode_pub,
    encode_snap,
    encode_snap_ids,
    frame,
    index_messages,
    pub_messages,
    read_messages,
    select_messages,
    split_pub,
    split_records,
)
from nsqtw.replica.service import INCARNATION_FILE, ReplicationService
from nsqtw.replica.standby import TAKEOVER_SLICE, Standby, still_due, unheld
from nsqtw.replica.stopped import SAVE_TIMEOUT, STOPPED_FILE, read_stopped
from nsqtw.storage.executor import SynchronousDiskExecutor
from tests.helpers import (
    EPOCH,
    ManualExecutor,
    connect,
    decode_message_frame,
    make_nsqd,
    make_options,
    one_turn,
    take_frames,
)

NOW_NS = int(EPOCH * 1e9)
SWITCHED = (b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: nsqtw-replication/1\r\n\r\n")


def split_all(data: bytes) -> list[tuple[int, bytes]]:
    out, rest = split_records(data)
    assert rest == b"", "trailing partial record"
    return out


def kinds(data: bytes) -> list[int]:
    return [k for k, _ in split_all(data)]


def pub_ids(payload: bytes) -> list[bytes]:
    return [m.id for m in decode_pub(payload)[1]]


def mid(n: int) -> bytes:
    return b"%016x" % n


# -- records -----------------------------------------------------------------------------------------


def test_frame_and_split_round_trip() -> None:
    data = frame(Kind.BEAT) + encode_ack(7) + frame(Kind.BYE, b"x")
    assert data[:5] == b"\x00\x00\x00\x01" + bytes((Kind.BEAT,))
    assert split_all(data) == [(Kind.BEAT, b""), (Kind.ACK, (7).to_bytes(8, "big")), (Kind.BYE, b"x")]


def test_pub_messages_of_one_and_of_many_read_back_alike() -> None:
    one = pub_messages([7], [b"seven"], NOW_NS, 1.001)
    assert read_messages(one) == [(7, NOW_NS, 1001, b"seven")]  # 1.001 * 1000 is under 1001: rounded
    many = pub_messages(range(7, 10), [b"seven", b"", b"nine"], NOW_NS, 0.0)
    assert read_messages(many) == [(7, NOW_NS, 0, b"seven"), (8, NOW_NS, 0, b""), (9, NOW_NS, 0, b"nine")]
    assert many.startswith(pub_messages([7], [b"seven"], NOW_NS, 0.0))
    assert pub_messages([], [], NOW_NS, 0.0) == b""
    for values, bodies in (([1, 2], [b"a"]), ([1], [b"a", b"b"]), ([1], [])):
        with pytest.raises(ValueError):
            pub_messages(values, bodies, NOW_NS, 0.0)


def test_split_keeps_a_partial_record_for_later() -> None:
    data = encode_ack(1) + encode_ack(2)
    for cut in range(len(data) + 1):
        got, rest = split_records(data[:cut])
        whole = 0 if cut < 13 else 1 if cut < 26 else 2
        assert [decode_ack(p) for _, p in got] == [1, 2][:whole]
        assert rest == data[13 * whole:cut]
        more, rest = split_records(rest + data[cut:])
        assert [decode_ack(p) for _, p in got + more] == [1, 2] and rest == b""


def test_split_refuses_zero_and_oversize_lengths() -> None:
    with pytest.raises(ValueError):
        split_records(b"\x00\x00\x00\x00")
    with pytest.raises(ValueError):
        split_records(encode_ack(1) + (MAX_RECORD + 1).to_bytes(4, "big"))
    # the largest record waits for its bytes; a length alone is no error
    assert split_records(MAX_RECORD.to_bytes(4, "big") + b"\x02") == ([], MAX_RECORD.to_bytes(4, "big") + b"\x02")


def test_pub_round_trip_with_ids_as_the_topic_made_them() -> None:
    record = encode_pub("tópic", [1, 0xFEDCBA9876543210], [b"a", b""], NOW_NS, 1.5)
    [(kind, payload)] = split_all(record)
    assert kind == Kind.PUB
    topic, messages = decode_pub(payload)
    assert topic == "tópic"
    assert messages == [PubMessage(b"0000000000000001", NOW_NS, 1500, b"a"),
                        PubMessage(b"fedcba9876543210", NOW_NS, 1500, b"")]


def test_pub_refuses_bodies_past_the_end_and_bytes_after() -> None:
    [(_, payload)] = split_all(encode_pub("t", [1], [b"body"], NOW_NS, 0.0))
    with pytest.raises(ValueError):
        decode_pub(payload[:-1])
    with pytest.raises(ValueError):
        decode_pub(payload + b"x")
    with pytest.raises(ValueError):
        decode_pub(b"\x00\x09t")  # a name longer than the record


def test_fin_ack_json_round_trips() -> None:
    ids = [mid(1), mid(2)]
    [(kind, payload)] = split_all(encode_fin("t", "c", ids))
    assert kind == Kind.FIN and decode_fin(payload) == ("t", "c", ids)
    with pytest.raises(ValueError):
        decode_fin(payload[:-1])
    [(kind, payload)] = split_all(encode_ack(2**40 + 3))
    assert kind == Kind.ACK and decode_ack(payload) == 2**40 + 3
    value = {"topic": "t", "channel": None, "backlog": True}
    [(kind, payload)] = split_all(encode_json(Kind.EMPTY, value))
    assert kind == Kind.EMPTY and decode_json(payload) == value
    with pytest.raises(ValueError):
        decode_json(b"[1]")
    with pytest.raises(ValueError):
        decode_json(b"{not json")


# -- Link --------------------------------------------------------------------------------------------


class Handler:
    """A LinkHandler that records what its link told it."""

    def __init__(self, raise_on: int | None = None) -> None:
        self.ups: list[Link] = []
        self.records: list[tuple[int, bytes]] = []
        self.reads = 0
        self.lost: list[str] = []
        self.raise_on = raise_on

    def link_up(self, link: Link) -> None:
        self.ups.append(link)

    def link_record(self, link: Link, kind: int, payload: bytes) -> None:
        if kind == self.raise_on:
            raise ValueError("bad payload")
        self.records.append((kind, payload))

    def link_read(self, link: Link) -> None:
        self.reads += 1

    def link_lost(self, link: Link, reason: str) -> None:
        self.lost.append(reason)


class GatheringTransport(StringTransport):
    """A StringTransport that keeps each ``writeSequence`` call's records apart."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sequences: list[list[bytes]] = []

    def writeSequence(self, seq: Any) -> None:
        seq = list(seq)
        self.sequences.append(seq)
        super().writeSequence(seq)


def up_link(clock: Clock | None = None, handler: Handler | None = None) -> tuple[Link, GatheringTransport, Handler,
                                                                                  Clock]:
    clock = clock or Clock()
    handler = handler or Handler()
    link = Link(handler, clock)
    transport = GatheringTransport()
    link.makeConnection(transport)
    link.records_begin()
    return link, transport, handler, clock


def test_a_turns_records_leave_in_one_gathered_write_numbered_from_one() -> None:
    link, transport, handler, clock = up_link()
    assert handler.ups == [link]
    numbers = [link.send(encode_ack(i)) for i in range(3)]
    assert numbers == [1, 2, 3] and link.sent == 3
    assert transport.value() == b""  # not before the turn ends
    clock.advance(0)
    assert transport.sequences == [[encode_ack(0), encode_ack(1), encode_ack(2)]]
    assert link.send(frame(Kind.BEAT)) == 4
    clock.advance(0)
    assert len(transport.sequences) == 2


def test_on_a_plain_tcp_connection_a_turns_records_go_straight_to_the_socket() -> None:
    """A replicated publish's record (and a replica's ACK) costs no epoll turn of its own: on a
    plain TCP connection with nothing queued, the turn's records are sent to the socket at once,
    in one send; only what the socket does not take is left to Twisted's write."""
    import socket

    from tests.helpers import PlainTCP

    a, b = socket.socketpair()
    try:
        a.setblocking(False)
        b.settimeout(1.0)
        clock = Clock()
        link = Link(Handler(), clock)
        transport = PlainTCP(a)
        link.makeConnection(transport)
        link.records_begin()
        link.send(encode_ack(1))
        link.send(encode_ack(2))
        clock.advance(0)
        assert b.recv(100) == encode_ack(1) + encode_ack(2) and transport.queued == []
        transport._tempDataLen = 5  # Twisted holds bytes not yet sent: the records queue behind them
        link.send(encode_ack(3))
        clock.advance(0)
        assert transport.queued == [encode_ack(3)]
    finally:
        a.close()
        b.close()


class Answering(Handler):
    """A replica's handler: each record read is answered by an ACK of the records taken so far."""

    def link_record(self, link: Link, kind: int, payload: bytes) -> None:
        super().link_record(link, kind, payload)
        link.send(encode_ack(link.received))


def test_what_a_read_makes_a_side_send_leaves_at_the_end_of_the_read_in_one_write() -> None:
    """A replica's ACKs are what its owner's OKs wait for: written once the read's records are
    taken in, in one write, with no call asked of the reactor (not a turn later)."""
    link, transport, handler, clock = up_link(handler=Answering())
    link.dataReceived(encode_fin("t", "c", [mid(1)]) + encode_fin("t", "c", [mid(2)]))
    assert transport.sequences == [[encode_ack(1), encode_ack(2)]] and handler.reads == 1
    assert [c for c in clock.getDelayedCalls() if c.getTime() == clock.seconds()] == []
    link.send(encode_ack(3))  # outside a read: at the turn's end, as before
    assert len(transport.sequences) == 1
    clock.advance(0)
    assert transport.sequences[-1] == [encode_ack(3)]


def test_a_read_cut_short_by_a_bad_record_sends_nothing_it_gathered() -> None:
    link, transport, _, clock = up_link(handler=Answering(raise_on=Kind.ACK))
    link.dataReceived(encode_fin("t", "c", [mid(1)]) + encode_ack(1))  # the FIN answered, then refused
    clock.advance(0)
    assert transport.disconnecting and transport.value() == b""


def test_a_beat_goes_after_a_second_without_another_record() -> None:
    link, transport, _, clock = up_link()
    clock.advance(BEAT_INTERVAL)
    assert kinds(transport.value()) == [Kind.BEAT] and link.sent == 1
    transport.clear()
    clock.advance(0.5)
    link.send(encode_ack(1))
    clock.advance(0.5)  # a record left half a second ago: no beat yet
    assert kinds(transport.value()) == [Kind.ACK]
    transport.clear()
    clock.advance(BEAT_INTERVAL)
    assert kinds(transport.value()) == [Kind.BEAT] and link.sent == 3


def test_records_in_are_numbered_beats_counted_but_not_handed_on() -> None:
    link, _, handler, clock = up_link()
    clock.advance(3)
    data = encode_ack(5) + frame(Kind.BEAT) + encode_json(Kind.HELLO, {"node": "n"})
    link.dataReceived(data[:7])
    assert link.received == 0 and handler.reads == 0 and link.last_heard == 0  # nothing whole yet
    link.dataReceived(data[7:])
    assert link.received == 3 and handler.reads == 1 and link.last_heard == 3
    assert [k for k, _ in handler.records] == [Kind.ACK, Kind.HELLO]


def test_records_cut_anywhere_arrive_whole_and_in_order() -> None:
    link, _, handler, _ = up_link()
    records = [encode_ack(1), encode_json(Kind.HELLO, {"node": "n"}), frame(Kind.BEAT), encode_fin("t", "c", [mid(7)])]
    data = b"".join(records)
    for i in range(len(data)):  # a byte a read: lengths cut too
        link.dataReceived(data[i:i + 1])
    assert link.received == 4 and handler.reads == 4  # one read per record made one whole
    assert handler.records == [split_all(r)[0] for r in records if kinds(r) != [Kind.BEAT]]


def test_a_record_of_many_reads_is_looked_at_once_it_is_whole(monkeypatch: Any) -> None:
    """A SNAP record carries up to a log segment (16 MiB) in many reads: its bytes are kept as they
    came and parsed once whole, not joined and parsed again at every read (which costs the square of
    its size: a new replica catching up then acks so late that its owner drops it)."""
    import nsqtw.replica.link as link_module

    parsed: list[int] = []

    def counting(buf: bytes) -> Any:
        parsed.append(len(buf))
        return split_records(buf)

    monkeypatch.setattr(link_module, "split_records", counting)
    link, _, handler, _ = up_link()
    big = frame(Kind.PUB, b"m" * (1 << 20))
    data = big + encode_ack(9)
    for i in range(0, len(data), 1000):
        link.dataReceived(data[i:i + 1000])
    assert handler.records == [(Kind.PUB, b"m" * (1 << 20)), (Kind.ACK, encode_ack(9)[5:])]
    assert sum(parsed) <= 2 * len(data), f"{sum(parsed)} bytes parsed for a record of {len(big)}"


def test_a_link_ignores_input_before_its_records_begin() -> None:
    handler = Handler()
    link = Link(handler, Clock())
    link.makeConnection(StringTransport())
    link.dataReceived(encode_ack(1))
    assert link.received == 0 and handler.records == []


@pytest.mark.parametrize("bad", [b"\x00\x00\x00\x00", (MAX_RECORD + 1).to_bytes(4, "big")])
def test_a_bad_frame_aborts(bad: bytes) -> None:
    link, transport, handler, _ = up_link()
    link.dataReceived(encode_ack(1) + bad)
    assert transport.disconnecting and handler.records == [] and handler.reads == 0


def test_a_record_its_handler_refuses_aborts_and_stops_there() -> None:
    link, transport, handler, _ = up_link(handler=Handler(raise_on=Kind.FIN))
    link.dataReceived(encode_ack(1) + encode_fin("t", "c", []) + encode_ack(2))
    assert transport.disconnecting
    assert [k for k, _ in handler.records] == [Kind.ACK] and handler.reads == 0


def test_close_now_writes_what_is_queued_then_closes_and_lost_stops_the_beat() -> None:
    link, transport, handler, clock = up_link()
    link.send(encode_ack(9))
    link.close_now()
    assert kinds(transport.value()) == [Kind.ACK] and transport.disconnecting
    link.connectionLost(Failure(ConnectionError("gone")))
    assert handler.lost == ["gone"] and link.closed
    transport.clear()
    clock.advance(10 * link.beat)  # the flush asked for the turn's end finds nothing; no BEAT after
    assert transport.value() == b"" and clock.getDelayedCalls() == []


# -- OwnerLink: the HTTP upgrade -----------------------------------------------------------------------


def owner_link() -> tuple[OwnerLink, StringTransport, Handler, Clock]:
    handler = Handler()
    clock = Clock()
    link = OwnerLink(handler, clock, "10.0.0.2:4151")
    transport = StringTransport()
    link.makeConnection(transport)
    return link, transport, handler, clock


def test_owner_link_asks_for_the_upgrade() -> None:
    link, transport, _, _ = owner_link()
    assert transport.value() == upgrade_request("10.0.0.2:4151", link.own_nonce)
    assert b"\r\nNsqtw-Nonce: " + link.own_nonce + b"\r\n" in transport.value() and len(link.own_nonce) == 32
    assert transport.value().startswith(b"GET /replication/link HTTP/1.1\r\nHost: 10.0.0.2:4151\r\n")
    assert b"\r\nUpgrade: " + UPGRADE + b"\r\n" in transport.value()


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n\r\n" + encode_ack(1),
    b"HTTP/1.0 101 Switching Protocols\r\n\r\n",
])
def test_owner_link_refuses_an_answer_that_is_not_101(answer: bytes) -> None:
    link, transport, handler, _ = owner_link()
    link.dataReceived(answer)
    assert transport.disconnecting
    assert handler.ups == [] and handler.records == [] and not link.connected_up


def test_owner_link_aborts_a_head_that_never_ends() -> None:
    link, transport, handler, _ = owner_link()
    link.dataReceived(b"HTTP/1.1 101 Switching Protocols\r\n" + b"X: " + b"y" * 9000)
    assert transport.disconnecting and handler.ups == []


def test_records_after_the_101_head_in_the_same_read_are_handled() -> None:
    link, transport, handler, clock = owner_link()
    head = SWITCHED
    link.dataReceived(head[:10])
    assert handler.ups == []
    link.dataReceived(head[10:] + encode_ack(1) + encode_json(Kind.HELLO, {"node": "r"}) + encode_ack(2)[:3])
    assert handler.ups == [link] and link.connected_up
    assert [k for k, _ in handler.records] == [Kind.ACK, Kind.HELLO] and handler.reads == 1
    link.dataReceived(encode_ack(2)[3:])
    assert [decode_ack(p) for k, p in handler.records if k == Kind.ACK] == [1, 2] and link.received == 3
    assert not transport.disconnecting


# -- Choice ------------------------------------------------------------------------------------------


def candidate(address: str, incarnation: str = "") -> Candidate:
    host, port = address.rsplit(":", 1)
    return Candidate(address, host, int(port), incarnation or "inc-" + address)


class Gets:
    """The injected ``get``: url (without its query) -> (code, body), or an exception; every url
    asked (``asked``: without the query, ``queries``: the query of each)."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.asked: list[str] = []
        self.queries: list[str] = []

    def __call__(self, reactor: Any, url: str) -> Deferred[tuple[int, bytes]]:
        url, _, query = url.partition("?")
        self.asked.append(url)
        self.queries.append(query)
        answer = self.answers.get(url, ConnectionRefusedError(url))
        if isinstance(answer, Exception):
            return fail(answer)
        return succeed(answer)


def nodes(*addresses: str) -> tuple[int, bytes]:
    producers = []
    for a in addresses:
        host, port = a.rsplit(":", 1)
        producers.append({"broadcast_address": host, "http_port": int(port), "tcp_port": 4150})
    return 200, json.dumps({"producers": producers}).encode()


def replicates(incarnation: str) -> tuple[int, bytes]:
    return 200, json.dumps({"version": 1, "node": "x", "incarnation": incarnation, "replicas": 2}).encode()


OWN = "10.0.0.1:4151"


def make_choice(gets: Gets | None = None, lookupds: list[str] | None = None,
                clock: Any = None) -> tuple[Choice, Any]:
    clock = clock or Clock()
    choice = Choice(clock, lambda: OWN, "own-inc", lambda: lookupds if lookupds is not None else [],
                    gets or Gets({}))
    return choice, clock


def test_rendezvous_is_deterministic_and_spread() -> None:
    choice, _ = make_choice()
    addresses = ["10.0.0.2:4151", "10.0.0.3:4151", "10.0.0.4:4151"]
    choice.candidates = {a: candidate(a) for a in addresses}
    topics = [f"topic{i}" for i in range(300)]
    chosen = {t: choice.best(OWN, t) for t in topics}
    for t, c in chosen.items():
        assert c is not None
        assert c.address == max(addresses, key=lambda a, t=t: rendezvous(OWN, t, a))
        assert choice.best(OWN, t) == c
    spread = {a: sum(1 for c in chosen.values() if c is not None and c.address == a) for a in addresses}
    assert all(n > 50 for n in spread.values()), spread
    # a candidate that leaves moves only its own topics
    del choice.candidates[addresses[0]]
    for t, c in chosen.items():
        if c is not None and c.address != addresses[0]:
            assert choice.best(OWN, t) == c
    assert rendezvous(OWN, "t", "a") != rendezvous("10.0.0.9:4151", "t", "a")


def test_set_aside_skips_a_candidate_until_its_time_is_up() -> None:
    choice, clock = make_choice()
    addresses = ["10.0.0.2:4151", "10.0.0.3:4151"]
    choice.candidates = {a: candidate(a) for a in addresses}
    first = choice.best(OWN, "t")
    assert first is not None
    choice.set_aside(first.address, 10.0)
    second = choice.best(OWN, "t")
    assert second is not None and second != first
    clock.advance(9.9)
    assert choice.best(OWN, "t") == second
    clock.advance(0.1)
    assert choice.best(OWN, "t") == first
    # all set aside: none
    choice.set_aside(addresses[0], 5.0)
    choice.set_aside(addresses[1], 5.0)
    assert choice.best(OWN, "t") is None


def test_poll_takes_the_nodes_that_replicate_but_not_itself() -> None:
    gets = Gets({
        "http://lookupd:4161/nodes": nodes(OWN, "10.0.0.2:4151", "10.0.0.3:4151", "10.0.0.4:4151", "10.0.0.5:4151"),
        "http://10.0.0.2:4151/replication": replicates("inc-a"),
        "http://10.0.0.3:4151/replication": (404, b'{"message":"NOT_FOUND"}'),
        "http://10.0.0.4:4151/replication": replicates("own-inc"),  # this node, under another name
        "http://10.0.0.5:4151/replication": (200, b"{}"),  # no incarnation: not one
    })
    choice, _ = make_choice(gets, ["lookupd:4161"])
    changes: list[int] = []
    choice.changed = lambda: changes.append(len(choice.candidates))
    choice.poll()
    assert choice.candidates == {"10.0.0.2:4151": Candidate("10.0.0.2:4151", "10.0.0.2", 4151, "inc-a")}
    assert changes == [1]
    assert f"http://{OWN}/replication" not in gets.asked
    asks = zip(gets.asked, gets.queries, strict=True)
    assert {q for u, q in asks if u.endswith("/replication")} == {"owner=10.0.0.1%3A4151"}  # (this node's notes)
    gets.asked.clear()
    choice.poll()  # asked once: not again while they stay in /nodes
    assert gets.asked == ["http://lookupd:4161/nodes"]
    assert changes == [1]
    for t in ("a", "b", "c", "d", "e"):
        best = choice.best(OWN, t)
        assert best is not None and best.address == "10.0.0.2:4151"


def test_a_node_down_is_asked_again_and_one_gone_from_nodes_is_dropped() -> None:
    gets = Gets({"http://lookupd:4161/nodes": nodes("10.0.0.2:4151", "10.0.0.3:4151"),
                 "http://10.0.0.3:4151/replication": replicates("inc-b")})
    choice, _ = make_choice(gets, ["lookupd:4161"])
    choice.poll()
    assert set(choice.candidates) == {"10.0.0.3:4151"}  # 10.0.0.2 did not answer
    gets.answers["http://10.0.0.2:4151/replication"] = replicates("inc-a")
    choice.poll()
    assert set(choice.candidates) == {"10.0.0.2:4151", "10.0.0.3:4151"}
    gets.answers["http://lookupd:4161/nodes"] = nodes("10.0.0.2:4151")
    choice.poll()
    assert set(choice.candidates) == {"10.0.0.2:4151"}


def test_lookupd_down_keeps_the_last_answer() -> None:
    gets = Gets({"http://lookupd:4161/nodes": nodes("10.0.0.2:4151"),
                 "http://10.0.0.2:4151/replication": replicates("inc-a")})
    choice, _ = make_choice(gets, ["lookupd:4161"])
    changes: list[int] = []
    choice.changed = lambda: changes.append(1)
    choice.poll()
    assert set(choice.candidates) == {"10.0.0.2:4151"} and changes == [1]
    gets.answers["http://lookupd:4161/nodes"] = ConnectionRefusedError()
    choice.poll()
    assert set(choice.candidates) == {"10.0.0.2:4151"} and changes == [1]
    gets.answers["http://lookupd:4161/nodes"] = (500, b"oops")
    choice.poll()
    assert set(choice.candidates) == {"10.0.0.2:4151"}


def test_poll_again_soon_while_no_candidate_is_known() -> None:
    gets = Gets({"http://lookupd:4161/nodes": nodes("10.0.0.3:4151")})
    choice, clock = make_choice(gets, ["lookupd:4161"])
    choice.poll()
    assert choice.candidates == {}
    asked = len(gets.asked)
    clock.advance(1.0)
    assert len(gets.asked) > asked  # asked again after a second


# -- OwnerSide ---------------------------------------------------------------------------------------


A, B = "10.0.0.2:4151", "10.0.0.3:4151"


class Owner:
    """An OwnerSide on a MemoryReactorClock whose TCP connections are joined by hand."""

    def __init__(self, addresses: tuple[str, ...] = (A, B), timeout: float = 9.0, wait: float = 5.0,
                 channels: list[tuple[str, bool]] | None = None) -> None:
        self.reactor = MemoryReactorClock()
        self.reactor.advance(EPOCH)
        self.choice, _ = make_choice(clock=self.reactor)
        self.choice.candidates = {a: candidate(a) for a in addresses}
        self.channels = channels or []
        self.side = OwnerSide(self.reactor, self.choice, lambda: OWN,
                              lambda: {"node": OWN, "incarnation": "own-inc"},
                              lambda topic: list(self.channels), timeout, wait)
        self.connected = 0

    def connect_next(self) -> tuple[str, OwnerLink, StringTransport]:
        """The next connection the side asked for: its address, its protocol and transport (the head sent)."""
        host, port, factory, timeout, _ = self.reactor.tcpClients[self.connected]
        self.connected += 1
        assert timeout == self.side.timeout / 3
        proto = factory.buildProtocol(None)
        transport = StringTransport()
        proto.makeConnection(transport)
        assert transport.value() == upgrade_request(f"{host}:{port}", proto.own_nonce)
        transport.clear()
        return f"{host}:{port}", proto, transport

    def up(self) -> tuple[str, OwnerLink, StringTransport]:
        address, proto, transport = self.connect_next()
        proto.dataReceived(SWITCHED)
        self.reactor.advance(0)
        return address, proto, transport


def topics_apart(o: Owner) -> tuple[str, str]:
    """Two topics the owner's choice places on different replicas."""
    topics = [f"t{i}" for i in range(20)]
    t = topics[0]
    return t, next(x for x in topics if o.choice.best(OWN, x) != o.choice.best(OWN, t))


def test_a_publish_fires_on_the_ack_that_covers_its_record_only() -> None:
    o = Owner(channels=[("c", False)])
    d1 = o.side.published("t", [1], [b"one"], NOW_NS, 0.0)
    address, link, transport = o.up()
    assert address == o.choice.best(OWN, "t").address  # type: ignore[union-attr]
    sent = split_all(transport.value())
    assert [k for k, _ in sent] == [Kind.HELLO, Kind.CHANNEL, Kind.PUB]
    assert decode_json(sent[0][1])["incarnation"] == "own-inc"
    assert decode_json(sent[1][1]) == {"topic": "t", "channel": "c", "backlog": False}
    assert pub_ids(sent[2][1]) == [mid(1)]
    d2 = o.side.published("t", [2, 3], [b"two", b"three"], NOW_NS, 0.0)
    fired: list[int] = []
    d1.addCallback(lambda _: fired.append(1))
    d2.addCallback(lambda _: fired.append(2))
    link.dataReceived(encode_ack(2))
    assert fired == []  # record 3 is d1's PUB
    link.dataReceived(encode_ack(3))
    assert fired == [1]
    o.reactor.advance(0)
    assert pub_ids(split_all(transport.value())[-1][1]) == [mid(2), mid(3)]
    link.dataReceived(encode_ack(4))
    assert fired == [1, 2]
    assert o.side.refused == 0 and len(o.side.placed["t"].pending) == 0


def test_a_turns_publishes_to_a_topic_leave_as_one_record_acked_once() -> None:
    o = Owner()
    t, u = topics_apart(o)
    first = o.side.published(t, [1], [b"one"], NOW_NS, 0.0)
    _, link, transport = o.up()  # (its turn ends: the first publish's record is out)
    transport.clear()
    second = o.side.published(t, [2], [b"two"], NOW_NS, 0.0)
    third = o.side.published(t, [3, 4], [b"three", b"four"], NOW_NS, 0.0)
    o.side.published(u, [5], [b"five"], NOW_NS, 0.0)  # another topic, another replica: its own record
    assert transport.value() == b"" and o.side.topic_stats(t)["unacked"] == 3
    o.reactor.advance(0)
    sent = split_all(transport.value())
    assert [k for k, _ in sent] == [Kind.PUB]
    assert pub_ids(sent[0][1]) == [mid(2), mid(3), mid(4)]
    assert o.side.topic_stats(t)["unacked"] == 3
    fired: list[int] = []
    for n, d in ((1, first), (2, second), (3, third)):
        d.addCallback(lambda _, n=n: fired.append(n))
    link.dataReceived(encode_ack(3))  # HELLO, the first publish's PUB, then the turn's
    assert fired == [1, 2, 3] and o.side.topic_stats(t)["unacked"] == 0


def test_a_turns_publishes_past_the_bound_start_the_next_record() -> None:
    o = Owner()
    o.side.published("t", [1], [b"one"], NOW_NS, 0.0)
    _, link, transport = o.up()
    transport.clear()
    big = b"x" * (OPEN_RECORD_BYTES // 2 - 100)  # two fit, with their headers
    for n in (2, 3, 4):  # the third would take the record past the bound
        o.side.published("t", [n], [big], NOW_NS, 0.0)
    o.side.published("t", [5, 6], [b"five", b"six"], NOW_NS, 0.0)
    o.reactor.advance(0)
    sent = split_all(transport.value())
    assert [pub_ids(payload) for _, payload in sent] == [[mid(2), mid(3)], [mid(4), mid(5), mid(6)]]
    assert all(len(payload) < OPEN_RECORD_BYTES + 1024 for _, payload in sent)


def test_a_record_about_the_topic_follows_the_turns_publishes_before_it() -> None:
    o = Owner(channels=[("c", False)])
    o.side.published("t", [1], [b"one"], NOW_NS, 0.0)
    _, link, transport = o.up()
    transport.clear()
    o.side.published("t", [2], [b"two"], NOW_NS, 0.0)
    o.side.emptied("t", "c")
    o.side.published("t", [3], [b"three"], NOW_NS, 0.0)
    o.side.finished("t", "c", [mid(1)])
    o.reactor.advance(0)
    sent = split_all(transport.value())
    assert [k for k, _ in sent] == [Kind.PUB, Kind.EMPTY, Kind.PUB, Kind.FIN]
    assert [pub_ids(sent[0][1]), pub_ids(sent[2][1])] == [[mid(2)], [mid(3)]]


def test_a_turns_publishes_reach_the_own_log_in_one_append_before_anything_else_about_the_topic(
        tmp_path: Any, monkeypatch: Any) -> None:
    """The own log takes a turn's publishes to a topic as the record does: one append when the
    record closes, which a record about the topic (EMPTY here) closes first, so the own log sees
    the same order of events as the replica."""
    o = Owner(channels=[("c", False)])
    o.side._make_own = lambda topic: Standby("self", topic, StandbyLog(
        str(tmp_path), f"own.{topic}", SynchronousDiskExecutor(), False))
    o.side.published("t", [1], [b"one"], NOW_NS, 0.0)
    own = o.side.own["t"]
    appends: list[tuple[int, int]] = []
    append = own.disk.append
    monkeypatch.setattr(own.disk, "append",
                        lambda data, first: (appends.append((first, len(data))), append(data, first)))
    o.side.published("t", [2, 3], [b"two", b"three"], NOW_NS, 0.0)
    assert appends == [] and own.arrivals == 0  # not before the record closes
    o.side.emptied("t", "c")  # the three first, then emptied
    o.side.published("t", [4], [b"four"], NOW_NS, 0.0)
    o.reactor.advance(0)
    assert [first for first, _ in appends] == [0, 3] and own.arrivals == 4
    assert [own.holds(v) for v in (1, 2, 3, 4)] == [False, False, False, True]


def test_finished_and_channel_records_go_to_the_topics_replica() -> None:
    o = Owner()
    o.side.published("t", [1], [b"one"], NOW_NS, 0.0)
    _, link, transport = o.up()
    transport.clear()
    o.side.finished("t", "c", [mid(1)])
    o.side.send_json("t", Kind.CHANNEL_GONE, {"topic": "t", "channel": "c"})
    o.side.finished("other", "c", [mid(1)])  # not placed: nothing
    o.reactor.advance(0)
    sent = split_all(transport.value())
    assert sent == [split_all(encode_fin("t", "c", [mid(1)]))[0],
                    (Kind.CHANNEL_GONE, b'{"topic":"t","channel":"c"}')]


def test_no_candidate_refuses_after_the_wait_and_counts_it() -> None:
    o = Owner(addresses=())
    d = o.side.published("t", [1], [b"one"], NOW_NS, 0.0)
    failures: list[Failure] = []
    d.addErrback(failures.append)
    o.reactor.advance(4.9)
    o.side.tick()
    assert failures == [] and o.reactor.tcpClients == []
    o.reactor.advance(0.1)
    o.side.tick()
    assert len(failures) == 1 and failures[0].check(ReplicaError)
    assert (o.side.refused, o.side.unreplicated) == (1, 1)
    assert settled(failures[0]).fatal is False  # type: ignore[union-attr]


def test_a_candidate_that_comes_in_time_takes_the_waiting_records() -> None:
    o = Owner(addresses=())
    d = o.side.published("t", [1], [b"one"], NOW_NS, 0.0)
    o.reactor.advance(0)  # the turn ends: its record waits for a replica
    o.choice.candidates = {A: candidate(A)}
    o.side.candidates_changed()
    _, link, transport = o.up()
    assert [k for k, _ in split_all(transport.value())] == [Kind.HELLO, Kind.PUB]
    link.dataReceived(encode_ack(2))
    assert d.called and d.result is None
    assert (o.side.refused, o.side.unreplicated) == (0, 0)


def test_a_replica_that_does_not_ack_within_the_wait_refuses_but_keeps_the_record() -> None:
    o = Owner(timeout=30.0, wait=5.0)
    d = o.side.published("t", [1], [b"one"], NOW_NS, 0.0)
    failures: list[Failure] = []
    d.addErrback(failures.append)
    _, link, _ = o.up()
    o.reactor.advance(5.0)
    link.dataReceived(frame(Kind.BEAT))  # alive, but not acking
    o.side.tick()
    assert len(failures) == 1 and failures[0].check(ReplicaError)
    assert (o.side.refused, o.side.unreplicated) == (1, 0)
    assert len(o.side.placed["t"].pending) == 1
    link.dataReceived(encode_ack(2))  # a late ACK: nothing more to fire
    assert len(o.side.placed["t"].pending) == 0 and o.side.refused == 1


def test_a_silent_replica_is_replaced_and_its_unacked_records_resent() -> None:
    o = Owner(timeout=9.0, wait=5.0)
    d = o.side.published("t", [1], [b"one"], NOW_NS, 0.0)
    first, link1, transport1 = o.up()
    [pub] = [r for r in split_all(transport1.value()) if r[0] == Kind.PUB]
    o.reactor.advance(2.9)
    o.side.tick()
    assert not transport1.disconnecting
    o.reactor.advance(0.1)  # timeout/3 without a record from it
    o.side.tick()
    assert transport1.disconnecting and first not in o.side.peers
    second, link2, transport2 = o.up()
    assert second != first and second == ({A, B} - {first}).pop()
    resent = split_all(transport2.value())
    assert [k for k, _ in resent] == [Kind.HELLO, Kind.PUB] and resent[1] == pub
    assert not d.called
    link1.connectionLost(Failure(ConnectionError("aborted")))  # the old link's end changes nothing
    assert second in o.side.peers
    link2.dataReceived(encode_ack(2))
    assert d.called and d.result is None
    assert o.side.refused == 0


def test_a_lagging_replica_is_replaced_too() -> None:
    o = Owner(timeout=9.0, wait=5.0)
    d = o.side.published("t", [1], [b"one"], NOW_NS, 0.0)
    first, link1, transport1 = o.up()
    for _ in range(3):
        o.reactor.advance(1.0)
        link1.dataReceived(frame(Kind.BEAT))  # heard from, but its ACK never covers the PUB
        o.side.tick()
    assert transport1.disconnecting and first not in o.side.peers
    second, link2, _ = o.up()
    assert second != first
    link2.dataReceived(encode_ack(2))
    assert d.called and d.result is None


def test_records_resent_to_the_next_replica_get_its_own_time_to_ack() -> None:
    """A replica silent for a third of the timeout is replaced, and its unacked records go to the
    next one: that one is judged by when it was sent them, not by how long they waited on the
    silent one, so a healthy replica (and the other topics placed on it) is not dropped with it."""
    o = Owner(timeout=9.0, wait=5.0)
    t, u = topics_apart(o)
    d = o.side.published(t, [1], [b"one"], NOW_NS, 0.0)
    first, link1, _ = o.up()
    o.side.published(u, [2], [b"two"], NOW_NS, 0.0)
    second, link2, transport2 = o.up()
    link2.dataReceived(encode_ack(2))  # u's publish acked
    assert o.side.placed[u].candidate.address == second != first
    transport2.clear()
    for _ in range(3):  # the first replica is silent; the second one beats
        o.reactor.advance(1.0)
        link2.dataReceived(frame(Kind.BEAT))
        o.side.tick()
    assert first not in o.side.peers and second in o.side.peers
    assert o.side.placed[t] is o.side.placed[u]
    o.reactor.advance(0)
    assert [k for k, _ in split_all(transport2.value()) if k != Kind.BEAT] == [Kind.PUB]  # t's, resent
    o.reactor.advance(0.25)
    o.side.tick()  # the record has waited 3.25 s since its publish, 0.25 s on this replica
    assert second in o.side.peers and not transport2.disconnecting
    link2.dataReceived(encode_ack(o.side.placed[t].pending[0].number))
    assert d.called and d.result is None
    o.reactor.advance(2.8)
    link2.dataReceived(frame(Kind.BEAT))
    o.side.tick()
    assert o.side.placed[u].candidate.address == second and o.side.refused == 0


def test_a_record_handed_on_behind_newer_ones_is_refused_at_its_own_wait() -> None:
    """A lost replica's records go to the next one behind the newer records already sent there; each
    is still refused ``--replica-wait`` after its own publish, not once the newer ones ahead are due."""
    o = Owner(timeout=9.0, wait=5.0)
    t, u = topics_apart(o)
    old = o.side.published(t, [1], [b"one"], NOW_NS, 0.0)
    first, _, _ = o.up()
    o.reactor.advance(2.0)
    newer = o.side.published(u, [2], [b"two"], NOW_NS, 0.0)  # on the second replica, never acked
    second, link2, _ = o.up()
    assert o.side.placed[u].candidate.address == second != first
    o.reactor.advance(1.0)
    link2.dataReceived(frame(Kind.BEAT))
    o.side.tick()  # the first replica silent for 3 s: its record goes behind u's on the second
    assert [p.topic for p in o.side.peers[second].pending] == [u, t]
    o.reactor.advance(2.0)  # 5 s since t's publish, 3 s since u's
    link2.dataReceived(frame(Kind.BEAT))
    o.side.tick()
    assert old.called and not newer.called and o.side.refused == 1
    old.addErrback(lambda f: f.trap(ReplicaError))
    o.reactor.advance(2.0)
    link2.dataReceived(frame(Kind.BEAT))
    o.side.tick()
    assert newer.called and o.side.refused == 2
    newer.addErrback(lambda f: f.trap(ReplicaError))


def test_unplaced_records_are_refused_each_at_its_own_wait() -> None:
    """Records no replica could take are refused at their own wait's end, whatever their order."""
    o = Owner(timeout=9.0, wait=5.0)
    o.choice.candidates = {}
    late = o.side.published("t", [1], [b"one"], NOW_NS, 0.0)
    o.reactor.advance(0)  # a record a turn
    early = o.side.published("t", [2], [b"two"], NOW_NS, 0.0)
    o.reactor.advance(0)
    o.side.unplaced[1].since -= 3.0  # published 3 s before the one ahead of it
    o.reactor.advance(2.0)
    o.side.tick()
    assert early.called and not late.called and o.side.unreplicated == 1
    early.addErrback(lambda f: f.trap(ReplicaError))
    o.reactor.advance(3.0)
    o.side.tick()
    assert late.called and o.side.unreplicated == 2 and not o.side.unplaced
    late.addErrback(lambda f: f.trap(ReplicaError))


def test_a_replica_that_cannot_be_reached_is_replaced() -> None:
    o = Owner()
    d = o.side.published("t", [1], [b"one"], NOW_NS, 0.0)
    host, port, factory, _, _ = o.reactor.tcpClients[0]
    o.connected = 1
    factory.clientConnectionFailed(None, Failure(ConnectionRefusedError()))
    assert f"{host}:{port}" not in o.side.peers
    o.reactor.advance(0)  # the turn's end places its record on the next replica
    second, link2, transport2 = o.up()
    assert second != f"{host}:{port}"
    link2.dataReceived(encode_ack(2))
    assert d.called and d.result is None


def test_stop_says_bye_and_refuses_what_waits() -> None:
    o = Owner()
    d = o.side.published("t", [1], [b"one"], NOW_NS, 0.0)
    failures: list[Failure] = []
    d.addErrback(failures.append)
    _, _, transport = o.up()
    transport.clear()
    o.side.stop()
    assert kinds(transport.value()) == [Kind.BYE] and transport.disconnecting
    assert len(failures) == 1 and failures[0].check(ReplicaError)


# -- Standby -----------------------------------------------------------------------------------------


def make_standby(tmp_path: Any, executor: Any = None, topic: str = "t") -> Standby:
    log = StandbyLog(str(tmp_path), log_prefix("10.0.0.1:4151", topic), executor or SynchronousDiskExecutor(), False)
    return Standby("10.0.0.1:4151", topic, log)


def add(s: Standby, *ns: int, timestamp: int = NOW_NS, delay: float = 0.0, body: bytes | None = None) -> Deferred[None]:
    """One PUB record's messages (IDs ``mid(n)``, bodies ``m<n>``) into the standby, as the service adds them."""
    record = encode_pub(s.topic, list(ns), [body if body is not None else b"m%d" % n for n in ns], timestamp, delay)
    [(_, payload)] = split_all(record)
    _, data, values, sizes = split_pub(payload)
    s.add(data, values, sizes)
    return s.disk.written()


def held(s: Standby) -> list[bytes]:
    """The IDs the standby still counts as not done."""
    return [mid(v) for v, done in zip(s.values, s.done, strict=True) if not done]


def test_split_pub_and_read_messages_give_the_records_messages_back() -> None:
    [(_, payload)] = split_all(encode_pub("t", [1, 2], [b"a", b"bc"], NOW_NS, 0.25))
    topic, data, values, sizes = split_pub(payload)
    assert (topic, values, sizes) == ("t", [1, 2], [1, 2])
    assert read_messages(data) == [(1, NOW_NS, 250, b"a"), (2, NOW_NS, 250, b"bc")]
    assert read_messages(data[:-1]) == [(1, NOW_NS, 250, b"a")]  # a torn last one is left out
    with pytest.raises(ValueError):
        split_pub(payload[:-1])
    with pytest.raises(ValueError):
        split_pub(payload[:12])  # a header cut short


def test_a_message_goes_once_every_channel_finished_it(tmp_path: Any) -> None:
    s = make_standby(tmp_path)
    s.channel("a", True)
    s.channel("b", True)
    add(s, 1, 2)
    assert len(s) == 2 and s.live_bytes == 4 and s.disk.bytes() > 4
    s.finish("a", [mid(1)])
    assert len(s) == 2
    s.finish("b", [mid(1)])
    assert held(s) == [mid(2)] and s.live_bytes == 2
    s.finish("b", [mid(2), mid(99), b"not-hex-at-all!!"])  # IDs not held, or not IDs: nothing
    s.finish("a", [mid(2)])
    assert len(s) == 0 and s.live_bytes == 0


def test_without_channels_everything_is_kept(tmp_path: Any) -> None:
    s = make_standby(tmp_path)
    add(s, 1)
    s.empty("a")
    s.channel_gone("a")
    s.empty(None)
    assert held(s) == [mid(1)]


def owed(nsqd: NSQD, topic: str) -> dict[str, list[bytes]]:
    """Each local channel's queued messages, as the owner's IDs they were copies of (``mid(n)``, read
    from their bodies ``m<n>...``: a taken-over message has a new ID of this node's)."""
    t = nsqd.topics[topic]
    return {name: [mid(int(re.match(rb"m(\d+)", m.body).group(1))) for m in ch.memory]  # type: ignore[union-attr]
            for name, ch in t.channels.items()}


def take(s: Standby, nsqd: NSQD, clock: Clock) -> int:
    d = s.take_over(nsqd)
    for _ in range(20):
        if d.called:
            break
        clock.advance(0)
    assert d.called
    return int(d.result)


def test_a_channel_made_without_backlog_owes_only_later_messages(tmp_path: Any) -> None:
    nsqd, clock = make_nsqd()
    s = make_standby(tmp_path)
    add(s, 1)
    s.channel("a", False)
    add(s, 2)
    take(s, nsqd, clock)
    assert owed(nsqd, "t") == {"a": [mid(2)]}
    assert nsqd.topics["t"].depth() == 0


def test_take_over_counts_only_what_it_handed_in(tmp_path: Any) -> None:
    """``take_over`` "fires with how many messages were handed in": message 1 went nowhere.

    nsqtw/replica/standby.py ``Standby._hand_in`` yields 1 (and ``_mark_done``) for a message no channel
    owes (``self._owing(i)`` empty); it should yield 0 for it.
    """
    nsqd, clock = make_nsqd()
    s = make_standby(tmp_path)
    add(s, 1)
    s.channel("a", False)
    add(s, 2)
    assert take(s, nsqd, clock) == 1


def test_a_channel_made_with_backlog_owes_earlier_messages_too(tmp_path: Any) -> None:
    nsqd, clock = make_nsqd()
    s = make_standby(tmp_path)
    add(s, 1)
    s.channel("a", True)
    add(s, 2)
    assert take(s, nsqd, clock) == 2
    assert owed(nsqd, "t") == {"a": [mid(1), mid(2)]}


def test_empty_marks_a_channel_done_with_everything_so_far(tmp_path: Any) -> None:
    s = make_standby(tmp_path)
    s.channel("a", True)
    s.channel("b", True)
    add(s, 1, 2)
    s.finish("b", [mid(1)])
    s.empty("a")
    assert held(s) == [mid(2)]  # b still owes 2
    s.empty("b")
    assert len(s) == 0
    add(s, 3)
    s.empty("zzz")  # unknown: nothing
    nsqd, clock = make_nsqd()
    take(s, nsqd, clock)
    assert owed(nsqd, "t") == {"a": [mid(3)], "b": [mid(3)]}
    # one message, so one new ID in both channels (this node's, not the owner's)
    (a,), (b,) = (nsqd.topics["t"].channels[c].memory for c in "ab")
    assert a.id == b.id != mid(3)


def test_channel_gone_drops_what_only_it_owed(tmp_path: Any) -> None:
    s = make_standby(tmp_path)
    s.channel("a", True)
    s.channel("b", True)
    add(s, 1, 2)
    s.finish("a", [mid(1)])
    s.channel_gone("b")
    assert held(s) == [mid(2)]
    nsqd, clock = make_nsqd()
    take(s, nsqd, clock)
    assert owed(nsqd, "t") == {"a": [mid(2)]}


def test_a_channel_gone_or_emptied_lets_go_of_what_no_other_channel_owes_with_its_counts(tmp_path: Any) -> None:
    """Counted as FINs would: a channel made without a backlog owes only what came after it."""
    s = make_standby(tmp_path)
    s.channel("a", True)
    for n in range(1, 4):
        add(s, n, body=b"x" * n)
    s.channel("b", False)  # owes from 4 on
    for n in range(4, 7):
        add(s, n, body=b"x" * n)
    s.finish("b", [mid(5)])
    s.channel_gone("a")
    assert held(s) == [mid(4), mid(6)] and (s.live, s.live_bytes) == (2, 4 + 6)
    s.empty("b")
    assert held(s) == [] and (s.live, s.live_bytes) == (0, 0)


def test_live_id_runs_skip_what_is_done_and_split_where_the_owing_channels_change(tmp_path: Any) -> None:
    s = make_standby(tmp_path)
    s.channel("a", True)
    s.channel("b", True)
    add(s, *range(1, 11))
    s.finish("a", [mid(n) for n in range(2, 10)])
    s.finish("b", [mid(n) for n in range(2, 9)])  # 9 still owed by b
    assert list(s.live_id_runs(s.arrivals, 100)) == [(["a", "b"], [1]), (["b"], [9]), (["a", "b"], [10])]
    assert list(s.live_id_runs(s.arrivals - 2, 100)) == [(["a", "b"], [1])]  # (arrived before: 1 to 8)
    s.finish("b", [mid(1)])
    assert list(s.live_id_runs(s.arrivals, 1)) == [(["a"], [1]), (["b"], [9]), (["a", "b"], [10])]


def test_a_fin_for_an_unknown_channel_makes_it_owe_everything(tmp_path: Any) -> None:
    s = make_standby(tmp_path)
    s.channel("a", True)
    add(s, 1, 2)
    s.finish("z", [mid(1)])  # its CHANNEL went with a failed link
    assert held(s) == [mid(1), mid(2)]  # a still owes both
    s.finish("a", [mid(1)])
    assert held(s) == [mid(2)]
    nsqd, clock = make_nsqd()
    take(s, nsqd, clock)
    assert owed(nsqd, "t") == {"a": [mid(2)], "z": [mid(2)]}


def test_take_over_hands_each_owed_message_into_exactly_the_owing_channels(tmp_path: Any) -> None:
    nsqd, clock = make_nsqd()
    nsqd.get_topic("t").get_channel("local")  # a channel of this node only: owes nothing
    s = make_standby(tmp_path)
    s.channel("a", True)
    add(s, 1, timestamp=NOW_NS + 1)
    add(s, 2, timestamp=NOW_NS + 2)
    s.channel("b", False)
    add(s, 3, 4, timestamp=NOW_NS + 3)
    s.finish("a", [mid(3)])
    s.finish("b", [mid(4)])
    assert take(s, nsqd, clock) == 4  # 1, 2 (a); 3 (b); 4 (a)
    assert owed(nsqd, "t") == {"local": [], "a": [mid(1), mid(2), mid(4)], "b": [mid(3)]}
    t = nsqd.topics["t"]
    got = {m.body: m for m in t.channels["a"].memory}
    assert (got[b"m2"].timestamp, got[b"m2"].attempts) == (NOW_NS + 2, 0)
    assert got[b"m4"].timestamp == NOW_NS + 3
    # new IDs of this node's, in order, none of them the owner's (IDs are unique per node only)
    ids = [m.id for m in t.channels["a"].memory] + [m.id for m in t.channels["b"].memory]
    assert len(set(ids)) == 4 and not set(ids) & {mid(n) for n in range(1, 5)}
    assert ids[:3] == sorted(ids[:3])
    assert len(s) == 0 and s.live_bytes == 0 and s.taken_over
    assert list(tmp_path.iterdir()) == [] and s.disk.segments == []  # the log went once handed in


def test_take_over_without_channels_publishes_to_the_topic_a_slice_per_turn(tmp_path: Any) -> None:
    nsqd, clock = make_nsqd()
    s = make_standby(tmp_path)
    n = 2 * TAKEOVER_SLICE + 10
    add(s, *range(1, n + 1), body=b"x")
    d = s.take_over(nsqd)
    topic = nsqd.topics["t"]
    assert topic.depth() == TAKEOVER_SLICE and not d.called
    one_turn(clock)
    assert topic.depth() == 2 * TAKEOVER_SLICE and not d.called
    one_turn(clock)
    assert topic.depth() == n and d.called and d.result == n
    assert [m.body for m in topic.memory] == [b"x"] * n
    ids = [m.id for m in topic.memory]
    assert ids == sorted(set(ids)) and mid(1) not in ids  # new IDs of this node's, in order
    assert len(s) == 0 and s.live_bytes == 0


def test_take_over_reads_every_segment_and_skips_what_is_done(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr("nsqtw.replica.disklog.SEGMENT_BYTES", 64)
    nsqd, clock = make_nsqd()
    s = make_standby(tmp_path)
    s.channel("c", True)
    for n in range(1, 7):
        add(s, n, body=b"m%d" % n + b"x" * 58)  # a segment each
    assert len(s.disk.segments) == 6 and len(list(tmp_path.glob("*.dat"))) == 6
    s.finish("c", [mid(1), mid(2), mid(4)])
    assert take(s, nsqd, clock) == 3
    assert owed(nsqd, "t") == {"c": [mid(3), mid(5), mid(6)]}
    assert list(tmp_path.iterdir()) == []


def test_maintain_deletes_the_segments_all_done(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr("nsqtw.replica.disklog.SEGMENT_BYTES", 64)
    s = make_standby(tmp_path)
    s.channel("c", True)
    for n in range(1, 5):
        add(s, n, body=b"x" * 60)
    s.finish("c", [mid(1), mid(2), mid(4)])
    s.maintain()
    names = sorted(p.name for p in tmp_path.glob("*.dat"))
    assert len(names) == 2 and names[0].endswith(".000002.2.dat") and names[1].endswith(".000003.3.dat")
    assert names[0].startswith(log_prefix("10.0.0.1:4151", "t")) and "~t" in names[0] and ":" not in names[0]
    s.finish("c", [mid(3)])
    s.maintain()
    assert [p.name for p in tmp_path.glob("*.dat")] == [names[1]]  # the last one is kept to append to


def test_maintain_cuts_a_long_done_prefix_from_memory(tmp_path: Any) -> None:
    s = make_standby(tmp_path)
    s.channel("c", True)
    n = 5000
    add(s, *range(1, n + 1))
    s.finish("c", [mid(i) for i in range(1, 4500)])
    s.maintain()
    assert s.base == 4499 and len(s.values) == n - 4499 and held(s) == [mid(i) for i in range(4500, n + 1)]
    s.finish("c", [mid(4500), mid(4499)])  # (4499 is gone from memory: nothing)
    assert held(s)[0] == mid(4501)
    nsqd, clock = make_nsqd()
    assert take(s, nsqd, clock) == n - 4500
    assert owed(nsqd, "t")["c"] == [mid(i) for i in range(4501, n + 1)]


def test_a_taken_over_copy_never_meets_an_id_of_this_nodes_own(tmp_path: Any) -> None:
    """Two nodes with the same ``--node-id`` (every node of one host by default) make the same IDs. A
    copy handed in under its owner's ID would meet this node's own message of that ID in flight and be
    dropped as a duplicate (a loss); with a new ID of this node's, the consumer gets both."""
    nsqd, clock = make_nsqd()
    topic = nsqd.get_topic("t")
    topic.get_channel("a")
    topic.publish([1], [b"own"], NOW_NS, 0.0)  # this node's message, whose ID is the owner's mid(1)
    proto, transport = connect(nsqd, clock)
    proto.dataReceived(b"SUB t a\nRDY 10\n")
    clock.advance(0)
    [own] = [decode_message_frame(p) for t, p in take_frames(transport) if t == FRAME_TYPE_MESSAGE]
    assert own[2:] == (mid(1), b"own")  # in flight
    s = make_standby(tmp_path)
    s.channel("a", True)
    add(s, 1)  # the owner's message of the same ID
    assert take(s, nsqd, clock) == 1
    clock.advance(0)
    [copy] = [decode_message_frame(p) for t, p in take_frames(transport) if t == FRAME_TYPE_MESSAGE]
    assert copy[3] == b"m1" and copy[2] != mid(1)
    assert len(nsqd.topics["t"].channels["a"].in_flight.live) == 2


def test_a_taken_over_dpub_waits_what_is_left_of_its_delay(tmp_path: Any) -> None:
    """The PUB record carries a DPUB's delay (from its timestamp): taken over, the message is deferred
    for what is left of it, in each owing channel and in a topic without channels, and goes into the
    replica's own log with its delay (a later takeover of that log defers it too); one already due
    is ready at once. Timestamps and bodies are the owner's."""
    nsqd, clock = make_nsqd()
    s = make_standby(tmp_path)
    s.channel("a", True)
    s.channel("b", True)
    add(s, 1, delay=3600.001, timestamp=NOW_NS - 600 * 10**9)  # published 10 minutes ago
    add(s, 2, delay=5.0, timestamp=NOW_NS - 6 * 10**9)  # due a second ago
    handed: list[Any] = []
    d = s.take_over(nsqd, handed.extend)
    for _ in range(5):
        clock.advance(0)
    assert d.called
    for name in ("a", "b"):
        channel = nsqd.topics["t"].channels[name]
        assert [(m.body, m.timestamp) for m in channel.memory] == [(b"m2", NOW_NS - 6 * 10**9)]
        assert [(m.body, m.timestamp) for m in channel.deferred.live.values()] == [(b"m1", NOW_NS - 600 * 10**9)]
    assert [(body, delay_ms) for *_, body, delay_ms in handed] == [(b"m1", 3600001), (b"m2", 5000)]
    clock.advance(3000.0)
    assert [m.body for m in nsqd.topics["t"].channels["a"].memory] == [b"m2"]
    clock.advance(0.002)
    assert [m.body for m in nsqd.topics["t"].channels["a"].memory] == [b"m2", b"m1"]

    (tmp_path / "bare").mkdir()
    bare = make_standby(tmp_path / "bare", topic="u")
    add(bare, 3, delay=60.0, timestamp=NOW_NS + 3000 * 10**9)  # (the clock moved on since)
    assert take(bare, nsqd, clock) == 1
    topic = nsqd.topics["u"]
    channel = topic.get_channel("c")  # made once the topic holds it: copied with its due time
    for _ in range(3):
        clock.advance(0)
    assert not channel.memory and [m.body for m in channel.deferred.live.values()] == [b"m3"]

    node = Node(tmp_path / "node", address="10.0.0.1", incarnation="aaaaaaaaaaaaaaaa")
    node.service.owner.own["t"] = own = node.service._own_log("t")
    node.service.owner.taken_over("t", handed)
    got: list[Any] = []
    own.disk.read(0).addCallback(got.append)
    [(_, data)] = got
    assert [(body, delay_ms) for _, _, delay_ms, body in read_messages(data)] == [(b"m1", 3600001), (b"m2", 5000)]
    node.service.stopService()
    # an owner's clock ahead of this node's: never more than the whole delay
    assert still_due(NOW_NS + 10**12, 60_000, EPOCH) == 60.0 and still_due(NOW_NS, 0, EPOCH) == 0.0


# -- NSQD with a fake IReplication ----------------------------------------------------------------------


class FakeReplication:
    """An IReplication that records the core's calls; each publish waits for the test to fire it."""

    def __init__(self) -> None:
        self.copies: list[tuple[str, list[int], list[bytes], int, float, Deferred[None]]] = []
        self.fins: list[tuple[str, str, list[bytes]]] = []
        self.emptied: list[tuple[str, str | None]] = []
        self.accepted: list[Any] = []

    def published(self, topic: str, values: Any, bodies: list[bytes], timestamp: int,
                  delay: float) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        self.copies.append((topic, list(values), list(bodies), timestamp, delay, d))
        return d

    def finished(self, topic: str, channel: str, ids: list[bytes]) -> None:
        self.fins.append((topic, channel, list(ids)))

    def channel_emptied(self, topic: str, channel: str | None) -> None:
        self.emptied.append((topic, channel))

    def info(self, replica: str | None = None, owner: str | None = None) -> dict[str, Any]:
        return {"version": 1, "node": "127.0.0.1:4151", "incarnation": "0123456789abcdef", "replicas": 2}

    def upgrade(self, head: bytes) -> tuple[Any, list[bytes]]:
        return self.accept, [b"Nsqtw-Nonce: " + b"0" * 32]

    def accept(self, transport: Any) -> Any:
        proto = Recorder()
        proto.makeConnection(transport)
        self.accepted.append(proto)
        return proto

    def topic_stats(self, topic: str) -> dict[str, Any]:
        return {"peer": "10.0.0.2:4151", "state": "in_sync", "unacked": 0, "lag_ms": 0}

    def node_stats(self) -> dict[str, Any]:
        return {"replica_refused": 3, "unreplicated": 1, "takeovers": 0, "standby": []}


class Recorder:
    """The protocol an upgrade switched to: what it read, whether it was lost."""

    def __init__(self) -> None:
        self.data = b""
        self.transport: Any = None
        self.lost = False

    def makeConnection(self, transport: Any) -> None:
        self.transport = transport

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: Any) -> None:
        self.lost = True


def replicated(**options: Any) -> tuple[NSQD, Clock, FakeReplication]:
    options.setdefault("broadcast_address", "127.0.0.1")
    nsqd, clock = make_nsqd(**options)
    fake = FakeReplication()
    nsqd.replication = fake  # type: ignore[assignment]
    return nsqd, clock, fake


def test_a_publish_waits_for_its_copy() -> None:
    nsqd, clock, fake = replicated()
    d = nsqd.publish("t", [b"a", b"b"], 0.5)
    assert isinstance(d, Deferred) and not d.called
    [(topic, values, bodies, timestamp, delay, copy)] = fake.copies
    assert (topic, bodies, timestamp, delay) == ("t", [b"a", b"b"], NOW_NS, 0.5)
    assert [m.id for m in nsqd.topics["t"].memory] == [mid(v) for v in values]  # queued here meanwhile
    copy.callback(None)
    assert d.called and d.result is None


def test_a_refused_copy_fails_the_publish() -> None:
    nsqd, clock, fake = replicated()
    d = nsqd.publish("t", [b"a"])
    assert isinstance(d, Deferred)
    fake.copies[0][5].errback(ReplicaError("no replica acknowledged it"))
    failures: list[Failure] = []
    d.addErrback(failures.append)
    assert failures[0].check(ReplicaError)
    assert len(nsqd.topics["t"].memory) == 1  # the message stays queued here


def test_ephemeral_topics_are_not_replicated() -> None:
    nsqd, clock, fake = replicated()
    assert nsqd.publish("t#ephemeral", [b"a"]) is None
    assert fake.copies == []


def test_all_of_waits_for_both_and_fails_with_the_first_failure() -> None:
    first: Deferred[None] = Deferred()
    second: Deferred[None] = Deferred()
    d = all_of([first, second])
    second.callback(None)
    assert not d.called
    first.callback(None)
    assert d.called and d.result is None
    first, second = Deferred(), Deferred()
    d = all_of([first, second])
    second.errback(ReplicaError("none"))
    failures: list[Failure] = []
    d.addErrback(failures.append)
    assert len(failures) == 1 and failures[0].check(ReplicaError)
    first.callback(None)


def test_a_written_publish_waits_for_the_write_and_the_copy() -> None:
    nsqd, clock, fake = replicated(mem_queue_size=0, sync_every=1)
    d = nsqd.publish("t", [b"a"])
    assert isinstance(d, Deferred)
    for _ in range(10):
        clock.advance(0)
    assert not d.called  # written, not yet copied
    fake.copies[0][5].callback(None)
    for _ in range(10):
        clock.advance(0)
    assert d.called and d.result is None


def test_fins_are_reported_for_durable_channels_only() -> None:
    nsqd, clock, fake = replicated()
    ids = {}
    for channel in ("c", "e#ephemeral"):
        proto, transport = connect(nsqd, clock)
        proto.dataReceived(f"SUB t {channel}\nRDY 1\n".encode())
        ids[channel] = (proto, transport)
    nsqd.publish("t", [b"a"])
    for _ in range(5):
        clock.advance(0)
    for channel, (proto, transport) in ids.items():
        msgs = [decode_message_frame(p)[2] for t, p in take_frames(transport) if t == FRAME_TYPE_MESSAGE]
        assert len(msgs) == 1, channel
        proto.dataReceived(b"FIN " + msgs[0] + b"\n")
        proto.dataReceived(b"FIN " + b"0" * 16 + b"\n")  # not in flight: nothing reported
    assert fake.fins == [("t", "c", [mid(fake.copies[0][1][0])])]


def test_no_promise_for_a_replicated_topic() -> None:
    nsqd, clock, fake = replicated()
    nsqd.get_topic("t")
    nsqd.get_topic("t#ephemeral")
    assert nsqd.promise("t", 100) == 0
    assert nsqd.promise("t#ephemeral", 100) == 100
    plain, _ = make_nsqd()
    plain.get_topic("t")
    assert plain.promise("t", 100) == 100


# -- V2 and HTTP answers --------------------------------------------------------------------------------


def test_settled_maps_a_replica_error_to_a_non_fatal_failure() -> None:
    failed = settled(Failure(ReplicaError("x")))
    assert isinstance(failed, Failed) and not failed.fatal and failed.why == "no replica"
    assert settled(None) is PUBLISHED


def test_v2_pub_with_a_refused_copy_gets_a_non_fatal_error_and_goes_on() -> None:
    nsqd, clock, fake = replicated()
    proto, transport = connect(nsqd, clock)
    proto.dataReceived(encode_command(b"PUB", b"t", body=b"a") + encode_command(b"PUB", b"t", body=b"b"))
    assert take_frames(transport) == [] and len(fake.copies) == 1  # the second waits unread
    fake.copies[0][5].errback(ReplicaError("no replica acknowledged it"))
    assert take_frames(transport) == [(FRAME_TYPE_ERROR, b"E_PUB_FAILED PUB failed no replica")]
    assert not transport.disconnecting
    assert len(fake.copies) == 2  # the next command was read
    fake.copies[1][5].callback(None)
    assert take_frames(transport) == [(FRAME_TYPE_RESPONSE, b"OK")]
    proto.dataReceived(b"NOP\n")
    assert not transport.disconnecting


def test_http_pub_with_a_refused_copy_is_503_no_replica() -> None:
    nsqd, clock, fake = replicated()
    api = HTTPAPI(nsqd)
    answer = api._publish("t", [b"a"])
    assert isinstance(answer, Deferred)
    fake.copies[0][5].errback(ReplicaError("none"))
    failures: list[Failure] = []
    answer.addErrback(failures.append)
    assert failures[0].check(APIError)
    assert (failures[0].value.code, failures[0].value.text) == (503, "NO_REPLICA")  # type: ignore[attr-defined]


def http_channel(api: HTTPAPI, pristine: bool = True) -> tuple[Any, StringTransport, Clock]:
    clock = Clock()
    channel = api.site(reactor=clock).buildProtocol(None)
    transport = StringTransport()
    channel.makeConnection(transport)
    if not pristine:
        channel._pristine = False
    return channel, transport, clock


def answer_of(api: HTTPAPI, request: bytes, pristine: bool = True) -> tuple[int, bytes]:
    channel, transport, clock = http_channel(api, pristine)
    channel.dataReceived(request)
    for _ in range(5):
        clock.advance(0)
    head, _, body = transport.value().partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


GET_REPLICATION = b"GET /replication HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize("pristine", [True, False])
def test_get_replication_is_404_without_replication(pristine: bool) -> None:
    nsqd, _ = make_nsqd(broadcast_address="127.0.0.1")
    code, _ = answer_of(HTTPAPI(nsqd), GET_REPLICATION, pristine)
    assert code == 404


@pytest.mark.parametrize("pristine", [True, False])
def test_get_replication_answers_its_info(pristine: bool) -> None:
    nsqd, _, fake = replicated()
    code, body = answer_of(HTTPAPI(nsqd), GET_REPLICATION, pristine)
    assert code == 200 and json.loads(body) == fake.info()


def test_the_upgrade_switches_the_connection_to_the_link() -> None:
    nsqd, _, fake = replicated()
    channel, transport, _ = http_channel(HTTPAPI(nsqd))
    channel.dataReceived(upgrade_request("x", b"1" * 32) + b"first")
    switched = SWITCHED[:-2] + b"Nsqtw-Nonce: " + b"0" * 32 + b"\r\n\r\n"  # (the API's line, after the token)
    assert transport.value() == switched
    [proto] = fake.accepted
    assert proto.transport is transport and proto.data == b"first"
    channel.dataReceived(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")  # not HTTP any more
    assert proto.data == b"firstGET /ping HTTP/1.1\r\nHost: x\r\n\r\n" and transport.value() == switched
    channel.connectionLost(Failure(ConnectionError()))
    assert proto.lost


@pytest.mark.parametrize("request_head", [
    b"GET /replication/other HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: nsqtw-replication/1\r\n\r\n",
    b"GET /replication/link HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
])
def test_other_upgrades_are_answered_as_plain_requests(request_head: bytes) -> None:
    nsqd, _, fake = replicated()
    code, _ = answer_of(HTTPAPI(nsqd), request_head)
    assert code == 404 and fake.accepted == []


def test_no_upgrade_without_replication() -> None:
    nsqd, _ = make_nsqd(broadcast_address="127.0.0.1")
    code, _ = answer_of(HTTPAPI(nsqd), upgrade_request("x", b"1" * 32))
    assert code == 404


def test_stats_show_each_topics_replica_and_the_nodes_fields() -> None:
    nsqd, clock, fake = replicated()
    nsqd.get_topic("t")
    nsqd.get_topic("e#ephemeral")
    code, body = answer_of(HTTPAPI(nsqd), b"GET /stats?format=json HTTP/1.1\r\nHost: x\r\n\r\n")
    stats = json.loads(body)
    assert code == 200
    topics = {t["topic_name"]: t for t in stats["topics"]}
    assert topics["t"]["replica"] == fake.topic_stats("t")
    assert "replica" not in topics["e#ephemeral"]
    for key, value in fake.node_stats().items():
        assert stats[key] == value


# -- ReplicationService: the replica's side ------------------------------------------------------------


OWNER = "10.0.0.1:4151"


class Node:
    """An NSQD on a MemoryReactorClock with a ReplicationService (started: its tick runs)."""

    def __init__(self, tmp_path: Any, address: str = "10.0.0.2", incarnation: str = "bbbbbbbbbbbbbbbb",
                 timeout: float = 9.0, wait: float = 5.0, start: bool = True,
                 reactor: MemoryReactorClock | None = None, executor: Any = None, **more: Any) -> None:
        if reactor is None:
            reactor = MemoryReactorClock()
            reactor.advance(EPOCH)
        self.reactor = reactor
        self.address = address
        options = make_options(broadcast_address=address, replicas=2, replica_timeout=timeout,
                               replica_wait=wait, **more)
        self.nsqd = NSQD(options, self.reactor)
        self.nsqd.http_port = 4151
        path = tmp_path / address
        path.mkdir(parents=True, exist_ok=True)  # (a node started again on its data directory)
        (path / INCARNATION_FILE).write_text(incarnation + "\n")
        self.path = path
        self.executor = executor or SynchronousDiskExecutor()
        self.service = ReplicationService(self.nsqd, self.reactor, options, lambda: [], str(path),
                                          lambda: self.executor)
        if start:
            self.start()
        assert self.service.incarnation == incarnation or not start

    def start(self) -> None:
        """As the node's start does: the logs of a previous process read back, then the service."""
        recovered = ensureDeferred(self.service.recover())
        while not recovered.called:
            self.executor.run()  # a ManualExecutor: its jobs by hand
        self.service.startService()

    def accept(self, peer: str = "10.0.0.1") -> tuple[Link, StringTransport]:
        transport = StringTransport(peerAddress=IPv4Address("TCP", peer, 50000))
        link = self.service.accept(transport)
        self.reactor.advance(0)
        return link, transport


def hello(incarnation: str = "aaaaaaaaaaaaaaaa", started: float = 100.0, durable: bool = False) -> bytes:
    return encode_json(Kind.HELLO, {"node": OWNER, "incarnation": incarnation, "http_port": 4151,
                                    "started": started, "durable": durable, "version": 1})


def channel_record(topic: str, channel: str, backlog: bool = True) -> bytes:
    return encode_json(Kind.CHANNEL, {"topic": topic, "channel": channel, "backlog": backlog})


class Pings:
    """``http_get`` as the replica sees a silent owner: its ``/ping`` (``asked``) and, while the link is
    down, its ``/replication`` (``asked_incarnation``), whose answer names ``incarnation``."""

    def __init__(self, alive: bool, incarnation: str = "aaaaaaaaaaaaaaaa") -> None:
        self.alive = alive
        self.incarnation = incarnation
        self.asked: list[str] = []
        self.asked_incarnation: list[str] = []

    async def __call__(self, reactor: Any, url: str, timeout: float = 2.0) -> tuple[int, bytes]:
        replication = url.endswith("/replication")
        (self.asked_incarnation if replication else self.asked).append(url)
        if not self.alive:
            raise ConnectionRefusedError(url)
        if replication:
            return 200, json.dumps({"incarnation": self.incarnation, "replicas": 2}).encode()
        return 200, b"OK"


def live_owner(monkeypatch: Any, topics: list[str]) -> list[str]:
    """``http_get`` as the replica sees an owner that is alive: its ``/ping`` answers, and its
    ``/replication?replica=`` names ``topics``. Returns the URLs asked, in order."""
    asked: list[str] = []

    async def owner(reactor: Any, url: str, timeout: float = 2.0) -> tuple[int, bytes]:
        asked.append(url)
        return (200, b"OK") if url.endswith("/ping") else (200, json.dumps({"topics": topics}).encode())

    monkeypatch.setattr("nsqtw.replica.service.http_get", owner)
    return asked


def test_the_incarnation_file_is_read_and_made(tmp_path: Any) -> None:
    from nsqtw.replica.service import incarnation_of

    first = incarnation_of(str(tmp_path))
    assert len(first) == 16 and int(first, 16) >= 0
    assert incarnation_of(str(tmp_path)) == first
    assert (tmp_path / INCARNATION_FILE).read_text() == first + "\n"


def test_the_replica_holds_copies_and_acks_each_read(tmp_path: Any) -> None:
    node = Node(tmp_path)
    link, transport = node.accept()
    [(kind, payload)] = split_all(transport.value())
    assert kind == Kind.HELLO and decode_json(payload)["incarnation"] == "bbbbbbbbbbbbbbbb"
    transport.clear()
    link.dataReceived(hello() + channel_record("t", "c") + encode_pub("t", [1, 2], [b"a", b"b"], NOW_NS, 0.0))
    node.reactor.advance(0)
    assert split_all(transport.value()) == split_all(encode_ack(3))
    assert "c" in node.nsqd.topics["t"].channels  # made here as a real topic and channel
    standby = node.service.owners[OWNER].standbys["t"]
    assert held(standby) == [mid(1), mid(2)]
    transport.clear()
    link.dataReceived(encode_fin("t", "c", [mid(1)]) + frame(Kind.BEAT))
    node.reactor.advance(0)
    assert split_all(transport.value()) == split_all(encode_ack(5))
    assert held(standby) == [mid(2)]
    stats = node.service.node_stats()
    [shown] = stats["standby"]
    assert shown == {"owner": OWNER, "topic": "t", "messages": 1, "bytes": 1, "disk_bytes": standby.disk.bytes(),
                     "taken_over": False}
    node.reactor.advance(FLUSH_DELAY)  # without --durable-delivery, appends are written together after it
    assert shown["disk_bytes"] > 0 and any(p.name.endswith(".dat") for p in node.path.iterdir())
    link.dataReceived(encode_json(Kind.TOPIC_GONE, {"topic": "t"}))
    assert node.service.owners[OWNER].standbys == {}
    assert not any(p.name.endswith(".dat") for p in node.path.iterdir())  # its log went with it
    node.service.stopService()


def test_records_before_hello_or_from_itself_abort(tmp_path: Any) -> None:
    node = Node(tmp_path)
    link, transport = node.accept()
    link.dataReceived(encode_pub("t", [1], [b"a"], NOW_NS, 0.0))
    assert transport.disconnecting and node.service.owners == {}
    link, transport = node.accept()
    link.dataReceived(hello(incarnation="bbbbbbbbbbbbbbbb"))
    assert transport.disconnecting and node.service.owners == {}
    node.service.stopService()


def held_for_owner(node: Node, started: float = 100.0) -> tuple[Link, StringTransport]:
    link, transport = node.accept()
    link.dataReceived(hello(started=started) + channel_record("t", "c")
                      + encode_pub("t", [1, 2], [b"a", b"b"], NOW_NS, 0.0))
    return link, transport


def local_bodies(node: Node, topic: str = "t", channel: str = "c") -> list[bytes]:
    """What the node's channel holds (a taken-over copy has a new ID of this node's: see its body)."""
    return [m.body for m in node.nsqd.topics[topic].channels[channel].memory]


def test_takeover_after_the_timeout_when_ping_fails(tmp_path: Any, monkeypatch: Any) -> None:
    pings = Pings(alive=False)
    monkeypatch.setattr("nsqtw.replica.service.http_get", pings)
    node = Node(tmp_path, timeout=9.0)
    link, _ = held_for_owner(node)
    link.connectionLost(Failure(ConnectionError("reset")))
    node.reactor.pump([0.25] * 36)  # the first tick after the loss (0.25 s) starts the count: 9 s from then
    assert pings.asked == [] and local_bodies(node) == []
    node.reactor.advance(0.25)
    assert pings.asked == ["http://10.0.0.1:4151/ping"]
    node.reactor.advance(0)
    assert local_bodies(node) == [b"a", b"b"]
    assert node.service.takeovers == 1 and node.service.owners[OWNER].standbys == {}
    node.service.stopService()


def test_an_owner_back_with_another_incarnation_is_taken_over_without_linking_here(tmp_path: Any,
                                                                                  monkeypatch: Any) -> None:
    """A machine replaced on the owner's address may choose another replica and never link here: while
    the link is down the replica asks its ``/replication`` every second, and another incarnation there
    means its data is gone: taken over at once, not after ``--replica-timeout``. Asking a node that is
    down, or that runs on its old data, changes nothing."""
    pings = Pings(alive=False)
    monkeypatch.setattr("nsqtw.replica.service.http_get", pings)
    node = Node(tmp_path, timeout=9.0)
    link, _ = held_for_owner(node)
    link.connectionLost(Failure(ConnectionError("reset")))
    node.reactor.pump([0.25] * 8)
    assert len(pings.asked_incarnation) == 2 and local_bodies(node) == []  # down: asked, no answer
    pings.alive = True
    node.reactor.pump([0.25] * 4)
    assert len(pings.asked_incarnation) == 3 and local_bodies(node) == []  # back on its own data
    pings.incarnation = "eeeeeeeeeeeeeeee"  # its machine replaced: a new data directory
    node.reactor.pump([0.25] * 4)
    node.reactor.advance(0)
    assert pings.asked_incarnation[-1] == "http://10.0.0.1:4151/replication"
    assert local_bodies(node) == [b"a", b"b"] and node.service.takeovers == 1
    assert pings.asked == []  # long before the silence's /ping
    node.service.stopService()


def test_no_takeover_while_the_owner_answers_ping(tmp_path: Any, monkeypatch: Any) -> None:
    pings = Pings(alive=True)
    monkeypatch.setattr("nsqtw.replica.service.http_get", pings)
    node = Node(tmp_path, timeout=9.0)
    link, _ = held_for_owner(node)
    link.connectionLost(Failure(ConnectionError("reset")))
    node.reactor.pump([0.25] * 40)
    assert pings.asked and node.service.takeovers == 0 and local_bodies(node) == []


def test_a_silent_link_counts_as_lost(tmp_path: Any, monkeypatch: Any) -> None:
    pings = Pings(alive=False)
    monkeypatch.setattr("nsqtw.replica.service.http_get", pings)
    node = Node(tmp_path, timeout=9.0)
    held_for_owner(node)  # up, but the owner sends nothing more (the replica's beats go unanswered)
    node.reactor.pump([0.25] * 40)
    assert node.service.takeovers == 1 and local_bodies(node) == [b"a", b"b"]
    node.service.stopService()


def test_takeover_at_once_when_the_owner_comes_back_without_its_data(tmp_path: Any) -> None:
    node = Node(tmp_path)
    link, _ = held_for_owner(node)
    link.connectionLost(Failure(ConnectionError("reset")))
    again, transport = node.accept()
    again.dataReceived(hello(incarnation="cccccccccccccccc", started=100.0))
    node.reactor.advance(0)
    assert node.service.takeovers == 1 and local_bodies(node) == [b"a", b"b"]
    assert not transport.disconnecting and node.service.owners[OWNER].incarnation == "cccccccccccccccc"
    node.service.stopService()


@pytest.mark.parametrize("bye, durable, taken", [(False, False, True), (True, False, False), (False, True, False)])
def test_a_restart_without_bye_is_taken_over_unless_durable(tmp_path: Any, bye: bool, durable: bool,
                                                            taken: bool) -> None:
    node = Node(tmp_path)
    link, _ = held_for_owner(node, started=100.0)
    if bye:
        link.dataReceived(frame(Kind.BYE))
    link.connectionLost(Failure(ConnectionError("closed")))
    again, _ = node.accept()
    again.dataReceived(hello(started=200.0, durable=durable))
    node.reactor.advance(0)
    assert node.service.takeovers == int(taken)
    assert local_bodies(node) == ([b"a", b"b"] if taken else [])
    node.service.stopService()


def test_a_new_link_of_the_same_process_replaces_the_old_one(tmp_path: Any) -> None:
    node = Node(tmp_path)
    link, transport = held_for_owner(node, started=100.0)
    again, _ = node.accept()
    again.dataReceived(hello(started=100.0))
    assert transport.disconnecting and node.service.takeovers == 0
    assert node.service.owners[OWNER].link is again
    node.service.stopService()


def test_topic_stats_say_where_a_topics_copies_are(tmp_path: Any) -> None:
    node = Node(tmp_path, start=False)
    assert node.service.topic_stats("t") == {"peer": None, "state": "none", "unacked": 0, "lag_ms": 0}
    node.service.choice.candidates = {A: candidate(A)}
    d = node.nsqd.publish("t", [b"a"])
    assert isinstance(d, Deferred)
    node.reactor.advance(0.5)
    assert node.service.topic_stats("t") == {"peer": A, "state": "connecting", "unacked": 1, "lag_ms": 500}
    assert node.service.node_stats() == {"replica_refused": 0, "unreplicated": 0, "takeovers": 0,
                                         "taken_elsewhere": 0, "notes_waiting": 0, "standby": []}


# -- an owner and a replica, joined through the replica's HTTP channel --------------------------------


def joined(reactor: MemoryReactorClock, host: str, to: Node) -> tuple[Any, iosim.IOPump]:
    """The one link a node at ``host`` is opening (``reactor.tcpClients``), to ``to``'s port 4151,
    joined to ``to``'s HTTP API over iosim and pumped: the owner's side of the link, and the pump."""
    [(to_host, port, factory, _, _)] = reactor.tcpClients
    assert (to_host, port) == (to.address, 4151)
    client = factory.buildProtocol(None)
    server = HTTPAPI(to.nsqd).site(reactor=reactor).buildProtocol(None)
    pump = iosim.connect(server, iosim.FakeTransport(server, True, peerAddress=IPv4Address("TCP", host, 5)),
                         client, iosim.FakeTransport(client, False), clock=reactor)
    pump.flush()
    return client, pump


def test_what_a_replica_took_over_is_copied_to_its_own_replica(tmp_path: Any, monkeypatch: Any) -> None:
    """After a takeover the lost node's messages are on one machine: the replica adds them to its own
    log of the topic (new IDs, owed by the channels they went to) and sends them to its own replica,
    so a second loss soon after does not lose them."""
    monkeypatch.setattr("nsqtw.replica.service.http_get", Pings(alive=False))
    reactor = MemoryReactorClock()
    reactor.advance(EPOCH)
    replica = Node(tmp_path, address="10.0.0.2", incarnation="bbbbbbbbbbbbbbbb", reactor=reactor)
    third = Node(tmp_path, address="10.0.0.3", incarnation="cccccccccccccccc", reactor=reactor)
    replica.service.choice.candidates = {"10.0.0.3:4151": candidate("10.0.0.3:4151", "cccccccccccccccc")}
    link, _ = held_for_owner(replica)  # the owner's messages a, b on channel c; the topic placed on the third
    client, pump = joined(reactor, "10.0.0.2", third)
    assert client.connected_up

    link.connectionLost(Failure(ConnectionError("reset")))  # the owner is lost
    for _ in range(48):
        reactor.advance(0.25)
        pump.flush()
    assert replica.service.takeovers == 1 and local_bodies(replica) == [b"a", b"b"]
    new_ids = [m.id for m in replica.nsqd.topics["t"].channels["c"].memory]
    own = replica.service.owner.own["t"]
    assert held(own) == new_ids and list(own.channels) == ["c"]
    held_there = [s for state in third.service.owners.values()
                  for s in [*state.standbys.values(), *(p for ps in state.parts.values() for p in ps)]]
    assert sorted(i for s in held_there for i in held(s)) == sorted(new_ids)
    # finished here, finished there: nothing left held for them
    proto, transport = connect(replica.nsqd, reactor)
    proto.dataReceived(b"SUB t c\nRDY 10\n")
    reactor.advance(0)
    got = [decode_message_frame(p)[2] for t, p in take_frames(transport) if t == FRAME_TYPE_MESSAGE]
    assert sorted(got) == sorted(new_ids)
    proto.dataReceived(b"".join(b"FIN " + i + b"\n" for i in got))
    reactor.advance(0)
    pump.flush()
    assert len(own) == 0 and all(len(s) == 0 for s in held_there)
    replica.service.stopService()
    third.service.stopService()


def test_an_owner_and_its_replica_end_to_end(tmp_path: Any, monkeypatch: Any) -> None:
    """A publish on the owner is answered once the replica (reached by the HTTP upgrade) acks its copy;
    a FIN there drops it there; when the owner is lost the replica hands the rest to its channel."""
    monkeypatch.setattr("nsqtw.replica.service.http_get", Pings(alive=False))
    owner = Node(tmp_path, address="10.0.0.1", incarnation="aaaaaaaaaaaaaaaa", start=False)
    reactor = owner.reactor  # one clock for both
    replica = Node(tmp_path, address="10.0.0.2", incarnation="bbbbbbbbbbbbbbbb", start=False, reactor=reactor)
    owner.service.incarnation = owner.service.choice.own_incarnation = "aaaaaaaaaaaaaaaa"
    replica.service.incarnation = "bbbbbbbbbbbbbbbb"
    owner.service.choice.candidates = {"10.0.0.2:4151": candidate("10.0.0.2:4151", "bbbbbbbbbbbbbbbb")}

    owner.nsqd.get_topic("t").get_channel("c")  # placed: the owner connects
    client, pump = joined(reactor, "10.0.0.1", replica)
    assert client.connected_up and client.hello is not None and client.hello["incarnation"] == "bbbbbbbbbbbbbbbb"
    assert "c" in replica.nsqd.topics["t"].channels

    proto, transport = connect(owner.nsqd, reactor)
    proto.dataReceived(encode_command(b"PUB", b"t", body=b"one") + encode_command(b"PUB", b"t", body=b"two"))
    assert take_frames(transport) == []
    pump.flush()
    assert take_frames(transport) == [(FRAME_TYPE_RESPONSE, b"OK"), (FRAME_TYPE_RESPONSE, b"OK")]
    standby = replica.service.owners["10.0.0.1:4151"].standbys["t"]
    ids = held(standby)
    assert len(ids) == 2

    consumer, ctransport = connect(owner.nsqd, reactor)
    consumer.dataReceived(b"SUB t c\nRDY 1\n")
    reactor.advance(0)
    [(first, first_body)] = [decode_message_frame(p)[2:] for t, p in take_frames(ctransport)
                             if t == FRAME_TYPE_MESSAGE]
    assert first in ids
    consumer.dataReceived(b"FIN " + first + b"\n")
    pump.flush()
    assert held(standby) == [i for i in ids if i != first]

    # the owner is lost: nothing more comes, its /ping fails
    for _ in range(50):
        reactor.advance(0.25)
        replica.service.tick()
    assert replica.service.takeovers == 1
    assert local_bodies(replica) == [b for b in (b"one", b"two") if b != first_body]


def test_choice_and_service_wire_up(tmp_path: Any) -> None:
    node = Node(tmp_path, start=False)
    assert node.nsqd.replication is node.service and node.service in node.nsqd.listeners
    assert node.service.own_address() == "10.0.0.2:4151"
    info = node.service.info()
    assert info["replicas"] == 2 and info["node"] == "10.0.0.2:4151"



# -- the replica's disk: ACKs after the write (--durable-delivery), links paused past the bound -----------


def acks_of(transport: StringTransport) -> list[int]:
    out = [decode_ack(p) for k, p in split_all(transport.value()) if k == Kind.ACK]
    transport.clear()
    return out


def test_with_durable_delivery_the_ack_waits_for_the_write(tmp_path: Any) -> None:
    lane = ManualExecutor()
    node = Node(tmp_path, executor=lane, durable_delivery=True)
    link, transport = node.accept()
    transport.clear()
    link.dataReceived(hello() + channel_record("t", "c"))
    node.reactor.advance(0)
    assert acks_of(transport) == [2]  # nothing to write: at once
    link.dataReceived(encode_pub("t", [1], [b"a"], NOW_NS, 0.0))
    link.dataReceived(frame(Kind.BEAT))  # its ACK comes after the one before it
    node.reactor.advance(0)
    assert acks_of(transport) == []
    lane.run()
    node.reactor.advance(0)
    assert acks_of(transport) == [3, 4]
    node.service.stopService()


def test_without_durable_delivery_the_ack_does_not_wait_for_the_write(tmp_path: Any) -> None:
    lane = ManualExecutor()
    node = Node(tmp_path, executor=lane)
    link, transport = node.accept()
    transport.clear()
    link.dataReceived(hello() + channel_record("t", "c") + encode_pub("t", [1], [b"a"], NOW_NS, 0.0))
    node.reactor.advance(0)
    assert acks_of(transport) == [3] and not lane.jobs  # acked before the write is even asked for
    node.reactor.advance(FLUSH_DELAY)
    assert lane.jobs
    node.service.stopService()


def test_owners_are_not_read_while_the_standbys_writes_are_past_the_bound(tmp_path: Any) -> None:
    lane = ManualExecutor()
    node = Node(tmp_path, executor=lane, max_unwritten_bytes=100)
    link, transport = node.accept()
    link.dataReceived(hello() + channel_record("t", "c") + encode_pub("t", [1], [b"x" * 200], NOW_NS, 0.0))
    assert node.nsqd.unwritten.over() and transport.producerState == "paused"
    node.reactor.advance(FLUSH_DELAY)  # the appends go to the lane as one job
    lane.run()
    assert not node.nsqd.unwritten.over() and node.nsqd.unwritten.total == 0
    assert transport.producerState == "producing"
    node.service.stopService()


def test_start_removes_standby_files_it_cannot_read_back(tmp_path: Any) -> None:
    """Files of no log (an earlier format, a journal's rewrite cut short, segments whose journal is
    gone) are removed at the start; the node's own queues are not touched."""
    node = Node(tmp_path, start=False)
    strays = [node.path / (log_prefix("10.0.0.9:4151", "t") + ".000000.dat"),
              node.path / (log_prefix("10.0.0.9:4151", "t") + ".3.journal.tmp"),
              node.path / (log_prefix("10.0.0.9:4151", "u") + ".4.000000.0.dat")]
    for stray in strays:
        stray.write_bytes(b"old")
    other = node.path / "t.diskqueue.meta.dat"
    other.write_bytes(b"keep")
    node.start()
    assert not any(stray.exists() for stray in strays) and other.exists()
    node.service.stopService()


def test_a_topic_handed_back_during_a_takeover_keeps_its_new_copies(tmp_path: Any) -> None:
    """The owner comes back with a new incarnation (takeover of its old copies, over several turns) and
    publishes again at once: the new copies must survive the old takeover's end and be delivered later.

    nsqtw/replica/service.py ``_standby`` makes the new Standby's StandbyLog with the same
    ``log_prefix(owner, topic)`` as the one being taken over, and StandbyLog numbers segments from 0 again:
    the new copies are appended to the old ``...000000.dat``, which the old takeover then deletes
    (``self.disk.remove()`` at its end), so the new standby's log is gone and its own takeover fails
    (FileNotFoundError): messages the replica ACKed are lost. (With the real disk lane the window is
    every takeover, not only those past TAKEOVER_SLICE.)
    """
    node = Node(tmp_path)
    link, _ = node.accept()
    n = TAKEOVER_SLICE + 5
    link.dataReceived(hello(incarnation="aaaaaaaaaaaaaaaa") + channel_record("t", "c")
                      + encode_pub("t", list(range(1, n + 1)), [b"old"] * n, NOW_NS, 0.0))
    link.connectionLost(Failure(ConnectionError("reset")))
    again, _ = node.accept()
    again.dataReceived(hello(incarnation="cccccccccccccccc"))  # back without its data: takeover starts
    assert node.service.takeovers == 1
    again.dataReceived(encode_pub("t", [10**6], [b"new"], NOW_NS, 0.0))  # the same turn: a new copy
    new = node.service.owners[OWNER].standbys["t"]
    assert held(new) == [mid(10**6)]
    for _ in range(5):
        node.reactor.advance(0)  # the old takeover ends
    node.reactor.advance(FLUSH_DELAY)
    assert len(local_bodies(node)) == n
    assert all(os.path.exists(new.disk.path(s[0], s[1])) for s in new.disk.segments), "the new copy's log was deleted"
    third, _ = node.accept()
    third.dataReceived(hello(incarnation="dddddddddddddddd"))  # lost again: the new copy is handed in
    for _ in range(5):
        node.reactor.advance(0)
    assert local_bodies(node)[n:] == [b"new"]
    node.service.stopService()


def test_a_workers_publisher_refused_for_want_of_a_replica_gets_ack_no_replica() -> None:
    from nsqtw.workers import link as wlink
    from nsqtw.workers.peer import WorkerPeer
    from tests.helpers import link_records

    nsqd, clock, fake = replicated()
    peer = WorkerPeer(nsqd, clock, 0)
    transport = StringTransport()
    peer.link.makeConnection(transport)
    identity = json.dumps(connect(nsqd, clock)[0].identity()).encode()
    peer.link.dataReceived(b"".join(wlink.encode(wlink.OPEN, 7, identity)))
    peer.link.dataReceived(b"".join(wlink.encode(wlink.PUB, 1, 7, 0, b"t", [b"a"])))
    clock.advance(0)
    fake.copies[0][5].errback(ReplicaError("none"))
    clock.advance(0)
    acks = [fields for kind, fields in link_records(transport) if kind == wlink.ACK]
    assert acks == [[1, wlink.ACK_NO_REPLICA, "no replica"]]


# -- /metrics ---------------------------------------------------------------------------------------


def test_metrics_families() -> None:
    """A --replicas=2 node's scrape has the replication families from the same snapshot as /stats:
    the node's counters, each topic's replica (in sync or not, by peer) and each standby; a node
    without replication has none of them."""
    from nsqtw.observe.families import families
    from nsqtw.observe.stats import run_in_slices, snapshot_steps

    def scrape(nsqd: NSQD) -> dict[str, list[tuple[dict[str, str], float]]]:
        snap = run_in_slices(snapshot_steps(nsqd, include_clients=False, include_mem=False, extras=True),
                             nsqd.clock)
        got: list[Any] = []
        snap.addCallback(got.append)
        assert got, "the snapshot of a small node is taken at once"
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in families(got[0]):
            for sample in family.samples:
                out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
        return out

    plain, _ = make_nsqd()
    plain.get_topic("t")
    assert not [name for name in scrape(plain) if "replica" in name or "standby" in name]

    nsqd, _ = make_nsqd()
    fake = FakeReplication()
    fake.node_stats = lambda: {"replica_refused": 3, "unreplicated": 1, "takeovers": 2,  # type: ignore[method-assign]
                               "taken_elsewhere": 5, "notes_waiting": 4,
                               "standby": [{"owner": "10.0.0.9:4151", "topic": "u", "messages": 7, "bytes": 70,
                                            "disk_bytes": 182, "taken_over": False}]}
    nsqd.replication = fake
    nsqd.get_topic("t")
    nsqd.get_topic("x#ephemeral")
    got = scrape(nsqd)
    assert got["nsqtw_replica_refused_total"] == [({}, 3.0)]
    assert got["nsqtw_replica_unreplicated_total"] == [({}, 1.0)]
    assert got["nsqtw_replica_takeovers_total"] == [({}, 2.0)]
    assert got["nsqtw_replica_taken_elsewhere_total"] == [({}, 5.0)]
    assert got["nsqtw_replica_notes_waiting"] == [({}, 4.0)]
    # an ephemeral topic is never replicated: no series for it
    assert got["nsqtw_topic_replica_in_sync"] == [({"topic": "t", "peer": "10.0.0.2:4151"}, 1.0)]
    assert got["nsqtw_topic_replica_unacked"] == [({"topic": "t"}, 0.0)]
    assert got["nsqtw_topic_replica_lag_seconds"] == [({"topic": "t"}, 0.0)]
    assert got["nsqtw_standby_messages"] == [({"owner": "10.0.0.9:4151", "topic": "u"}, 7.0)]
    assert got["nsqtw_standby_bytes"] == [({"owner": "10.0.0.9:4151", "topic": "u"}, 70.0)]


class Counting(SynchronousDiskExecutor):
    """A lane that runs each job at once and notes its function's name in ``jobs``."""

    def __init__(self) -> None:
        super().__init__()
        self.jobs: list[str] = []

    def submit(self, fn: Any, *args: Any) -> Deferred[Any]:
        self.jobs.append(fn.__name__)
        return super().submit(fn, *args)


def test_a_turns_appends_are_one_disk_job_and_a_read_sees_them(tmp_path: Any) -> None:
    """With a clock, a log's appends go to the disk lane as one job, FLUSH_DELAY after the first
    (no thread hop per publish); a read asked meanwhile first sends them, so it finds every message
    appended before it."""
    lane = Counting()
    jobs = lane.jobs
    clock = Clock()
    unwritten = UnwrittenBytes(1 << 20)
    log = StandbyLog(str(tmp_path), log_prefix("10.0.0.1:4151", "t"), lane, False, clock,
                     unwritten=unwritten)
    log.append(b"a" * 10, 0)
    first = log.written()
    log.append(b"b" * 10, 1)
    written = [first, log.written()]  # (a Deferred only for who asks: none per append)
    assert jobs == [] and not any(d.called for d in written) and unwritten.total == 20
    clock.advance(FLUSH_DELAY)
    assert jobs == ["_append_all"] and all(d.called for d in written) and unwritten.total == 0
    assert log.written().called  # nothing waiting: at once
    log.append(b"c" * 10, 2)
    got: list[bytes] = []
    log.read_number(0, 0).addCallback(got.append)
    assert jobs == ["_append_all", "_append_all", "_read"]
    assert got == [b"a" * 10 + b"b" * 10 + b"c" * 10]


def test_a_logs_flush_is_never_put_off_and_a_durable_append_brings_it_forward(tmp_path: Any) -> None:
    """Appends gather for FLUSH_DELAY from the first, however many follow; with --durable-delivery
    an append goes at the turn's end even when a journal entry asked for a later flush before it."""
    lane = Counting()
    jobs = lane.jobs
    clock = Clock()
    log = StandbyLog(str(tmp_path), log_prefix("10.0.0.1:4151", "t"), lane, False, clock, journal=False)
    log.append(b"a" * 10, 0)
    clock.advance(FLUSH_DELAY * 0.6)
    log.append(b"b" * 10, 1)  # within the first's wait: written with it, not FLUSH_DELAY after it
    clock.advance(FLUSH_DELAY * 0.4)
    assert jobs == ["_append_all"]
    durable = StandbyLog(str(tmp_path), log_prefix("10.0.0.1:4151", "u"), lane, True, clock)
    durable.note(encode_json_entry(Entry.CHANNEL, 0, {"name": "c", "backlog": False}))
    clock.advance(FLUSH_DELAY / 2)
    assert jobs == ["_append_all"]  # the entry alone waits
    durable.append(b"c" * 10, 0)
    clock.advance(0)
    assert jobs == ["_append_all", "_append_all"] and durable.written().called


def test_a_replica_cut_off_from_a_live_owner_lets_go_of_topics_placed_elsewhere(tmp_path: Any,
                                                                              monkeypatch: Any) -> None:
    """The owner's link is gone for the timeout but its /ping answers: it chose another replica for
    some topics (this one was slow). The replica asks which it still holds for it and drops the
    others' copies, so a later loss of the owner is not delivered twice; the rest it keeps."""
    asked = live_owner(monkeypatch, ["t"])
    node = Node(tmp_path, timeout=9.0)
    link, _ = node.accept()
    link.dataReceived(hello() + channel_record("t", "c") + channel_record("u", "c")
                      + encode_pub("t", [1], [b"a"], NOW_NS, 0.0) + encode_pub("u", [2], [b"b"], NOW_NS, 0.0))
    dropped = node.service.owners[OWNER].standbys["u"]
    link.connectionLost(Failure(ConnectionError("reset")))
    node.reactor.pump([0.25] * 40)
    assert "http://10.0.0.1:4151/replication?replica=10.0.0.2%3A4151" in asked
    assert set(node.service.owners[OWNER].standbys) == {"t"} and dropped.disk.segments == []
    assert node.service.takeovers == 0
    node.service.stopService()


def test_a_silent_link_from_a_live_owner_is_closed_and_its_topics_placed_elsewhere_let_go(
        tmp_path: Any, monkeypatch: Any) -> None:
    """A network that drops packets between owner and replica closes nothing: the replica's end of
    the link stays open, silent. Once it has been silent for the timeout and the owner answers its
    /ping, the replica closes that link (the owner dropped it long ago) and asks which topics it
    still holds for it, as when the link closed; it never takes over a live owner."""
    asked = live_owner(monkeypatch, [])
    node = Node(tmp_path, timeout=9.0)
    link, transport = node.accept()
    link.dataReceived(hello() + channel_record("t", "c") + encode_pub("t", [1], [b"a"], NOW_NS, 0.0))
    dropped = node.service.owners[OWNER].standbys["t"]
    node.reactor.pump([0.25] * 40)  # 10 s: nothing comes, nothing is closed
    assert transport.disconnecting
    assert "http://10.0.0.1:4151/replication?replica=10.0.0.2%3A4151" in asked
    assert node.service.owners[OWNER].standbys == {} and dropped.disk.segments == []
    assert node.service.takeovers == 0
    node.service.stopService()


def test_replication_info_names_the_topics_placed_on_a_replica(tmp_path: Any) -> None:
    """GET /replication?replica=ADDRESS's answer: the topics whose copies go to that node, and those
    placed on a node whose link is not up; not those whole elsewhere."""
    from nsqtw.replica.owner import PeerLink

    node = Node(tmp_path)
    side = node.service.owner
    there = PeerLink(side, Candidate("10.0.0.3:4151", "10.0.0.3", 4151, "cccccccccccccccc"))
    elsewhere = PeerLink(side, Candidate("10.0.0.4:4151", "10.0.0.4", 4151, "dddddddddddddddd"))
    side.placed.update({"b": there, "a": there, "c": elsewhere})
    assert node.service.info("10.0.0.3:4151")["topics"] == ["a", "b", "c"]  # c's replica not linked yet
    elsewhere.link = Link(elsewhere, node.reactor)  # (up)
    assert node.service.info("10.0.0.3:4151")["topics"] == ["a", "b"]
    assert node.service.info("10.0.0.9:4151")["topics"] == ["a", "b"]
    assert "topics" not in node.service.info()
    node.service.stopService()


# -- logs that outlive their process -----------------------------------------------------------------


def state_of(s: Standby) -> tuple[Any, ...]:
    """Everything a standby's bookkeeping holds, to compare one read back with the one that wrote it."""
    return (s.base, s.arrivals, list(s.values), list(s.sizes), bytes(s.done), s.live, s.live_bytes,
            {name: (d.start, bytes(d.finished)) for name, d in s.channels.items()}, s.taken_over)


def read_back(tmp_path: Any, executor: Any = None) -> Standby:
    """The one log in ``tmp_path`` as a start reads it back."""
    [files] = read_logs(str(tmp_path), STANDBY_SUFFIX).logs
    entries = parse_entries(files.journal or b"")
    assert entries[0][0] == Entry.META
    meta = json.loads(entries[0][2])
    log = StandbyLog(str(tmp_path), files.prefix, executor or SynchronousDiskExecutor(), False, None, meta)
    return Standby.restore(meta["owner"], meta["topic"], log, files)


def journaled_standby(tmp_path: Any) -> Standby:
    log = StandbyLog(str(tmp_path), log_prefix(OWNER, "t") + ".1", SynchronousDiskExecutor(), False, None,
                     {"owner": OWNER, "topic": "t", "role": "main"})
    return Standby(OWNER, "t", log)


def snapshot(s: Standby, ns: list[int], owing: list[str]) -> None:
    [(_, payload)] = split_all(encode_snap("t", owing, pub_messages(ns, [b"m%d" % n for n in ns], NOW_NS, 0.0)))
    _, owing_, data, values, sizes = decode_snap(payload)
    s.add_snapshot(data, values, sizes, owing_)


def busy_history(s: Standby) -> None:
    """Every kind of bookkeeping a standby journals."""
    s.channel("c", True)
    add(s, 1, 2, 3)
    s.channel("d", False)  # owes 4 on only
    add(s, 4, 5, 6)
    s.finish("c", [mid(1), mid(2), mid(4)])
    s.finish("d", [mid(4)])  # 4 done
    snapshot(s, [7, 8], ["d"])  # owed by d alone
    s.channel("e", False)
    add(s, 9)
    s.empty("e")  # e owes nothing so far
    add(s, 10)
    s.channel_gone("e")
    s.finish("c", [mid(10)])


def test_a_standby_read_back_holds_exactly_what_it_held(tmp_path: Any) -> None:
    """Channels made, gone and emptied, FINs and what a SNAP brought (owed by its channels only):
    replayed from the segments and the journal, the standby is the same, message by message."""
    s = journaled_standby(tmp_path)
    busy_history(s)
    assert held(s) == [mid(3), mid(5), mid(6), mid(7), mid(8), mid(9), mid(10)]
    again = read_back(tmp_path)
    assert state_of(again) == state_of(s)
    # it goes on: appends go to a new segment (the last one may end torn), read back again
    add(again, 11)
    again.finish("c", [mid(3)])
    assert len(again.disk.segments) == 2
    assert state_of(read_back(tmp_path)) == state_of(again)


def test_a_standby_read_back_from_a_checkpoint_and_the_entries_after_it(tmp_path: Any, monkeypatch: Any) -> None:
    """A journal past its state's size is rewritten as one checkpoint (with the done prefix cut from
    memory and segments deleted); what came after it is replayed on top."""
    monkeypatch.setattr("nsqtw.replica.disklog.SEGMENT_BYTES", 64)
    monkeypatch.setattr("nsqtw.replica.standby.JOURNAL_MIN", 0)
    monkeypatch.setattr("nsqtw.replica.standby._CUT_MIN", 1)
    s = journaled_standby(tmp_path)
    busy_history(s)
    s.finish("c", [mid(3), mid(5)])
    s.finish("d", [mid(5)])  # 1 to 5 done: cut, and their segments deleted
    s.maintain()
    assert s.base == 5 and [e[0] for e in parse_entries(open(s.disk.journal_path, "rb").read())] == [
        Entry.META, Entry.CHECKPOINT]
    add(s, 11, 12)
    s.finish("d", [mid(6), mid(7)])
    snapshot(s, [13], ["c", "d"])
    assert state_of(read_back(tmp_path)) == state_of(s)


def test_a_torn_journal_or_segment_end_holds_more_never_less(tmp_path: Any) -> None:
    """A crash mid-write tears the last entry or message: a torn FIN only keeps its messages held (a
    takeover would deliver them again), a torn message was never acknowledged; the rest is read back."""
    s = journaled_standby(tmp_path)
    s.channel("c", True)
    add(s, 1, 2, 3)
    s.finish("c", [mid(1)])
    s.finish("c", [mid(2)])
    journal = s.disk.journal_path
    with open(journal, "r+b") as f:
        f.truncate(os.path.getsize(journal) - 3)  # the second FIN torn
    [(number, first, _)] = s.disk.segments
    segment = s.disk.path(number, first)
    with open(segment, "r+b") as f:
        f.truncate(os.path.getsize(segment) - 1)  # message 3 torn
    again = read_back(tmp_path)
    assert held(again) == [mid(2)] and again.arrivals == 2
    add(again, 4)  # numbered on from what is held, into a new segment
    again.finish("c", [mid(4)])
    assert held(read_back(tmp_path)) == [mid(2)]


def test_a_restarted_replica_holds_its_copies_and_takes_over_a_lost_owner(tmp_path: Any, monkeypatch: Any) -> None:
    """A replica killed and started again on its disk reads its standbys back (a node used to remove
    them at its start, so a lost owner's messages whose other copy was here were gone); the owner,
    silent for the timeout with /ping failing, is taken over from them."""
    pings = Pings(alive=False)
    monkeypatch.setattr("nsqtw.replica.service.http_get", pings)
    node = Node(tmp_path, timeout=9.0)
    link, _ = held_for_owner(node)
    link.dataReceived(encode_pub("t", [3], [b"c"], NOW_NS, 0.0) + encode_fin("t", "c", [mid(1)]))
    node.reactor.advance(FLUSH_DELAY)  # written (a kill -9 keeps what reached the system)
    before = state_of(node.service.owners[OWNER].standbys["t"])

    again = Node(tmp_path, timeout=9.0)
    state = again.service.owners[OWNER]
    assert state_of(state.standbys["t"]) == before and (state.host, state.http_port) == ("10.0.0.1", 4151)
    assert "c" in again.nsqd.topics["t"].channels  # a producer of the topic again, for lookupd
    again.reactor.pump([0.25] * 41)
    assert pings.asked and again.service.takeovers == 1
    again.reactor.advance(0)
    assert local_bodies(again) == [b"b", b"c"]
    again.service.stopService()


def test_a_takeover_cut_short_is_taken_over_again_at_the_start(tmp_path: Any) -> None:
    node = Node(tmp_path)
    held_for_owner(node)
    standby = node.service.owners[OWNER].standbys["t"]
    standby.disk.note(encode_entry(Entry.TAKEN, standby.arrivals))  # as take_over writes it first
    standby.disk.flush()
    again = Node(tmp_path)
    again.reactor.advance(0)
    assert again.service.takeovers == 1 and local_bodies(again) == [b"a", b"b"]
    assert not list(again.path.glob("*.nsqtw.standby.*"))  # handed in: the log went
    again.service.stopService()


def test_a_durable_owner_reads_its_own_log_back(tmp_path: Any) -> None:
    """With --durable-delivery a node's own log of a topic comes back with it, so a replica it chooses
    later gets the messages published before its restart too; without, it is removed (a crash lost
    what the queues held in memory, and the replica took over)."""
    node = Node(tmp_path, address="10.0.0.1", durable_delivery=True)
    node.nsqd.get_topic("t").get_channel("c")
    node.service.owner.published("t", [1, 2], [b"a", b"b"], NOW_NS, 0.0)
    node.service.owner.finished("t", "c", [mid(1)])
    node.reactor.advance(FLUSH_DELAY)
    node.service.stopService()
    again = Node(tmp_path, address="10.0.0.1", durable_delivery=True, start=False)
    again.nsqd.get_topic("t").get_channel("c")  # (nsqd.dat's, loaded before)
    again.start()
    own = again.service.owner.own["t"]
    assert held(own) == [mid(2)] and list(own.channels) == ["c"]
    assert "t" not in again.service.owner.incomplete
    again.service.stopService()
    plain = Node(tmp_path, address="10.0.0.1", start=False)
    plain.nsqd.get_topic("t")
    plain.start()
    assert plain.service.owner.own == {} and not list(plain.path.glob("*.nsqtw.standby.*"))
    assert plain.service.owner.incomplete == {"t"}  # older than its own log: its replica never lets go by SYNCED
    plain.service.stopService()


def plain_owner_restarted(tmp_path: Any, stop: Callable[[Node], None]) -> Node:
    """A node without --durable-delivery that published a to c on topics t and u (b finished on t),
    stopped by ``stop`` and started again on its data directory."""
    node = Node(tmp_path, address="10.0.0.1")
    for topic in ("t", "u"):
        node.nsqd.get_topic(topic).get_channel("c")
        node.service.owner.published(topic, [1, 2, 3], [b"a", b"b", b"c"], NOW_NS, 0.0)
    node.service.owner.finished("t", "c", [mid(2)])
    stop(node)
    again = Node(tmp_path, address="10.0.0.1", start=False)
    for topic in ("t", "u"):
        again.nsqd.get_topic(topic).get_channel("c")  # (nsqd.dat's, loaded before)
    again.start()
    return again


def clean_stop(node: Node) -> None:
    node.service.stopService()
    done = ensureDeferred(node.service.closed())  # (the node's stop calls it once its queues are closed)
    node.reactor.advance(0)
    assert done.called and done.result is None and (node.path / STOPPED_FILE).exists()


def test_an_owner_without_durable_delivery_reads_its_own_log_back_after_a_clean_stop_only(tmp_path: Any) -> None:
    """Without --durable-delivery a node's own logs come back after a stop that wrote them whole (a
    replica chosen later still gets what was published before the restart); after a crash they start
    empty, and a topic whose own log had missed messages comes back incomplete all the same."""
    def incomplete_u(node: Node) -> None:
        node.service.owner.incomplete.add("u")  # (as own_failed leaves it: a write failed)
        clean_stop(node)

    again = plain_owner_restarted(tmp_path / "clean", incomplete_u)
    assert held(again.service.owner.own["t"]) == [mid(1), mid(3)] and list(again.service.owner.own) == ["t"]
    assert again.service.owner.incomplete == {"u"} and not (again.path / STOPPED_FILE).exists()
    again.service.stopService()

    def crash(node: Node) -> None:
        node.reactor.advance(FLUSH_DELAY)  # written (a kill -9 keeps what reached the system)

    crashed = plain_owner_restarted(tmp_path / "crash", crash)
    assert crashed.service.owner.own == {} and crashed.service.owner.incomplete == {"t", "u"}
    crashed.service.stopService()


def test_the_marks_removal_reaches_the_directory_before_the_own_logs_are_read(tmp_path: Any) -> None:
    """A power loss after a start must not bring the mark back: its removal is synced to the data
    directory before read_stopped returns (and the own logs are read)."""
    (tmp_path / STOPPED_FILE).write_bytes(b'{"incomplete": ["u"]}')
    synced: list[tuple[str, bool]] = []
    found = read_stopped(str(tmp_path), sync_dir=lambda path: synced.append((path, (tmp_path / STOPPED_FILE).exists())))
    assert found == {"u"} and synced == [(str(tmp_path), False)]
    assert read_stopped(str(tmp_path), sync_dir=lambda path: synced.append((path, True))) is None and len(synced) == 1


def test_a_clean_stop_whose_own_log_writes_hang_goes_on_without_the_mark(tmp_path: Any, monkeypatch: Any) -> None:
    """A disk that hangs does not hold the stop: after SAVE_TIMEOUT it goes on, without the mark (the
    next start begins the own logs empty, as after a crash)."""
    node = Node(tmp_path, address="10.0.0.1")
    node.nsqd.get_topic("t").get_channel("c")
    node.service.owner.published("t", [1], [b"a"], NOW_NS, 0.0)
    node.service.stopService()
    monkeypatch.setattr(node.service.owner.own["t"].disk, "save", lambda checkpoint: Deferred())
    done = ensureDeferred(node.service.closed())
    node.reactor.advance(SAVE_TIMEOUT - 0.1)
    assert not done.called
    node.reactor.advance(0.1)
    assert done.called and done.result is None and not (node.path / STOPPED_FILE).exists()


def relinked(node: Node, values: list[int] | None = None,
             bodies: list[bytes] | None = None) -> tuple[Link, StringTransport]:
    """The owner (with --durable-delivery) sent copies of ``values`` (1 to 4: a to d) of topic t, its
    channel c made; that link lost, its new one (before its HELLO)."""
    link, _ = node.accept()
    link.dataReceived(hello(durable=True) + channel_record("t", "c")
                      + encode_pub("t", values or [1, 2, 3, 4], bodies or [b"a", b"b", b"c", b"d"], NOW_NS, 0.0))
    link.connectionLost(Failure(ConnectionError("reset")))
    return node.accept()


def test_a_relinked_owners_synced_lets_go_of_what_it_finished_meanwhile(tmp_path: Any) -> None:
    """FINs sent while the owner had no link here never come: once its SNAPs (every message it has not
    finished) are in, SYNCED lets go of what they did not name. A message published on the new link
    is kept, and an owner whose own log is not the whole story (``complete`` false) lets go of nothing."""
    for complete in (True, False):
        node = Node(tmp_path / str(complete))
        again, _ = relinked(node)
        again.dataReceived(hello(durable=True) + encode_pub("t", [5], [b"e"], NOW_NS, 0.0)
                           + encode_snap("t", ["c"], pub_messages([3, 4], [b"c", b"d"], NOW_NS, 0.0))
                           + encode_json(Kind.SYNCED, {"topic": "t", "complete": complete}))
        standby = node.service.owners[OWNER].standbys["t"]
        assert held(standby) == ([mid(3), mid(4), mid(5)] if complete else [mid(1), mid(2), mid(3), mid(4), mid(5)])
        node.reactor.advance(FLUSH_DELAY)
        node.service.stopService()
        assert held(Node(tmp_path / str(complete)).service.owners[OWNER].standbys["t"]) == held(standby)


def records_seen(monkeypatch: Any, node: Node) -> list[tuple[int, bytes]]:
    """Every record the node's replication takes in from its links, (kind, payload) in order."""
    seen: list[tuple[int, bytes]] = []
    real = node.service.link_record
    monkeypatch.setattr(node.service, "link_record", lambda link, kind, payload: (
        seen.append((kind, payload)), real(link, kind, payload))[1])
    return seen


def topic_of(kind: int, payload: bytes) -> str:
    """The topic a SNAP, SNAP_IDS or SYNCED record names."""
    if kind == Kind.SYNCED:
        return str(decode_json(payload)["topic"])
    return (decode_snap if kind == Kind.SNAP else decode_snap_ids)(payload)[0]


def test_an_owner_says_synced_once_its_snaps_are_all_acked(tmp_path: Any, monkeypatch: Any) -> None:
    """The owner's side: after the SNAPs of its own log (each segment once the one before was acked),
    SYNCED, ``complete`` unless the topic was here before its own log (or a write to it failed)."""
    monkeypatch.setattr("nsqtw.replica.service.http_get", Pings(alive=True))
    owner = Node(tmp_path, address="10.0.0.1", incarnation="aaaaaaaaaaaaaaaa")
    replica = Node(tmp_path, address="10.0.0.2", incarnation="bbbbbbbbbbbbbbbb", reactor=owner.reactor)
    owner.service.owner.own["t"] = own = owner.service._own_log("t")
    own.channel("c", False)
    data = pub_messages([1, 2], [b"a", b"b"], NOW_NS, 0.0)
    own.add(data, [1, 2], [1, 1])
    owner.service.owner.incomplete.add("u")
    owner.service.choice.candidates = {"10.0.0.2:4151": candidate("10.0.0.2:4151", "bbbbbbbbbbbbbbbb")}
    seen = records_seen(monkeypatch, replica)
    owner.nsqd.get_topic("t")
    owner.nsqd.get_topic("u")
    client, pump = joined(owner.reactor, "10.0.0.1", replica)
    for _ in range(4):
        owner.reactor.advance(0)
        pump.flush()
    synced = {decode_json(p)["topic"]: decode_json(p)["complete"] for k, p in seen if k == Kind.SYNCED}
    assert synced == {"t": True, "u": False}
    of_t = [k for k, p in seen if k in (Kind.SNAP_IDS, Kind.SNAP, Kind.SYNCED) and topic_of(k, p) == "t"]
    assert of_t == [Kind.SNAP_IDS, Kind.SNAP, Kind.SYNCED]  # its IDs, the bodies it lacks, then SYNCED
    owner.service.stopService()
    replica.service.stopService()


def test_with_durable_delivery_a_publish_waits_for_its_own_log_too() -> None:
    """A restart reads the own log back, and a replica told SYNCED lets go of what it does not
    name: a publish is answered once the own log's write is done too, not on the replica's ACK alone."""
    o = Owner()
    lane = ManualExecutor()
    o.side._make_own = lambda topic: Standby("self", topic, StandbyLog("/nonexistent", "x", lane, True, o.reactor))
    o.side.durable = True
    d = o.side.published("t", [1], [b"one"], NOW_NS, 0.0)
    _, link, _ = o.up()
    record = o.side.placed["t"].pending[0]
    link.dataReceived(encode_ack(record.number))
    assert record.acked and not d.called
    lane.jobs = [(job, (lambda *args: None), ()) for job, _, _ in lane.jobs]  # written (nowhere)
    lane.run()
    assert d.called and d.result is None
    second = o.side.published("t", [2], [b"two"], NOW_NS, 0.0)  # written first, then acked
    o.reactor.advance(0)
    lane.jobs = [(job, (lambda *args: None), ()) for job, _, _ in lane.jobs]
    lane.run()
    record = o.side.placed["t"].pending[0]
    assert not record.own_unwritten and not second.called
    link.dataReceived(encode_ack(record.number))
    assert second.called and second.result is None


def test_synced_after_the_done_prefix_was_cut_meanwhile(tmp_path: Any, monkeypatch: Any) -> None:
    """The done prefix may be cut from memory while the owner's SNAPs come in: what they named
    stays named."""
    monkeypatch.setattr("nsqtw.replica.standby._CUT_MIN", 1)
    node = Node(tmp_path)
    again, _ = relinked(node)
    again.dataReceived(hello(durable=True) + encode_fin("t", "c", [mid(1)])
                       + encode_snap("t", ["c"], pub_messages([3], [b"c"], NOW_NS, 0.0)))
    standby = node.service.owners[OWNER].standbys["t"]
    standby.maintain()
    assert standby.base == 1
    again.dataReceived(encode_snap("t", ["c"], pub_messages([4], [b"d"], NOW_NS, 0.0))
                       + encode_json(Kind.SYNCED, {"topic": "t", "complete": True}))
    assert held(standby) == [mid(3), mid(4)]
    node.service.stopService()


def test_an_owner_linked_again_for_one_topic_is_asked_about_the_others_it_said_nothing_of(
        tmp_path: Any, monkeypatch: Any) -> None:
    """While the owner had no link here it placed its topics elsewhere; it links again for one topic
    placed here now. The others' copies would be held until the owner is lost (and delivered twice
    then): ``T`` into the new link, the replica asks which it places here and lets go of the ones the
    link said nothing of. A topic the link brought a record of is kept whatever the answer says."""
    asked = live_owner(monkeypatch, ["t"])
    node = Node(tmp_path, timeout=9.0)
    link, _ = node.accept()
    link.dataReceived(hello(durable=True) + channel_record("t", "c") + channel_record("u", "c")
                      + channel_record("v", "c") + encode_pub("t", [1], [b"a"], NOW_NS, 0.0)
                      + encode_pub("u", [2], [b"b"], NOW_NS, 0.0) + encode_pub("v", [3], [b"c"], NOW_NS, 0.0))
    link.connectionLost(Failure(ConnectionError("reset")))
    again, _ = node.accept()
    again.dataReceived(hello(durable=True) + encode_pub("t", [4], [b"d"], NOW_NS, 0.0))
    for _ in range(16):
        node.reactor.advance(0.25)
        again.dataReceived(frame(Kind.BEAT))
    assert asked == []  # not before T
    again.dataReceived(encode_fin("v", "c", [mid(9)]))  # the link speaks of v: kept, though not placed here
    for _ in range(24):
        node.reactor.advance(0.25)
        again.dataReceived(frame(Kind.BEAT))
    assert asked == ["http://10.0.0.1:4151/replication?replica=10.0.0.2%3A4151"]  # once per link
    assert set(node.service.owners[OWNER].standbys) == {"t", "v"} and node.service.takeovers == 0
    node.service.stopService()


def test_a_replica_is_told_to_keep_topics_not_yet_whole_elsewhere(tmp_path: Any) -> None:
    """``GET /replication?replica=``'s topics: a replica lets go of the others. A topic placed nowhere
    (the replica that asks was set aside, no other candidate), or placed on a node that has not yet
    acked its records or been sent its unfinished messages, has its only whole copies there: kept."""
    o = Owner(addresses=(A, B))
    o.side._make_own = lambda topic: Standby("self", topic, StandbyLog(
        str(tmp_path), f"own.{topic}", SynchronousDiskExecutor(), False))
    o.side.published("t", [1], [b"one"], NOW_NS, 0.0)
    first, link, _ = o.up()
    other = ({A, B} - {first}).pop()
    assert o.side.still_needs(first) == {"t"}  # placed there
    assert o.side.still_needs(other) == {"t"}  # its copy not acked by the one it is placed on yet
    # its HELLO (the copy of the own log waits for it: SNAP_IDS, then nothing it lacks), and the ACK of
    # its PUB and of that
    link.dataReceived(encode_json(Kind.HELLO, {"node": first, "incarnation": "cccccccccccccccc", "version": 2})
                      + encode_ack(10))
    o.reactor.advance(0)
    assert o.side.still_needs(other) == set()  # whole on the first
    o.side.placed["t"].catching_up.add("t")
    assert o.side.still_needs(other) == {"t"}  # still being sent there
    o.side.placed["t"].catching_up.clear()
    o.choice.candidates = {}
    link.connectionLost(Failure(ConnectionError("reset")))  # placed nowhere now
    assert "t" not in o.side.placed and o.side.still_needs(other) == {"t"}


class FailingOnce:
    """A disk lane (synchronous) whose first append job writes half of what it was given, then fails
    as a full disk does."""

    def __init__(self) -> None:
        self.lane = SynchronousDiskExecutor()
        self.failed = False

    def submit(self, fn: Any, *args: Any) -> Deferred[Any]:
        if not self.failed and fn.__name__ == "_append_all" and args[0]:
            self.failed = True
            writes, _, journal, notes, _ = args
            path, data = writes[0]
            with open(path, "ab") as f:
                f.write(data[:len(data) // 2 + 5])  # (message 1, and 5 bytes of message 2)
            with open(journal, "ab") as f:
                f.write(notes[:len(notes) // 2 + 3])
            return fail(OSError(28, "No space left on device"))
        return self.lane.submit(fn, *args)

    def stop(self) -> None:
        pass


def test_a_write_that_failed_part_way_seals_its_segment_and_has_the_journal_rewritten(tmp_path: Any) -> None:
    """A full disk tears the record being appended: nothing may follow it in that file, or every later
    message and entry there is misread (the copies acked after it lost at a takeover). The next append
    starts a new segment, the next maintain rewrites the journal, and what was written is read back."""
    lane = FailingOnce()
    reported: list[Failure] = []
    log = StandbyLog(str(tmp_path), log_prefix(OWNER, "t") + ".1", lane, False, None,
                     {"owner": OWNER, "topic": "t", "role": "main"}, on_failed=reported.append)
    s = Standby(OWNER, "t", log)
    s.channel("c", True)
    failures: list[Failure] = []
    add(s, 1, 2).addErrback(failures.append)  # torn: half of it on disk, the journal's entries too
    assert failures and log.damaged and len(reported) == 1
    add(s, 3)
    s.finish("c", [mid(3)])
    add(s, 4)
    assert len(log.segments) == 2  # (3 and 4 in a segment of their own)
    s.maintain()
    assert not log.damaged
    again = read_back(tmp_path)
    # 2 was torn away (never acked: its write failed); 3 and 4 stay at their arrival numbers
    assert held(again) == [mid(1), mid(4)] and again.arrivals == s.arrivals == 4
    assert list(again.channels) == ["c"]
    nsqd, clock = make_nsqd()
    assert take(again, nsqd, clock) == 2 and owed(nsqd, "t") == {"c": [mid(1), mid(4)]}


def test_an_entry_that_cannot_be_read_ends_the_replay_and_the_start_goes_on(tmp_path: Any) -> None:
    """Bytes that are no entry (a torn one with more appended after it) stop the replay there: the
    messages stay held. A log that cannot be read at all stops no start: it is logged and left."""
    s = journaled_standby(tmp_path)
    s.channel("c", True)
    add(s, 1, 2)
    with open(s.disk.journal_path, "ab") as f:
        f.write(encode_entry(Entry.CHANNEL, 2, b"{not json"))
    s.finish("c", [mid(1)])  # after the bad entry: left out
    again = read_back(tmp_path)
    assert held(again) == [mid(1), mid(2)]

    node = Node(tmp_path / "node", start=False)
    prefix = log_prefix(OWNER, "u") + ".7"
    (node.path / f"{prefix}.000000.0.dat").write_bytes(pub_messages([1], [b"a"], NOW_NS, 0.0))
    (node.path / f"{prefix}.journal").write_bytes(
        encode_json_entry(Entry.META, 0, {"owner": OWNER, "topic": "u", "role": "main"})
        + encode_entry(Entry.CHECKPOINT, 1, b"\xff\xff\xff\xffbroken"))
    node.start()  # (raises if the log stops it)
    assert node.service.owners == {} and (node.path / f"{prefix}.journal").exists()
    node.service.stopService()


def test_without_durable_delivery_an_own_log_keeps_no_journal(tmp_path: Any) -> None:
    """An own log is read back only with --durable-delivery: without, it writes no journal (no entry
    per FIN for nothing); its segments are written as before, and a standby keeps its journal."""
    node = Node(tmp_path, address="10.0.0.1")
    node.nsqd.get_topic("t").get_channel("c")
    node.service.owner.published("t", [1, 2], [b"a", b"b"], NOW_NS, 0.0)
    node.service.owner.finished("t", "c", [mid(1)])
    node.reactor.advance(FLUSH_DELAY)
    own = node.service.owner.own["t"]
    own.maintain()
    assert [p.name.startswith("self~t.") for p in node.path.glob("*.dat")] == [True]
    assert not list(node.path.glob("self~*.journal"))
    held_for_owner(node)
    node.reactor.advance(FLUSH_DELAY)
    assert len(list(node.path.glob("10.0.0.1_4151~t.*.journal"))) == 1
    node.service.stopService()


def test_snap_ids_and_need_round_trip_and_select_messages_keeps_the_named() -> None:
    [(kind, payload)] = split_all(encode_snap_ids("t", ["c", "d"], [1, 2**63 + 5]))
    assert kind == Kind.SNAP_IDS and decode_snap_ids(payload) == ("t", ["c", "d"], [1, 2**63 + 5])
    [(kind, payload)] = split_all(encode_need("t", [7, 9]))
    assert kind == Kind.NEED and decode_need(payload) == ("t", [7, 9])
    with pytest.raises(ValueError):
        decode_need(payload[:-1])
    data = pub_messages([1, 2, 3], [b"a", b"bb", b"c"], NOW_NS, 0.0)
    assert read_messages(select_messages(data, {2, 3})) == read_messages(data)[1:]
    assert select_messages(data, set()) == b""


def test_live_id_runs_group_by_owing_channels_and_survive_a_cut_between_runs(tmp_path: Any) -> None:
    s = make_standby(tmp_path)
    s.channel("c", True)
    s.channel("d", True)
    add(s, 1, 2, 3, 4, 5)
    s.finish("d", [mid(3), mid(4)])
    s.finish("c", [mid(1)])
    s.finish("d", [mid(1)])  # 1 done
    assert list(s.live_id_runs(s.arrivals, 10)) == [(["c", "d"], [2]), (["c"], [3, 4]), (["c", "d"], [5])]
    assert list(s.live_id_runs(s.arrivals, 1))[1:3] == [(["c"], [3]), (["c"], [4])]
    assert list(s.live_id_runs(s.base + 2, 10)) == [(["c", "d"], [2])]  # arrived before ``until`` only
    runs = s.live_id_runs(s.arrivals, 10)
    assert next(runs) == (["c", "d"], [2])
    s.finish("c", [mid(2)])
    s.finish("d", [mid(2)])
    s.maintain()
    assert list(runs) == [(["c"], [3, 4]), (["c", "d"], [5])]


def test_a_relinked_replica_confirms_the_ids_it_holds_and_asks_for_the_others(tmp_path: Any) -> None:
    """SNAP_IDS: what the replica holds is confirmed (SYNCED then lets go of the rest, as after
    SNAPs), and a NEED names what it lacks."""
    node = Node(tmp_path)
    again, transport = relinked(node)
    transport.clear()
    again.dataReceived(hello(durable=True) + encode_snap_ids("t", ["c"], [3, 4, 9])
                       + encode_json(Kind.SYNCED, {"topic": "t", "complete": True}))
    needs = [decode_need(p) for k, p in split_all(transport.value()) if k == Kind.NEED]
    assert needs == [("t", [9])]
    assert held(node.service.owners[OWNER].standbys["t"]) == [mid(3), mid(4)]
    node.service.stopService()


def test_an_owner_relinking_sends_the_bodies_of_what_its_replica_lacks_only(tmp_path: Any,
                                                                            monkeypatch: Any) -> None:
    """The owner's side: its own log's IDs first (SNAP_IDS), then, as SNAPs, the bodies the replica
    named in its NEED: a message it holds costs its ID, not its body."""
    monkeypatch.setattr("nsqtw.replica.service.http_get", Pings(alive=True))
    owner = Node(tmp_path, address="10.0.0.1", incarnation="aaaaaaaaaaaaaaaa")
    replica = Node(tmp_path, address="10.0.0.2", incarnation="bbbbbbbbbbbbbbbb", reactor=owner.reactor)
    before, _ = replica.accept(peer="10.0.0.1")  # the owner's earlier link (same process): holds 1 and 2
    before.dataReceived(hello(started=owner.nsqd.start_time_precise) + channel_record("t", "c")
                        + encode_pub("t", [1, 2], [b"a", b"b"], NOW_NS, 0.0))
    before.connectionLost(Failure(ConnectionError("reset")))
    owner.service.owner.own["t"] = own = owner.service._own_log("t")
    own.channel("c", False)
    own.add(pub_messages([1, 2, 3], [b"a", b"b", b"c"], NOW_NS, 0.0), [1, 2, 3], [1, 1, 1])
    owner.service.choice.candidates = {"10.0.0.2:4151": candidate("10.0.0.2:4151", "bbbbbbbbbbbbbbbb")}
    seen = records_seen(monkeypatch, replica)
    owner.nsqd.get_topic("t")
    client, pump = joined(owner.reactor, "10.0.0.1", replica)
    for _ in range(6):
        owner.reactor.advance(0)
        pump.flush()
    assert [decode_snap_ids(p)[2] for k, p in seen if k == Kind.SNAP_IDS] == [[1, 2, 3]]
    assert [decode_snap(p)[3] for k, p in seen if k == Kind.SNAP] == [[3]]  # the one body it lacked
    assert [decode_json(p) for k, p in seen if k == Kind.SYNCED] == [{"topic": "t", "complete": True}]
    state = replica.service.owners["10.0.0.1:4151"]
    assert sorted(i for s in state.all_held() for i in held(s)) == [mid(1), mid(2), mid(3)]
    owner.service.stopService()
    replica.service.stopService()


@pytest.mark.parametrize("version, kinds", [(1, [Kind.SNAP]), (2, [Kind.SNAP_IDS])])
def test_an_owner_sends_ids_first_only_to_a_replica_that_reads_them(tmp_path: Any, version: int,
                                                                     kinds: list[int]) -> None:
    """A replica of version 1 (before SNAP_IDS) is sent its owner's log as SNAPs, bodies and all."""
    o = Owner(addresses=(A,))
    o.side._make_own = lambda topic: Standby("self", topic, StandbyLog(
        str(tmp_path), f"own.{topic}", SynchronousDiskExecutor(), False))
    o.side.published("t", [1], [b"one"], NOW_NS, 0.0)
    o.reactor.advance(0)  # the turn ends: its publishes are in the own log
    _, link, transport = o.up()
    transport.clear()
    link.dataReceived(encode_json(Kind.HELLO, {"node": A, "incarnation": "cccccccccccccccc", "version": version}))
    o.reactor.advance(0)
    sent = [k for k, _ in split_all(transport.value()) if k in (Kind.SNAP, Kind.SNAP_IDS)]
    assert sent == kinds


@pytest.mark.parametrize("held_ids", [range(1, 9), range(1, 801)], ids=["dict", "search"])
def test_confirm_takes_a_records_ids_in_one_pass(tmp_path: Any, held_ids: range, monkeypatch: Any) -> None:
    """Standby.confirm, by a dict of the span the IDs cover or, where that span is mostly IDs not named,
    a search per ID: the held ones are confirmed and owed by exactly the channels named (one journal
    FIN entry for each channel that finished them meanwhile), a message no channel owes any more is
    done, and what is not held comes back; across a topic's standbys, what none holds."""
    s = make_standby(tmp_path)
    s.channel("a", True)
    s.channel("b", True)
    add(s, *held_ids)
    s.begin_sync()
    fins: list[tuple[str, bytes]] = []
    monkeypatch.setattr(s, "_note_fin", lambda channel, ids: fins.append((channel, ids)))
    last = held_ids[-1]
    assert s.confirm([2, 3, last, 1000], ["a"]) == [1000]
    assert fins == [("b", mid(2) + mid(3) + mid(last))]  # (the entry's IDs, back to back)
    assert s.confirmed is not None and [i + 1 for i, c in enumerate(s.confirmed) if c] == [2, 3, last]
    assert s._owing(1) == ["a"] and s._owing(0) == ["a", "b"]
    assert s.confirm([1, 3], []) == []  # no channel owes them: done
    assert mid(1) not in held(s) and mid(3) not in held(s) and mid(2) in held(s)
    assert s.confirm([1, 4], ["a", "b"]) == [1]  # (done: as good as not held)
    (tmp_path / "part").mkdir()
    part = make_standby(tmp_path / "part")
    add(part, 1000)
    assert unheld([s, part], [2, 1000, 1001], ["a"]) == [1001]


def test_synced_lets_go_of_what_no_snap_named_with_its_counts(tmp_path: Any) -> None:
    """What was held before the link and neither named nor done is let go in every channel, and the
    counts follow it (message by message, as a FIN would); later arrivals are kept."""
    s = make_standby(tmp_path)
    s.channel("a", True)
    s.channel("b", True)
    for n in range(1, 7):
        add(s, n, body=b"x" * n)
    s.begin_sync()
    add(s, 7, body=b"x" * 7)  # on the new link
    s.finish("a", [mid(3)])
    s.finish("b", [mid(3)])  # done everywhere
    assert s.confirm([2, 5], ["a", "b"]) == []
    assert s.synced(True) == 3  # 1, 4 and 6
    assert held(s) == [mid(2), mid(5), mid(7)] and (s.live, s.live_bytes) == (3, 2 + 5 + 7)
    assert [s._owing(i) for i in range(7)] == [[], ["a", "b"], [], [], ["a", "b"], [], ["a", "b"]]


def test_a_snap_partly_held_adds_only_the_others_each_with_its_own_body(tmp_path: Any) -> None:
    """A SNAP naming messages the replica holds and one it lacks: the held ones are confirmed, and only
    the lacking one goes to a standby of its own, its bytes cut out of the record whole."""
    node = Node(tmp_path)
    again, _ = relinked(node, [1, 2], [b"m1", b"m2"])
    again.dataReceived(hello(durable=True)
                       + encode_snap("t", ["c"], pub_messages([1, 2, 3], [b"m1", b"m22", b"m3"], NOW_NS, 0.0)))
    [part] = node.service.owners[OWNER].parts["t"]
    assert held(part) == [mid(3)]
    node.reactor.advance(FLUSH_DELAY)
    assert take(part, node.nsqd, node.reactor) == 1 and owed(node.nsqd, "t") == {"c": [mid(3)]}
    node.service.stopService()


def test_live_runs_in_slices_give_what_one_walk_gives(tmp_path: Any) -> None:
    """Standby.live_runs looks at no more than ``most`` messages a call and says where it stopped:
    slices taken one after another give the same messages, owed by the same channels, as one walk."""
    s = make_standby(tmp_path)
    s.channel("a", True)
    s.channel("b", True)
    data = pub_messages(list(range(1, 11)), [b"m%d" % n for n in range(1, 11)], NOW_NS, 0.0)
    s.add(data, list(range(1, 11)), [2] * 9 + [3])
    s.finish("a", [mid(4), mid(5)])
    s.finish("a", [mid(7)])
    s.finish("b", [mid(7)])  # done

    def messages(runs: list[tuple[list[str], bytes]]) -> list[tuple[list[str], list[int]]]:
        return [(owing, index_messages(chunk)[0]) for owing, chunk in runs]

    whole, pos, arrival, more = s.live_runs(data, 0, s.base, s.arrivals, 100)
    assert (pos, arrival, more) == (len(data), 10, False)
    assert messages(whole) == [(["a", "b"], [1, 2, 3]), (["b"], [4, 5]), (["a", "b"], [6]), (["a", "b"], [8, 9, 10])]
    sliced: list[tuple[list[str], bytes]] = []
    pos, arrival, more, calls = 0, s.base, True, 0
    while more:
        runs, pos, arrival, more = s.live_runs(data, pos, arrival, s.arrivals, 3)
        sliced += runs
        calls += 1
    assert calls == 4
    flat = [(owing, v) for owing, values in messages(sliced) for v in values]
    assert flat == [(owing, v) for owing, values in messages(whole) for v in values]
    assert s.live_runs(data, 0, s.base, 5, 100)[1:] == (sum(24 + 2 for _ in range(5)), 5, False)  # until
    cut = data[:-2]  # a segment whose last message is cut short (its write torn): the walk ends before it
    runs, pos, arrival, more = s.live_runs(cut, 0, s.base, s.arrivals, 100)
    assert (pos, arrival, more) == (len(cut), 9, False)
    assert [v for _, values in messages(runs) for v in values] == [1, 2, 3, 4, 5, 6, 8, 9]


def test_a_segment_goes_to_a_new_replica_a_slice_a_reactor_turn(tmp_path: Any, monkeypatch: Any) -> None:
    """The owner walks its own log's segment a slice (LIVE_RUNS_SLICE messages) a reactor turn, so
    other work runs between slices; a message finished meanwhile, before its slice, is not sent."""
    monkeypatch.setattr("nsqtw.replica.owner.LIVE_RUNS_SLICE", 4)
    turns: list[Deferred[None]] = []  # each wait for a later turn, fired here one at a time

    def later_turn(clock: Any, delay: float, f: Callable[[], None]) -> Deferred[None]:
        assert delay == 0 and clock is o.reactor
        turns.append(Deferred())
        return turns[-1]
    monkeypatch.setattr("nsqtw.replica.owner.deferLater", later_turn)
    o = Owner(addresses=(A,))
    o.side._make_own = lambda topic: Standby("self", topic, StandbyLog(
        str(tmp_path), f"own.{topic}", SynchronousDiskExecutor(), False))
    o.side.published("t", list(range(1, 11)), [b"m%d" % n for n in range(1, 11)], NOW_NS, 0.0)
    o.reactor.advance(0)  # the turn ends: its publishes are in the own log
    _, link, transport = o.up()
    transport.clear()
    link.dataReceived(encode_json(Kind.HELLO, {"node": A, "incarnation": "cccccccccccccccc", "version": 1}))

    def snapped() -> list[int]:
        return [v for k, p in split_all(transport.value()) if k == Kind.SNAP for v in decode_snap(p)[3]]

    o.reactor.advance(0)
    assert snapped() == [1, 2, 3, 4] and len(turns) == 1  # one slice, then a wait for a later turn
    o.side.own["t"].finish("", [mid(6)])  # (a topic without channels: "" stands for it) done meanwhile
    turns[0].callback(None)
    o.reactor.advance(0)  # (a turn's records leave at its end)
    assert snapped() == [1, 2, 3, 4, 5, 7, 8] and len(turns) == 2
    turns[1].callback(None)
    o.reactor.advance(0)
    assert snapped() == [1, 2, 3, 4, 5, 7, 8, 9, 10] and len(turns) == 2
