"""After a takeover, the owner back on its disk is told what the replica delivered (:mod:`nsqtw.replica.notice`).

Without sockets: nodes on a ``MemoryReactorClock`` joined over twisted's
``iosim`` through the owner's HTTP channel, as in ``test_replica.py``
(whose helpers these tests share); the owner's ``/ping`` and
``/replication`` answers come from an injected ``http_get``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.test import iosim

from nsqtw.core.message import FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE
from nsqtw.nsqd.http import HTTPAPI
from nsqtw.protocol.wire import encode_command
from nsqtw.replica.notice import HOLD, HOLD_MAX, NOTE_IDS, NOTES_KEPT, notes_path, taken_elsewhere, taken_records
from nsqtw.replica.records import Kind, decode_fin, encode_json, encode_pub, encode_taken
from tests.helpers import connect, decode_message_frame, make_nsqd, take_frames
from tests.unit.test_replica import (
    NOW_NS,
    Gets,
    Node,
    Pings,
    add,
    candidate,
    joined,
    make_standby,
    mid,
    nodes,
    replicated,
    split_all,
)

OWNER_INCARNATION = "aaaaaaaaaaaaaaaa"


def test_taken_records_carry_a_channel_and_its_ids() -> None:
    [(kind, payload)] = split_all(encode_taken("t", "c", [mid(1), mid(2)]))
    assert kind == Kind.TAKEN and decode_fin(payload) == ("t", "c", [mid(1), mid(2)])


def noted_by_take_over(s: Any, nsqd: Any, clock: Any, fails: bool = False) -> dict[str, list[bytes]]:
    """What a takeover of ``s`` reports it handed in, per channel (its ``noted`` slices merged); with
    ``fails``, the takeover is expected to fail (a segment it cannot read)."""
    out: dict[str, list[bytes]] = {}
    d = s.take_over(nsqd, None, lambda owners: [out.setdefault(c, []).extend(ids) for c, ids in owners.items()])
    for _ in range(20):
        clock.advance(0)
    failures: list[Any] = []
    d.addErrback(failures.append)
    assert d.called and bool(failures) == fails, failures
    return out


def test_a_takeover_notes_each_message_it_hands_in_once_per_channel_owing_it(tmp_path: Any) -> None:
    nsqd, clock = make_nsqd()
    s = make_standby(tmp_path)
    s.channel("c", True)
    s.channel("d", True)
    add(s, 1, 2, 3)
    s.finish("c", [mid(1)])
    s.finish("d", [mid(2)])
    s.finish("c", [mid(3)])
    s.finish("d", [mid(3)])  # 3 done everywhere
    assert noted_by_take_over(s, nsqd, clock) == {"c": [mid(2)], "d": [mid(1)]}
    os.makedirs(tmp_path / "bare")
    bare = make_standby(tmp_path / "bare", topic="u")
    add(bare, 7)
    assert noted_by_take_over(bare, nsqd, clock) == {"": [mid(7)]}  # no channel yet: into the topic


def test_what_a_takeover_could_not_read_is_not_noted(tmp_path: Any) -> None:
    """A message held in memory whose segment cannot be read (a failed write, a lost file) is not
    handed in, so the owner is not told of it: it still delivers it."""
    nsqd, clock = make_nsqd()
    s = make_standby(tmp_path)
    s.channel("c", True)
    add(s, 1, 2)
    segments = [name for name in os.listdir(tmp_path) if not name.endswith(".journal")]
    assert segments
    for name in segments:
        os.unlink(tmp_path / name)
    assert len(s) == 2 and noted_by_take_over(s, nsqd, clock, fails=True) == {}


def test_taken_records_hold_at_most_note_ids_each() -> None:
    ids = [mid(i) for i in range(NOTE_IDS + 2)]
    records, count = taken_records("t", {"c": ids})
    assert count == NOTE_IDS + 2
    assert [decode_fin(split_all(r)[0][1]) for r in records] == [("t", "c", ids[:NOTE_IDS]), ("t", "c", ids[NOTE_IDS:])]


def test_a_channel_leaves_out_what_a_replica_delivered_and_finishes_it_for_replication() -> None:
    """Memory and disk alike (``--mem-queue-size=2``): the IDs named are never delivered, each is
    finished for the topic's replica once, and delivery goes on past a read left out entirely."""
    nsqd, clock, fake = replicated(mem_queue_size=2)
    channel = nsqd.get_topic("t").get_channel("c")
    nsqd.publish("t", [b"m%d" % i for i in range(8)])
    clock.advance(0)
    values = fake.copies[0][1]
    ids = [mid(v) for v in values]
    taken = [ids[0], ids[3], ids[4], ids[5], ids[6], mid(999)]  # 999: never here (delivered before)
    channel.drop_taken(taken)
    proto, transport = connect(nsqd, clock)
    proto.dataReceived(b"SUB t c\nRDY 1\n")
    got = []
    for _ in range(20):
        clock.advance(0)
        msgs = [decode_message_frame(p) for t, p in take_frames(transport) if t == FRAME_TYPE_MESSAGE]
        for _, _, msg_id, body in msgs:
            got.append(body)
            proto.dataReceived(b"FIN " + msg_id + b"\n")
    assert sorted(got) == [b"m1", b"m2", b"m7"]  # (disk and memory: no order promised)
    left_out = [i for _, c, batch in fake.fins if c == "c" for i in batch if i not in (ids[1], ids[2], ids[7])]
    assert sorted(left_out) == sorted(taken[:-1])
    assert channel.taken_elsewhere == set()  # the channel emptied: the ID never seen is forgotten


