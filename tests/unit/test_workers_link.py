"""``--workers`` without sockets: a V2 client on a worker's node, the link, the core's NSQD.

The worker's :class:`RemoteNode` and the core's :class:`WorkerPeer` are
joined by two ``StringTransport``s whose bytes are carried across by hand,
so every record really is encoded, split and decoded.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import LogLevel, formatEvent, globalLogPublisher

from nsqtw.core.message import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE
from nsqtw.observe.stats import snapshot
from nsqtw.protocol.v2 import V2Factory, V2Protocol
from nsqtw.workers import link
from nsqtw.workers.link import Link
from nsqtw.workers.peer import GRANTED_TOPICS, WorkerPeer
from nsqtw.workers.remote import RemoteNode
from tests.helpers import body, decode_message_frame, link_records, make_nsqd, take_frames


def in_flight(j: Joined) -> int:
    """The channel ``t/c``'s in-flight count, as ``/stats`` shows it."""
    return int(snapshot(j.nsqd)["topics"][0]["channels"][0]["in_flight_count"])


class _KernelSocket:
    """``sendmsg`` into a :class:`KernelTransport`'s bytes: what the kernel took is written."""

    def __init__(self, transport: KernelTransport) -> None:
        self.transport = transport

    def sendmsg(self, pieces: list[bytes]) -> int:
        t = self.transport
        data = b"".join(pieces)
        if t.room is not None:
            data = data[:t.room]
            t.room -= len(data)
        t.io.write(data)
        return len(data)


class KernelTransport(StringTransport):
    """A worker's end of the link as :class:`~nsqtw.workers.link.Link` sees a real socket: writes
    go straight to the kernel while nothing waits in Twisted's buffer. ``room`` bounds what the
    kernel takes (None: all); what it refuses waits in :attr:`held`, Twisted's buffer, until
    :meth:`drain`."""

    connected = True
    disconnecting = False
    _writeDisconnected = False
    offset = 0
    dataBuffer = b""

    def __init__(self) -> None:
        super().__init__()
        self.socket = _KernelSocket(self)
        self.room: int | None = None
        self.held: list[bytes] = []

    @property
    def _tempDataLen(self) -> int:
        return sum(map(len, self.held))

    def writeSequence(self, data: Any) -> None:
        self.held.extend(data)

    def drain(self) -> None:
        self.room = None
        held, self.held = self.held, []
        self.io.write(b"".join(held))


class Joined:
    """A core (an NSQD and a worker's peer) and a worker's node, their links on StringTransports
    (the worker's a :class:`KernelTransport` when ``kernel``)."""

    def __init__(self, kernel: bool = False, **options: object) -> None:
        self.nsqd, self.clock = make_nsqd(**options)
        self.peer = WorkerPeer(self.nsqd, self.clock, 0)
        self.node = RemoteNode(self.nsqd.options, self.clock, 0)
        self.core_side = StringTransport()
        self.worker_side: StringTransport = KernelTransport() if kernel else StringTransport()
        self.peer.link.makeConnection(self.core_side)
        self.node.link.makeConnection(self.worker_side)

    def settle(self) -> None:
        """Run turns until neither side has anything more to send."""
        for _ in range(20):
            self.clock.advance(0)
            moved = False
            for src, dst in ((self.worker_side, self.peer.link), (self.core_side, self.node.link)):
                data = src.value()
                if data:
                    src.clear()
                    # in pieces of 7 bytes: records arrive split anywhere
                    for i in range(0, len(data), 7):
                        dst.dataReceived(data[i:i + 7])
                    moved = True
            if not moved:
                return
        raise AssertionError("the link never settled")

    def client(self) -> tuple[V2Protocol, StringTransport]:
        proto = V2Factory(self.node, self.clock).buildProtocol(None)
        transport = StringTransport()
        proto.makeConnection(transport)
        proto.dataReceived(b"  V2")
        self.settle()
        return proto, transport