def test_a_topic_without_channels_leaves_out_what_a_replica_delivered_from_each_channel_made_while_it_holds_them(
        monkeypatch: Any) -> None:
    """A replica that took over a topic with no channel noted its IDs for the topic itself (``""``):
    the owner's topic, still without a channel, keeps them, and each channel made while the topic
    holds messages leaves them out (memory and disk: ``--mem-queue-size=2``), a channel emptied
    between two of the topic's batches included; a channel made once the topic is empty forgets them."""
    monkeypatch.setattr("nsqtw.core.topic.TOPIC_BATCH", 2)  # (its consumer drains each batch)
    nsqd, clock, fake = replicated(mem_queue_size=2)
    topic = nsqd.get_topic("t")
    nsqd.publish("t", [b"m%d" % i for i in range(6)])
    clock.advance(0)
    ids = [mid(v) for v in fake.copies[0][1]]
    assert taken_elsewhere(nsqd, "10.0.0.2:4151", "t", "", [ids[0], ids[2], ids[5]]) == 3
    assert topic.taken_elsewhere == {ids[0], ids[2], ids[5]}
    topic.get_channel("d")  # made, then read later; c made by its consumer's SUB, read at once
    subscribed = {}
    for name in ("c", "d"):
        proto, transport = connect(nsqd, clock)
        proto.dataReceived(b"SUB t %s\nRDY 10\n" % name.encode())
        subscribed[name] = proto, transport
        clock.advance(0)
    for name, (proto, transport) in subscribed.items():
        got = []
        for _ in range(20):
            clock.advance(0)
            for _, _, msg_id, body in [decode_message_frame(p) for t, p in take_frames(transport)
                                       if t == FRAME_TYPE_MESSAGE]:
                got.append(body)
                proto.dataReceived(b"FIN " + msg_id + b"\n")
        assert sorted(got) == [b"m1", b"m3", b"m4"], name
    assert topic.get_channel("e").taken_elsewhere == set() and topic.taken_elsewhere == set()


def published(owner: Node, replica: Node, reactor: MemoryReactorClock, bodies: list[bytes]) -> Any:
    """The owner with channel ``c`` of topic ``t`` placed on the replica, ``bodies`` published there and
    acknowledged; the owner's end of the link and its pump."""
    owner.service.incarnation = owner.service.choice.own_incarnation = OWNER_INCARNATION
    owner.service.choice.candidates = {"10.0.0.2:4151": candidate("10.0.0.2:4151", "bbbbbbbbbbbbbbbb")}
    owner.nsqd.get_topic("t").get_channel("c")
    client, pump = joined(reactor, "10.0.0.1", replica)
    proto, _ = connect(owner.nsqd, reactor)
    proto.dataReceived(b"".join(encode_command(b"PUB", b"t", body=b) for b in bodies))
    pump.flush()
    return client, pump


def notice_joined(reactor: MemoryReactorClock, to: Node) -> iosim.IOPump:
    """The newest connection the replica opened (its notice), joined to the owner's HTTP API."""
    host, port, factory, _, _ = reactor.tcpClients[-1]
    assert (host, port) == (to.address, 4151)
    client = factory.buildProtocol(None)
    server = HTTPAPI(to.nsqd).site(reactor=reactor).buildProtocol(None)
    pump: iosim.IOPump = iosim.connect(
        server, iosim.FakeTransport(server, True, peerAddress=IPv4Address("TCP", "10.0.0.2", 6)),
        client, iosim.FakeTransport(client, False), clock=reactor)
    pump.flush()
    return pump


def owner_messages(owner: Node, rdy: int = 100) -> list[tuple[bytes, bytes]]:
    """What a consumer of the owner's channel ``c`` receives now: (ID, body) each."""
    proto, transport = connect(owner.nsqd, owner.reactor)
    proto.dataReceived(b"SUB t c\nRDY %d\n" % rdy)
    for _ in range(5):
        owner.reactor.advance(0)
    return [decode_message_frame(p)[2:] for t, p in take_frames(transport) if t == FRAME_TYPE_MESSAGE]


def lost_and_taken_over(tmp_path: Any, monkeypatch: Any) -> tuple[Node, Node, Pings]:
    """An owner and its replica; the owner silent with its /ping failing: the replica takes over."""
    pings = Pings(alive=False, incarnation=OWNER_INCARNATION)
    monkeypatch.setattr("nsqtw.replica.notice.http_get", pings)
    monkeypatch.setattr("nsqtw.replica.service.http_get", pings)
    owner = Node(tmp_path, address="10.0.0.1", incarnation=OWNER_INCARNATION, start=False)
    reactor = owner.reactor
    replica = Node(tmp_path, address="10.0.0.2", incarnation="bbbbbbbbbbbbbbbb", reactor=reactor)  # (its tick runs)
    client, _ = published(owner, replica, reactor, [b"one", b"two", b"three"])
    client.connectionLost(Failure(ConnectionError("the owner's machine went away")))
    for _ in range(50):
        reactor.advance(0.25)
    assert replica.service.takeovers == 1
    return owner, replica, pings


def test_an_owner_back_on_its_disk_is_told_and_delivers_none_of_what_its_replica_did(
        tmp_path: Any, monkeypatch: Any) -> None:
    """The replica writes down what its takeover handed in (a file that outlives it), asks the owner's
    /replication every second, and once the same incarnation answers sends the notes on a notice
    link: the owner leaves those messages out, and the notes are forgotten."""
    owner, replica, pings = lost_and_taken_over(tmp_path, monkeypatch)
    state = replica.service.owners["10.0.0.1:4151"]
    assert state.noted == 3 and replica.service.node_stats()["notes_waiting"] == 3
    path = notes_path(str(replica.path), "10.0.0.1:4151")
    assert os.path.exists(path)
    asked = len(pings.asked_incarnation)
    owner.reactor.advance(1.0)
    assert len(pings.asked_incarnation) > asked and state.notes  # down: asked again, kept

    pings.alive = True  # back, on its disk
    clients = len(owner.reactor.tcpClients)
    owner.reactor.advance(1.0)
    owner.reactor.advance(0)
    assert len(owner.reactor.tcpClients) == clients + 1
    ended: list[dict[str, Any]] = []
    notice_lost = owner.service.notices.notice_lost
    monkeypatch.setattr(owner.service.notices, "notice_lost", lambda link: [ended.append(link.hello),
                                                                             notice_lost(link)])
    pump = notice_joined(owner.reactor, owner)
    pump.flush()
    assert owner.service.taken_elsewhere == 3 and owner.service.node_stats()["taken_elsewhere"] == 3
    assert [h["records"] for h in ended] == [1]  # (how many records of notes it carried: all read)
    assert state.notes == [] and state.noted == 0 and not os.path.exists(path)
    assert owner_messages(owner) == []  # every message was the replica's to deliver
    owner.service.stopService()
    replica.service.stopService()