def test_publish_is_answered_once_the_core_queued_it() -> None:
    j = Joined()
    proto, transport = j.client()
    proto.dataReceived(b"PUB t\n" + body(b"hello"))
    assert take_frames(transport) == []  # not before the core has it
    j.settle()
    assert take_frames(transport) == [(FRAME_TYPE_RESPONSE, b"OK")]
    assert j.nsqd.topics["t"].depth() == 1


def test_a_subscriber_gets_messages_and_its_fin_reaches_the_core() -> None:
    j = Joined()
    consumer, ct = j.client()
    consumer.dataReceived(b"SUB t c\n")
    j.settle()
    assert take_frames(ct) == [(FRAME_TYPE_RESPONSE, b"OK")]
    publisher, pt = j.client()
    publisher.dataReceived(b"MPUB t\n" + b"\x00\x00\x00\x19\x00\x00\x00\x02" + body(b"one") + body(b"two")
                           + b"\x00" * 6)
    j.settle()
    assert take_frames(pt) == [(FRAME_TYPE_RESPONSE, b"OK")]
    consumer.dataReceived(b"RDY 5\n")
    j.settle()
    frames = take_frames(ct)
    assert [t for t, _ in frames] == [FRAME_TYPE_MESSAGE] * 2
    got = [decode_message_frame(p) for _, p in frames]
    assert [b for _, _, _, b in got] == [b"one", b"two"]
    assert in_flight(j) == 2
    consumer.dataReceived(b"".join(b"FIN %s\n" % msg_id for _, _, msg_id, _ in got))
    j.settle()
    assert in_flight(j) == 0
    assert j.nsqd.topics["t"].channels["c"].depth() == 0
    assert take_frames(ct) == []


def test_fin_of_an_unknown_message_fails_from_the_core() -> None:
    j = Joined()
    consumer, ct = j.client()
    consumer.dataReceived(b"SUB t c\n")
    j.settle()
    take_frames(ct)
    consumer.dataReceived(b"FIN 0123456789abcdef\n")
    j.settle()
    ((ftype, payload),) = take_frames(ct)
    assert ftype == FRAME_TYPE_ERROR
    assert payload.startswith(b"E_FIN_FAILED FIN 0123456789abcdef failed ")


def test_sub_past_max_channel_consumers_is_refused_as_nsqd_does() -> None:
    j = Joined(max_channel_consumers=1)
    first, ft = j.client()
    first.dataReceived(b"SUB t c\n")
    j.settle()
    assert take_frames(ft) == [(FRAME_TYPE_RESPONSE, b"OK")]
    second, st = j.client()
    second.dataReceived(b"SUB t c\n")
    j.settle()
    assert take_frames(st) == [(FRAME_TYPE_ERROR,
                                b"E_TOO_MANY_CHANNEL_CONSUMERS channel consumers for t:c exceeds limit of 1")]
    assert st.disconnecting


def test_the_core_shows_a_worker_client_in_stats_with_its_identity() -> None:
    j = Joined()
    consumer, ct = j.client()
    consumer.dataReceived(b"IDENTIFY\n" + body(json.dumps({"client_id": "cid", "hostname": "h.example",
                                                           "user_agent": "ua/1"}).encode()))
    consumer.dataReceived(b"SUB t c\nRDY 7\n")
    j.settle()
    stats = snapshot(j.nsqd)
    (client,) = stats["topics"][0]["channels"][0]["clients"]
    assert (client["client_id"], client["hostname"], client["user_agent"]) == ("cid", "h.example", "ua/1")
    assert (client["state"], client["ready_count"]) == (3, 7)
    assert client == consumer.go_stats()


def holding_one(ready: int = 1, body: bytes = b"x") -> tuple[Joined, V2Protocol, Any, StringTransport]:
    """A core and a worker whose one subscriber, at RDY ``ready``, holds one message of ``t/c`` in
    flight; the channel, and the subscriber's transport."""
    j = Joined()
    consumer, transport = j.client()
    consumer.dataReceived(b"SUB t c\nRDY %d\n" % ready)
    j.settle()
    j.nsqd.publish("t", [body])
    j.settle()
    assert in_flight(j) == 1
    return j, consumer, j.nsqd.topics["t"].channels["c"], transport