def test_an_owner_back_without_its_data_is_not_told(tmp_path: Any, monkeypatch: Any) -> None:
    owner, replica, pings = lost_and_taken_over(tmp_path, monkeypatch)
    state = replica.service.owners["10.0.0.1:4151"]
    pings.alive, pings.incarnation = True, "eeeeeeeeeeeeeeee"  # a new data directory at its address
    clients = len(owner.reactor.tcpClients)
    owner.reactor.advance(1.0)
    owner.reactor.advance(0)
    assert state.notes == [] and len(owner.reactor.tcpClients) == clients
    assert not os.path.exists(notes_path(str(replica.path), "10.0.0.1:4151"))
    replica.service.stopService()


def test_the_notes_outlive_the_replicas_process(tmp_path: Any, monkeypatch: Any) -> None:
    owner, replica, pings = lost_and_taken_over(tmp_path, monkeypatch)
    replica.service.stopService()
    again = Node(tmp_path, address="10.0.0.2", incarnation="bbbbbbbbbbbbbbbb", reactor=owner.reactor)
    state = again.service.owners["10.0.0.1:4151"]
    assert state.noted == 3 and state.notes_for == OWNER_INCARNATION and (state.host, state.http_port) == (
        "10.0.0.1", 4151)
    assert sorted(i for r in state.notes for i in decode_fin(split_all(r)[0][1])[2]) == sorted(
        [i for i, _ in owner_messages(owner)])  # (the owner, not told: every one of them)
    again.service.stopService()


def test_a_notice_link_takes_taken_records_only_and_for_this_incarnation(tmp_path: Any) -> None:
    node = Node(tmp_path, address="10.0.0.1", incarnation=OWNER_INCARNATION)
    notice = {"node": "10.0.0.2:4151", "incarnation": "bbbbbbbbbbbbbbbb", "http_port": 4151, "role": "notice"}
    stale, stale_transport = node.accept(peer="10.0.0.2")
    stale.dataReceived(encode_json(Kind.HELLO, {**notice, "owner_incarnation": "cccccccccccccccc"}))
    assert stale_transport.disconnecting  # for an older data directory at this address: refused
    link, transport = node.accept(peer="10.0.0.2")
    link.dataReceived(encode_json(Kind.HELLO, {**notice, "owner_incarnation": OWNER_INCARNATION}))
    assert not transport.disconnecting and node.service.owners == {}  # no owner's state made for it
    link.dataReceived(encode_pub("t", [1], [b"x"], NOW_NS, 0.0))
    assert transport.disconnecting and "t" not in node.nsqd.topics  # a notice carries no copies
    node.service.stopService()


def test_an_owner_linking_back_is_told_without_waiting_for_the_next_ask(tmp_path: Any, monkeypatch: Any) -> None:
    """Its HELLO on a new link names the incarnation of the notes: they go at the next tick."""
    owner, replica, pings = lost_and_taken_over(tmp_path, monkeypatch)
    state = replica.service.owners["10.0.0.1:4151"]
    pings.alive = True
    link, _ = replica.accept(peer="10.0.0.1")
    state.noted_at = owner.reactor.seconds()  # just asked: only the HELLO makes it ask again now
    link.dataReceived(encode_json(Kind.HELLO, {"node": "10.0.0.1:4151", "incarnation": OWNER_INCARNATION,
                                               "http_port": 4151, "started": 200.0, "durable": True,
                                               "version": 1}))
    asked = len(pings.asked_incarnation)
    owner.reactor.advance(0.25)
    assert len(pings.asked_incarnation) == asked + 1
    owner.service.stopService()
    replica.service.stopService()



def test_a_start_holds_the_delivery_of_the_topics_it_found_for_a_moment(tmp_path: Any) -> None:
    """So that a replica's notes come before the owner delivers what they name: the channels a start
    finds deliver nothing for HOLD seconds (no lookupd answers here); channels made afterwards are not
    held."""
    node = Node(tmp_path, address="10.0.0.1", incarnation=OWNER_INCARNATION, start=False)
    node.nsqd.get_topic("t").get_channel("c")
    node.nsqd.get_topic("t").publish([1, 2], [b"x", b"y"], NOW_NS, 0.0)
    node.start()
    proto, transport = connect(node.nsqd, node.reactor)
    proto.dataReceived(b"SUB t c\nRDY 10\n")
    node.reactor.advance(HOLD - 0.01)
    assert take_frames(transport) == [(FRAME_TYPE_RESPONSE, b"OK")]  # SUB's; no message yet
    assert not node.nsqd.get_topic("u").get_channel("d").held
    node.reactor.advance(0.01)
    node.reactor.advance(0)
    got = [decode_message_frame(p)[3] for t, p in take_frames(transport) if t == FRAME_TYPE_MESSAGE]
    assert sorted(got) == [b"x", b"y"]
    node.service.stopService()


def test_a_start_holds_a_topic_it_found_without_channels_from_those_made_meanwhile(tmp_path: Any) -> None:
    """A topic the start finds without a channel copies nothing for HOLD seconds to a channel a
    consumer makes meanwhile (its replica's notes name the topic's messages for every channel)."""
    node = Node(tmp_path, address="10.0.0.1", incarnation=OWNER_INCARNATION, start=False)
    node.nsqd.get_topic("t").publish([1, 2], [b"x", b"y"], NOW_NS, 0.0)
    node.start()
    proto, transport = connect(node.nsqd, node.reactor)
    proto.dataReceived(b"SUB t c\nRDY 10\n")  # makes the channel
    node.reactor.advance(HOLD - 0.01)
    assert take_frames(transport) == [(FRAME_TYPE_RESPONSE, b"OK")] and node.nsqd.topics["t"].depth() == 2
    node.reactor.advance(0.01)
    for _ in range(3):
        node.reactor.advance(0)
    got = [decode_message_frame(p)[3] for t, p in take_frames(transport) if t == FRAME_TYPE_MESSAGE]
    assert sorted(got) == [b"x", b"y"]
    node.service.stopService()


def started_with_peers(tmp_path: Any, peers: dict[str, Any],
                       lookupds: list[str] | None = None) -> tuple[Node, Any, Gets]:
    """A node started on a topic ``t`` with channel ``c`` holding two messages, whose lookupd names
    the ``peers`` (address -> its ``/replication`` answer); a consumer on ``t/c`` with RDY 10.
    ``lookupds``: the HTTP addresses of the lookupds known (read as the node reads them: a list
    the test may add to later), ``lookupd:4161`` unless given."""
    node = Node(tmp_path, address="10.0.0.1", incarnation=OWNER_INCARNATION, start=False)
    node.nsqd.get_topic("t").get_channel("c")
    node.nsqd.get_topic("t").publish([1, 2], [b"x", b"y"], NOW_NS, 0.0)
    gets = Gets({"http://lookupd:4161/nodes": nodes("10.0.0.1:4151", *peers),
                 **{f"http://{a}/replication": answer for a, answer in peers.items()}})
    node.service.choice._get = gets
    known = ["lookupd:4161"] if lookupds is None else lookupds
    node.service.choice.lookupd_addresses = lambda: known
    node.start()
    proto, transport = connect(node.nsqd, node.reactor)
    proto.dataReceived(b"SUB t c\nRDY 10\n")
    return node, transport, gets


def peer(incarnation: str, notes_for: str | None = None) -> tuple[int, bytes]:
    info: dict[str, Any] = {"version": 2, "incarnation": incarnation, "replicas": 2}
    if notes_for is not None:
        info["notes"] = {"incarnation": notes_for, "messages": 2}
    return 200, json.dumps(info).encode()