def test_closed_worker_connection_requeues_what_it_held() -> None:
    j, consumer, channel, _ = holding_one()
    consumer.connectionLost(None)
    j.settle()
    assert in_flight(j) == 0 and channel.depth() == 1
    assert not j.nsqd.clients


def test_what_the_core_sent_as_cls_crossed_it_is_not_written_but_requeued() -> None:
    """The worker answers CLS at once; the core hears of it only with the next records. A
    message it handed the connection in between is never written after CLOSE_WAIT: it goes
    back to the channel, and a FIN of what the client already held still works."""
    j, consumer, channel, ct = holding_one(ready=5, body=b"first")
    ((_, _, first, _),) = [decode_message_frame(p) for _, p in take_frames(ct)[1:]]  # (after SUB's OK)
    consumer.dataReceived(b"CLS\n")
    j.nsqd.publish("t", [b"second"])
    j.clock.advance(0)  # both sides' turns end: the records cross
    assert j.core_side.value() and j.worker_side.value()
    data = j.core_side.value()
    j.core_side.clear()
    j.node.link.dataReceived(data)  # the core's DELIVER of "second" reaches the worker first
    assert take_frames(ct) == [(FRAME_TYPE_RESPONSE, b"CLOSE_WAIT")]
    j.settle()
    assert in_flight(j) == 1 and channel.depth() == 1  # only "first" is out
    consumer.dataReceived(b"FIN " + first + b"\n")
    j.settle()
    assert take_frames(ct) == [] and in_flight(j) == 0
    assert [m.data[16:] for m in channel.next_messages(5)] == [b"second"]


def test_a_lost_worker_takes_its_clients_out_of_the_core() -> None:
    j, _, channel, _ = holding_one()
    j.peer.link.connectionLost(None)
    assert in_flight(j) == 0 and not channel.clients and not j.nsqd.clients


def test_records_split_anywhere_are_read_whole() -> None:
    got: list[tuple[int, bytes]] = []
    receiver = Link(Clock(), lambda kind, data, start, end: got.append((kind, data[start:end])), lambda reason: None)
    data = b"".join(link.encode(link.DELIVER, 7, b"x" * 100_000) + link.encode(link.CLOSE, 8))
    for size in (1, 3, 4096, len(data)):
        got.clear()
        for i in range(0, len(data), size):
            receiver.dataReceived(data[i:i + size])
        assert [(k, len(p)) for k, p in got] == [(link.DELIVER, 100_004), (link.CLOSE, 4)]


def test_records_of_a_turn_leave_in_one_write() -> None:
    clock = Clock()
    sender = Link(clock, lambda kind, data, start, end: None, lambda reason: None)
    transport = StringTransport()
    sender.makeConnection(transport)
    writes: list[list[bytes]] = []
    transport.writeSequence = writes.append  # type: ignore[method-assign]
    for conn in range(50):
        sender.send(link.encode(link.GONE, conn))
    assert writes == []
    clock.advance(0)
    assert len(writes) == 1
    assert b"".join(writes[0])[5:9] == bytes(4)  # the first GONE's connection: 0


def test_a_record_that_fails_is_logged_and_the_link_goes_on() -> None:
    got: list[int] = []
    logged: list[dict[str, object]] = []

    def handle(kind: int, data: bytes, start: int, end: int) -> None:
        if kind == link.GONE:
            raise KeyError("no such connection")
        got.append(kind)

    receiver = Link(Clock(), handle, lambda reason: None)
    globalLogPublisher.addObserver(logged.append)
    try:
        receiver.dataReceived(b"".join(link.encode(link.GONE, 1) + link.encode(link.CLOSE, 2)))
    finally:
        globalLogPublisher.removeObserver(logged.append)
    assert got == [link.CLOSE]
    (event,) = [e for e in logged if "log_failure" in e]
    assert event["log_failure"].check(KeyError)  # type: ignore[attr-defined]


# -- publishes answered by the worker, under the core's grants ---------------------------------