def delivered(node: Node, transport: Any) -> list[bytes]:
    for _ in range(3):
        node.reactor.advance(0)
    return sorted(decode_message_frame(p)[3] for t, p in take_frames(transport) if t == FRAME_TYPE_MESSAGE)


def delivered_from(node: Node, transport: Any, seconds: float) -> list[bytes]:
    """What the consumer gets once ``seconds`` after the start are up, having got nothing before."""
    node.reactor.advance(seconds - 0.01)
    assert delivered(node, transport) == []
    node.reactor.advance(0.01)
    return delivered(node, transport)


def test_a_start_delivers_at_once_when_no_replica_holds_notes_for_this_incarnation(tmp_path: Any) -> None:
    """Its first read of lookupd asks every node's /replication with ?owner=: none holds notes for
    this node's incarnation (notes for an older one are dropped there), so nothing is held; while a
    node that lookupd names does not answer, the hold lasts HOLD."""
    node, transport, gets = started_with_peers(tmp_path, {"10.0.0.2:4151": peer("bbbbbbbbbbbbbbbb"),
                                                          "10.0.0.3:4151": peer("cccccccccccccccc", "0" * 16)})
    assert "http://10.0.0.2:4151/replication" in gets.asked
    assert delivered(node, transport) == [b"x", b"y"]
    node.service.stopService()

    # a node lookupd names that does not answer might hold some: HOLD, as when no lookupd answers
    again, transport, _ = started_with_peers(tmp_path / "again", {"10.0.0.2:4151": peer("bbbbbbbbbbbbbbbb"),
                                                                  "10.0.0.3:4151": ConnectionRefusedError()})
    assert delivered_from(again, transport, HOLD) == [b"x", b"y"]
    again.service.stopService()


def test_a_lookupd_that_answers_identify_after_the_start_is_read_at_once(tmp_path: Any) -> None:
    """The node learns a lookupd's HTTP address from its IDENTIFY answer, after the start's first
    read found none: it reads /nodes then, and the hold ends, not a poll later."""
    known: list[str] = []
    node, transport, gets = started_with_peers(tmp_path, {"10.0.0.2:4151": peer("bbbbbbbbbbbbbbbb")}, known)
    assert delivered(node, transport) == [] and gets.asked == []
    known.append("lookupd:4161")
    node.service.lookupd_identified()
    assert gets.asked == ["http://lookupd:4161/nodes", "http://10.0.0.2:4151/replication"]
    assert delivered(node, transport) == [b"x", b"y"]
    node.service.stopService()


def test_a_start_waits_for_the_notes_a_replica_says_it_holds_until_its_notice_link_ends(tmp_path: Any) -> None:
    """A replica whose answer names notes for this incarnation: the hold lasts past HOLD until its
    notice link ended (what it names left out), and at most HOLD_MAX if it never comes."""
    node, transport, _ = started_with_peers(tmp_path, {"10.0.0.2:4151": peer("bbbbbbbbbbbbbbbb", OWNER_INCARNATION)})
    node.reactor.advance(HOLD + 1)
    assert delivered(node, transport) == []
    link, _ = node.accept(peer="10.0.0.2")
    link.dataReceived(encode_json(Kind.HELLO, {"node": "10.0.0.2:4151", "incarnation": "bbbbbbbbbbbbbbbb",
                                               "role": "notice", "owner_incarnation": OWNER_INCARNATION})
                      + encode_taken("t", "c", [mid(1)]))
    assert delivered(node, transport) == []
    link.connectionLost(Failure(ConnectionError("closed")))
    assert delivered(node, transport) == [b"y"]
    node.service.stopService()

    again, transport, _ = started_with_peers(tmp_path / "again", {
        "10.0.0.2:4151": peer("bbbbbbbbbbbbbbbb", OWNER_INCARNATION)})
    assert delivered_from(again, transport, HOLD_MAX) == [b"x", b"y"]
    again.service.stopService()