#: --max-unwritten-bytes that makes a worker's grant of a topic 100 bytes
SMALL = 100 * 4 * (GRANTED_TOPICS + 1)


def granted(j: Joined) -> tuple[V2Protocol, StringTransport]:
    """A publisher whose first PUB (answered by the core) brought its worker credit for ``t``."""
    proto, transport = j.client()
    proto.dataReceived(b"PUB t\n" + body(b"first"))
    j.settle()
    assert take_frames(transport) == [(FRAME_TYPE_RESPONSE, b"OK")]
    assert j.node.credit == {"t": j.peer.share}
    assert j.nsqd.unwritten.total == j.peer.share  # promised bytes count as unwritten ones
    return proto, transport


def test_a_publish_under_a_grant_is_answered_by_the_worker_once_the_core_can_read_it() -> None:
    j = Joined(kernel=True, max_unwritten_bytes=SMALL)
    proto, transport = granted(j)
    assert j.peer.share == 100
    proto.dataReceived(b"PUB t\n" + body(b"second"))
    # answered at once, no turn of the core in between; the record was already in the "kernel"
    assert take_frames(transport) == [(FRAME_TYPE_RESPONSE, b"OK")]
    records = j.worker_side.value()
    assert records[4] == link.GRANTED_PUB and records.endswith(b"second")
    assert j.node.credit == {"t": 94}
    j.settle()
    topic = j.nsqd.topics["t"]
    assert topic.depth() == 2
    assert j.node.credit == {"t": 94} and j.nsqd.unwritten.total == 94  # no record back for it
    for _ in range(11):  # 44 bytes more: half the grant used
        proto.dataReceived(b"PUB t\n" + body(b"more"))
    assert take_frames(transport) == [(FRAME_TYPE_RESPONSE, b"OK")] * 11
    j.settle()
    # topped up, in one record
    assert j.node.credit == {"t": 100} and j.nsqd.unwritten.total == 100
    assert topic.depth() == 13
    (client,) = j.peer.clients.values()
    assert client.pub_counts == {"t": 13}


def test_a_publish_past_the_credit_waits_for_the_core() -> None:
    j = Joined(kernel=True, max_unwritten_bytes=SMALL)
    proto, transport = granted(j)
    proto.dataReceived(b"PUB t\n" + body(b"x" * 101))
    assert take_frames(transport) == []
    j.settle()
    assert take_frames(transport) == [(FRAME_TYPE_RESPONSE, b"OK")]
    assert j.nsqd.topics["t"].depth() == 2


def test_a_granted_publish_to_a_full_topic_goes_to_its_disk_queue() -> None:
    """The load of Go's bench_writer: a topic without channels, its memory full."""
    j = Joined(kernel=True, mem_queue_size=1)
    proto, transport = granted(j)
    proto.dataReceived(b"PUB t\n" + body(b"second"))
    assert take_frames(transport) == [(FRAME_TYPE_RESPONSE, b"OK")]
    j.settle()
    topic = j.nsqd.topics["t"]
    assert len(topic.memory) == 1 and topic.backend.depth() == 1


def test_a_backed_up_link_answers_a_granted_publish_once_the_core_has_it() -> None:
    j = Joined(kernel=True)
    proto, transport = granted(j)
    kernel = j.worker_side
    assert isinstance(kernel, KernelTransport)
    kernel.room = 10  # the kernel takes part of the record; the rest waits in this process
    proto.dataReceived(b"PUB t\n" + body(b"second"))
    assert take_frames(transport) == []  # a kill -9 now would lose it: not answered
    kernel.drain()
    j.settle()
    assert take_frames(transport) == [(FRAME_TYPE_RESPONSE, b"OK")]
    assert j.nsqd.topics["t"].depth() == 2


def test_without_a_socket_to_the_kernel_every_publish_waits_for_the_core() -> None:
    j = Joined(kernel=False)
    proto, transport = j.client()
    for word in (b"one", b"two"):
        proto.dataReceived(b"PUB t\n" + body(word))
        assert take_frames(transport) == []
        j.settle()
        assert take_frames(transport) == [(FRAME_TYPE_RESPONSE, b"OK")]


def test_no_grant_where_one_process_would_make_the_publisher_wait() -> None:
    j = Joined(kernel=True, sync_every=1)  # publishers wait for the disk write
    proto, transport = j.client()
    proto.dataReceived(b"PUB t\n" + body(b"one"))
    j.settle()
    assert take_frames(transport) == [(FRAME_TYPE_RESPONSE, b"OK")]
    assert j.node.credit == {} and j.peer.grants == {}
    # nor while the node's unwritten bytes are past --max-unwritten-bytes
    j = Joined(kernel=True, max_unwritten_bytes=SMALL)
    granted(j)
    j.nsqd.unwritten.add(SMALL)
    assert j.nsqd.promise("t", 10) == 0
    j.nsqd.unwritten.remove(SMALL)
    assert j.nsqd.promise("t", 10) == 10
    # nor for a topic being deleted
    j.nsqd.topics["t"].exiting = True
    assert j.nsqd.promise("t", 10) == 0


def test_a_worker_holds_grants_for_so_many_topics_and_gives_the_oldest_back() -> None:
    j = Joined(kernel=True, max_unwritten_bytes=SMALL)
    proto, transport = j.client()
    for n in range(GRANTED_TOPICS + 1):
        proto.dataReceived(b"PUB t%d\n" % n + body(b"x"))
        j.settle()
    assert take_frames(transport) == [(FRAME_TYPE_RESPONSE, b"OK")] * (GRANTED_TOPICS + 1)
    assert "t0" not in j.node.credit and len(j.node.credit) == GRANTED_TOPICS
    assert "t0" not in j.peer.grants and len(j.peer.grants) == GRANTED_TOPICS
    assert j.nsqd.unwritten.total == GRANTED_TOPICS * 100  # t0's promise kept: given back
    proto.dataReceived(b"PUB t0\n" + body(b"again"))  # asks the core again, and gets a grant again
    assert take_frames(transport) == []
    j.settle()
    assert take_frames(transport) == [(FRAME_TYPE_RESPONSE, b"OK")]
    assert "t0" in j.node.credit and "t1" not in j.node.credit


def test_a_lost_worker_gives_its_grants_back() -> None:
    j = Joined(kernel=True)
    granted(j)
    j.peer.link.connectionLost(None)
    assert j.nsqd.unwritten.total == 0
    assert j.peer.done.called
    # what the dead worker's link still held is read after its end: taken, and no new promise
    j.peer.link.dataReceived(b"".join(link.encode(link.GRANTED_PUB, 9, 1, 0, b"t", [b"late"])))
    assert j.nsqd.topics["t"].depth() == 2 and j.nsqd.unwritten.total == 0


def test_granted_publishes_of_one_read_are_queued_together_and_in_order_with_the_rest() -> None:
    j = Joined(kernel=True)
    granted(j)
    topic = j.nsqd.topics["t"]
    records = [link.encode(link.GRANTED_PUB, 10 + i, 1, 0, b"t", [b"g%d" % i]) for i in range(3)]
    records.append(link.encode(link.PUB, 20, 1, 0, b"t", [b"asked"]))  # a publish that waits for its answer
    records.append(link.encode(link.GRANTED_PUB, 21, 1, 0, b"t", [b"g3"]))
    values = []
    real = j.nsqd.publish

    def publish(name: str, bodies: list[bytes], *args: Any, **kwargs: Any) -> Any:
        values.append(list(bodies))
        return real(name, bodies, *args, **kwargs)

    j.nsqd.publish = publish  # type: ignore[method-assign]
    j.peer.link.dataReceived(b"".join(b"".join(r) for r in records))
    # the three before the other publish went as one, before it; the last after it
    assert values == [[b"g0", b"g1", b"g2"], [b"asked"], [b"g3"]]
    assert [m.body for m in topic.memory][-5:] == [b"g0", b"g1", b"g2", b"asked", b"g3"]


# -- the one table of record kinds --------------------------------------------------------------

ID = b"0123456789abcdef"