def test_a_notice_link_that_breaks_before_all_its_notes_came_keeps_the_hold(tmp_path: Any) -> None:
    """Its HELLO says how many records of notes it carries: a link that ends after fewer leaves the
    delivery held (what came is left out already); the replica's next link, with them all, ends it."""
    node, transport, _ = started_with_peers(tmp_path, {"10.0.0.2:4151": peer("bbbbbbbbbbbbbbbb", OWNER_INCARNATION)})
    hello = encode_json(Kind.HELLO, {"node": "10.0.0.2:4151", "incarnation": "bbbbbbbbbbbbbbbb", "role": "notice",
                                     "owner_incarnation": OWNER_INCARNATION, "records": 2})
    broken, _ = node.accept(peer="10.0.0.2")
    broken.dataReceived(hello + encode_taken("t", "c", [mid(1)]))
    broken.connectionLost(Failure(ConnectionError("reset by peer")))
    node.reactor.advance(HOLD + 1)
    assert delivered(node, transport) == []
    link, _ = node.accept(peer="10.0.0.2")
    link.dataReceived(hello + encode_taken("t", "c", [mid(1)]) + encode_taken("t", "c", [mid(2)]))
    link.connectionLost(Failure(ConnectionError("closed")))
    assert delivered(node, transport) == []  # both named: none left to deliver here
    assert node.service.taken_elsewhere == 3 and node.nsqd.topics["t"].channels["c"].depth() == 0
    node.service.stopService()


def test_a_read_of_lookupd_that_ends_after_the_stop_changes_nothing(tmp_path: Any) -> None:
    node = Node(tmp_path, address="10.0.0.1", incarnation=OWNER_INCARNATION, start=False)
    node.nsqd.get_topic("t").get_channel("c")
    node.start()  # (no lookupd: the hold's HOLD runs)
    node.service.stopService()
    notes = {"notes": {"incarnation": OWNER_INCARNATION, "messages": 1}}
    node.service.notices.peers_answered({"10.0.0.2:4151": notes}, [], OWNER_INCARNATION)
    node.service.notices.notice_ended("10.0.0.2:4151")
    assert not [c for c in node.reactor.getDelayedCalls() if c.active() and "_release_held" in repr(c)]


def test_a_replica_answers_an_owner_asking_with_the_incarnation_its_notes_are_for(
        tmp_path: Any, monkeypatch: Any) -> None:
    """And sends them at its next tick, not after the next second's ask."""
    owner, replica, pings = lost_and_taken_over(tmp_path, monkeypatch)
    state = replica.service.owners["10.0.0.1:4151"]
    state.noted_at = owner.reactor.seconds()
    assert "notes" not in replica.service.info(owner="10.0.0.9:4151")
    assert replica.service.info(owner="10.0.0.1:4151")["notes"] == {"incarnation": OWNER_INCARNATION, "messages": 3}
    asked = len(pings.asked_incarnation)
    owner.reactor.advance(0.25)
    assert len(pings.asked_incarnation) == asked + 1
    owner.service.stopService()
    replica.service.stopService()


def test_notes_of_an_owner_that_does_not_come_back_are_dropped_after_a_day(tmp_path: Any, monkeypatch: Any) -> None:
    """A machine lost for good (or replaced at another address) is asked no longer than NOTES_KEPT."""
    owner, replica, pings = lost_and_taken_over(tmp_path, monkeypatch)
    state = replica.service.owners["10.0.0.1:4151"]
    owner.reactor.advance(NOTES_KEPT - 60)
    owner.reactor.advance(1.0)
    assert state.noted == 3
    owner.reactor.advance(61)
    owner.reactor.advance(1.0)
    assert state.notes == [] and state.noted == 0 and not os.path.exists(notes_path(str(replica.path), "10.0.0.1:4151"))
    asked = len(pings.asked_incarnation)
    owner.reactor.advance(5.0)
    assert len(pings.asked_incarnation) == asked  # asked no more
    replica.service.stopService()