#: a record of each kind, as the link has always written it (the bytes must never change)
WIRE = [
    (link.OPEN, (7, b'{"a":1}'), "0000000c01000000077b2261223a317d"),
    (link.INFO, (7, b'{"a":1}'), "0000000c02000000077b2261223a317d"),
    (link.GONE, (7,), "000000050300000007"),
    (link.PUB, (1, 7, 250, "t\u00e9", [b"abc"]), "0000001d040000000100000007000000fa000374c3a90000000100000003616263"),
    (link.SUB, (3, 7, "t", "c#ephemeral"), "00000019050000000300000007000174000b6323657068656d6572616c"),
    (link.STATE, (7, 2500, 1, 3), "0000000b0600000007000009c40103"),
    (link.FIN, (7, [ID, ID[::-1]]),
     "0000002507000000073031323334353637383961626364656666656463626139383736353433323130"),
    (link.REQ, (7, [(ID, 1.5), (ID, 0.0)]),
     "0000002d080000000730313233343536373839616263646566000005dc3031323334353637383961626364656600000000"),
    (link.TOUCH, (7, ID), "00000015090000000730313233343536373839616263646566"),
    (link.GRANTED_PUB, (1, 7, 0, "t\u00e9", [b"abc", b"", b"de"]),
     "000000270a000000010000000700000000000374c3a9000000030000000300000000000000026162636465"),
    (link.SYNC, (9,), "000000050b00000009"),
    (link.RETURN, (55, "t"), "000000060c0000003774"),
    (link.READY, (), "000000010d"),
    (link.DROPPED, (), "000000010e"),
    (link.ACK, (9, link.ACK_FAILED, "exiting"), "0000000f140000000901000765786974696e67"),
    (link.DELIVER, (7, b"f1f2"), "00000009150000000766316632"),
    (link.FAILED, (7, "REQ", ID, "E no"),
     "0000002216000000070003524551001030313233343536373839616263646566000445206e6f"),
    (link.CLOSE, (7,), "000000051700000007"),
    (link.STOP, (), "0000000118"),
    (link.GRANT, (1000, "t"), "0000000619000003e874"),
    (link.REVOKE, (0, "t"), "000000061a0000000074"),
]


def test_every_kind_is_written_as_ever_and_read_back_from_the_table() -> None:
    assert sorted(k for k, _, _ in WIRE) == sorted(link.KINDS)
    for kind, values, wire in WIRE:
        data = b"".join(link.encode(kind, *values))
        assert data.hex() == wire, link.KINDS[kind].name
        assert link.KINDS[kind].decode(data, 5, len(data)) == list(values), link.KINDS[kind].name
    # pieces are written as they are: MESSAGE frames are not joined to be sent
    assert link.encode(link.DELIVER, 7, [b"f1", b"f2"])[-2:] == [b"f1", b"f2"]


def test_each_side_handles_every_kind_the_other_sends() -> None:
    core = {k for k, kind in link.KINDS.items() if kind.sender == link.WORKER}
    assert set(WorkerPeer.HANDLERS) == core
    assert set(RemoteNode.HANDLERS) == set(link.KINDS) - core
    j = Joined()  # made at start-up: each handler exists
    assert j.peer.dispatch is not None and j.node.dispatch is not None


def test_a_side_without_a_handler_for_a_kind_fails_at_start_up() -> None:
    handlers = dict(RemoteNode.HANDLERS)
    del handlers[link.GRANT]
    with pytest.raises(ValueError, match=r"missing \['GRANT'\]"):
        link.Dispatch(link.WORKER, "WORKER(0)", RemoteNode(make_nsqd()[0].options, Clock(), 0), handlers, {})
    with pytest.raises(ValueError, match="not received here"):
        link.Dispatch(link.WORKER, "WORKER(0)", None, {**RemoteNode.HANDLERS, link.PUB: "x"}, {})


# -- records naming a connection the receiver does not know ----------------------------------------

def unknown_lines(events: list[dict[str, Any]]) -> list[str]:
    return [formatEvent(e) for e in events if "unknown connection" in (e.get("log_format") or "")
            and e["log_level"] == LogLevel.warn]


def test_records_for_an_unknown_connection_are_counted_and_logged_by_the_core() -> None:
    j = Joined()
    proto, transport = j.client()
    connections = j.peer.connections
    logged: list[dict[str, Any]] = []
    records = [link.encode(link.INFO, 99, b"{}"), link.encode(link.STATE, 99, 5, 0, 3),
               link.encode(link.FIN, 99, [ID]), link.encode(link.REQ, 99, [(ID, 1.0)]),
               link.encode(link.TOUCH, 99, ID), link.encode(link.GONE, 99),
               link.encode(link.SUB, 1000, 99, "t", "c"), link.encode(link.PUB, 1001, 99, 0, "t", [b"x"]),
               link.encode(link.PUB, 1002, 0, 0, "t", [b"y"])]  # conn 0: no client, not unknown
    globalLogPublisher.addObserver(logged.append)
    try:
        j.peer.link.dataReceived(b"".join(b"".join(r) for r in records))
    finally:
        globalLogPublisher.removeObserver(logged.append)
    assert j.peer.unknown_conns == 8
    assert unknown_lines(logged) == [
        "WORKER(0): INFO for unknown connection 99 - ignored",
        "WORKER(0): STATE for unknown connection 99 - ignored",
        "WORKER(0): FIN for unknown connection 99 - ignored",
        "WORKER(0): REQ for unknown connection 99 - ignored",
        "WORKER(0): TOUCH for unknown connection 99 - ignored",
        "WORKER(0): GONE for unknown connection 99 - handled without it",
        "WORKER(0): SUB for unknown connection 99 - handled without it",
        "WORKER(0): PUB for unknown connection 99 - handled without it",
    ]
    assert not [e for e in logged if "log_failure" in e]  # nothing raised
    assert j.peer.connections == connections - 1  # the worker holds one less, known or not
    # both publishes queued and answered; the SUB refused
    assert [m.body for m in j.nsqd.topics["t"].memory] == [b"x", b"y"]
    j.clock.advance(0)  # the turn's records leave
    # (answers the worker never asked for)
    acks = [fields for kind, fields in link_records(j.core_side) if kind == link.ACK]
    assert acks == [[1000, link.ACK_FAILED, "unknown connection"], [1001, link.ACK_OK, ""],
                    [1002, link.ACK_OK, ""]]
    # the link goes on: the known client's next publish is answered
    j.settle()
    proto.dataReceived(b"PUB t\n" + body(b"after"))
    j.settle()
    assert take_frames(transport)[-1] == (FRAME_TYPE_RESPONSE, b"OK")


def test_records_for_an_unknown_connection_are_counted_and_logged_by_the_worker() -> None:
    j = Joined()
    consumer, ct = j.client()
    consumer.dataReceived(b"SUB t c\nRDY 1\n")
    j.settle()
    take_frames(ct)
    logged: list[dict[str, Any]] = []
    records = [link.encode(link.DELIVER, 99, b"frames"), link.encode(link.FAILED, 99, "FIN", ID, "E no"),
               link.encode(link.CLOSE, 99)]
    globalLogPublisher.addObserver(logged.append)
    try:
        j.node.link.dataReceived(b"".join(b"".join(r) for r in records))
    finally:
        globalLogPublisher.removeObserver(logged.append)
    assert j.node.unknown_conns == 3
    assert unknown_lines(logged) == ["WORKER(0): DELIVER for unknown connection 99 - ignored",
                                     "WORKER(0): FAILED for unknown connection 99 - ignored",
                                     "WORKER(0): CLOSE for unknown connection 99 - ignored"]
    assert not [e for e in logged if "log_failure" in e]
    # the link goes on: a message published now reaches the known subscriber
    j.nsqd.publish("t", [b"later"])
    j.settle()
    ((kind, payload),) = take_frames(ct)
    assert kind == FRAME_TYPE_MESSAGE and decode_message_frame(payload)[3] == b"later"
    assert j.node.unknown_conns == 3
