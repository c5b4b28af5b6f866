"""A consumer's commands on its channel (:mod:`nsqtw.core.commands`): each outcome, each refusal,
and how each caller answers them.

The operations run on a real NSQD and its channels with a socket-free
consumer; the callers are a V2 connection on a StringTransport and a
worker's link seen from the core (its ACK and FAILED records read back
from the transport).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from nsqtw.core import commands
from nsqtw.core.channel import Channel
from nsqtw.core.commands import SUBSCRIBED, TOO_MANY, ClientState, Consumer, Refused
from nsqtw.core.message import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, Message
from nsqtw.core.nsqd import NSQD
from nsqtw.errors import BackendError, ExitingError, NotInFlightError, NSQError
from nsqtw.workers import link
from nsqtw.workers.peer import WorkerPeer
from tests.helpers import connect, link_records, make_nsqd, take_frames

UNKNOWN = b"0123456789abcdef"


class Sub(Consumer):
    """A consumer without a connection: what the channel sent it is kept in ``got``."""

    _ids = iter(range(1000, 10**6))

    def __init__(self) -> None:
        self.client_id = next(self._ids)
        self.sample_rate = 0
        self.joined = 0
        self.got: list[Message] = []
        self.init_consumer(ClientState.INIT, 60.0)

    def subscribed(self) -> None:
        self.joined += 1

    def ready_capacity(self) -> int:
        return self.ready_count - self.in_flight_count if self.state == ClientState.SUBSCRIBED else 0

    def deliver(self, messages: list[Message]) -> None:
        self.count_delivered(len(messages))
        self.got.extend(messages)

    def channel_deleted(self) -> None:
        self.channel = None


def subscribed_with(nsqd: NSQD, clock: Any, count: int = 0, ready: int = 0) -> Sub:
    """A consumer on t/c with ``count`` messages published and ``ready`` of them in flight."""
    client = Sub()
    assert commands.subscribe(nsqd, "t", "c", client) is SUBSCRIBED
    if count:
        nsqd.publish("t", [b"m%d" % i for i in range(count)])
    commands.ready(client, ready, 2500)
    clock.advance(0)
    assert len(client.got) == min(count, ready)
    return client


def channel(client: Consumer) -> Channel:
    assert isinstance(client.channel, Channel)
    return client.channel


# -- SUB ---------------------------------------------------------------------------------------------

def test_subscribe_joins_the_channel_made_for_it() -> None:
    nsqd, _ = make_nsqd()
    client = Sub()
    assert commands.subscribe(nsqd, "t", "c", client) is SUBSCRIBED
    assert client.channel is nsqd.topics["t"].channels["c"]
    assert client.state == ClientState.SUBSCRIBED and client.joined == 1
    assert channel(client).clients == {client.client_id: client}


def test_subscribe_past_max_channel_consumers_is_too_many_and_changes_nothing() -> None:
    nsqd, _ = make_nsqd(max_channel_consumers=1)
    assert commands.subscribe(nsqd, "t", "c", Sub()) is SUBSCRIBED
    client = Sub()
    assert commands.subscribe(nsqd, "t", "c", client) is TOO_MANY
    assert client.channel is None and client.state == ClientState.INIT and client.joined == 0


@pytest.mark.parametrize("error, why", [(ExitingError(), "exiting"), (BackendError("disk full"), "disk full")])
def test_subscribe_refused_by_the_node_says_why(error: Exception, why: str) -> None:
    class Node:
        def subscribe(self, topic: str, channel: str, client: Any) -> Any:
            raise error

    client = Sub()
    outcome = commands.subscribe(Node(), "t", "c", client)
    assert isinstance(outcome, Refused) and outcome.why == why
    assert client.channel is None and client.state == ClientState.INIT


def test_subscribe_to_an_exiting_channel_is_refused() -> None:
    nsqd, _ = make_nsqd()
    nsqd.get_topic("t").get_channel("c").exiting = True
    outcome = commands.subscribe(nsqd, "t", "c", Sub())
    assert isinstance(outcome, Refused) and outcome.why == "exiting"


def test_a_node_that_answers_later_gives_its_deferred_and_subscribed_maps_the_answer() -> None:
    later: Deferred[Any] = Deferred()

    class Node:
        def subscribe(self, topic: str, channel: str, client: Any) -> Any:
            return later

    client = Sub()
    assert commands.subscribe(Node(), "t", "c", client) is later
    assert client.state == ClientState.INIT  # nothing changes before the answer
    nsqd, _ = make_nsqd()
    joined = nsqd.get_topic("t").get_channel("c")
    assert commands.subscribed(client, joined) is SUBSCRIBED
    assert client.channel is joined and client.state == ClientState.SUBSCRIBED and client.joined == 1

    other = Sub()
    assert commands.subscribed(other, Failure(ValueError())) is TOO_MANY
    refused = commands.subscribed(other, Failure(RuntimeError("unknown connection")))
    assert isinstance(refused, Refused) and refused.why == "unknown connection"
    assert other.channel is None and other.state == ClientState.INIT


# -- RDY ---------------------------------------------------------------------------------------------

def test_ready_sets_the_count_and_wakes_the_channel() -> None:
    nsqd, clock = make_nsqd()
    client = subscribed_with(nsqd, clock, count=3)
    commands.ready(client, 2, 2500)
    assert client.ready_count == 2
    clock.advance(0)
    assert [m.body for m in client.got] == [b"m0", b"m1"]


def test_ready_past_max_rdy_count_is_fatal_and_changes_nothing() -> None:
    client = Sub()
    client.ready_count = 5
    with pytest.raises(NSQError) as refused:
        commands.ready(client, 2501, 2500)
    assert refused.value.fatal and str(refused.value) == "E_INVALID RDY count 2501 out of range 0-2500"
    assert client.ready_count == 5
    commands.ready(client, 2500, 2500)  # the bound is in range; no channel: only the count
    assert client.ready_count == 2500


# -- FIN, REQ, TOUCH ---------------------------------------------------------------------------------

def test_finish_counts_what_was_in_flight_and_fails_the_rest() -> None:
    nsqd, clock = make_nsqd()
    client = subscribed_with(nsqd, clock, count=2, ready=2)
    ids = [m.id for m in client.got]
    failed = commands.finish(client, [ids[0], UNKNOWN, ids[1]])
    assert [(i, str(why)) for i, why in failed] == [(UNKNOWN, "ID not in flight")]
    assert all(isinstance(why, NotInFlightError) for _, why in failed)
    assert client.finish_count == 2 and client.in_flight_count == 0
    assert channel(client).finish_count == 2


def test_another_clients_message_is_not_this_ones() -> None:
    nsqd, clock = make_nsqd()
    owner = subscribed_with(nsqd, clock, count=1, ready=1)
    other = subscribed_with(nsqd, clock)
    msg_id = owner.got[0].id
    assert [str(why) for _, why in commands.finish(other, [msg_id])] == ["client does not own message"]
    assert [str(why) for _, why in commands.touch(other, msg_id)] == ["client does not own message"]
    assert [str(why) for _, why in commands.requeue(other, [(msg_id, 0.0)])] == ["client does not own message"]
    assert owner.in_flight_count == 1


def test_commands_before_a_channel_do_nothing() -> None:
    client = Sub()
    assert commands.finish(client, [UNKNOWN]) == ()
    assert commands.requeue(client, [(UNKNOWN, 0.0)]) == ()
    assert commands.touch(client, UNKNOWN) == ()


def test_requeue_counts_what_was_in_flight_and_fails_the_rest() -> None:
    nsqd, clock = make_nsqd()
    client = subscribed_with(nsqd, clock, count=2, ready=2)
    ids = [m.id for m in client.got]
    failed = commands.requeue(client, [(ids[0], 0.0), (UNKNOWN, 0.0), (ids[1], 5.0)])
    assert [(i, str(why)) for i, why in failed] == [(UNKNOWN, "ID not in flight")]
    assert client.requeue_count == 2 and client.in_flight_count == 0
    assert channel(client).requeue_count == 2


def test_requeue_on_an_exiting_channel_fails_each() -> None:
    nsqd, clock = make_nsqd()
    client = subscribed_with(nsqd, clock, count=1, ready=1)
    channel(client).exiting = True
    failed = commands.requeue(client, [(client.got[0].id, 0.0), (UNKNOWN, 0.0)])
    assert [(i, str(why)) for i, why in failed] == [(client.got[0].id, "exiting"), (UNKNOWN, "exiting")]


def test_requeue_a_backend_refuses_is_the_last_ids_failure() -> None:
    class Refusing:
        def requeue_many(self, client: Any, reqs: list[tuple[bytes, float]]) -> Any:
            raise BackendError("disk full")

    client = Sub()
    client.channel = Refusing()  # type: ignore[assignment]
    failed = commands.requeue(client, [(b"a" * 16, 0.0), (b"b" * 16, 0.0)])
    assert [(i, str(why)) for i, why in failed] == [(b"b" * 16, "disk full")]


def test_requeue_delay_is_clamped_to_max_req_timeout_and_logged() -> None:
    logged: list[dict[str, Any]] = []
    observer = commands.log.observer
    commands.log.observer = logged.append  # type: ignore[method-assign]
    try:
        assert commands.requeue_delay("c", 1500, 3600.0) == 1.5
        assert logged == []
        assert commands.requeue_delay("c", 7_200_000, 3600.0) == 3600.0
    finally:
        commands.log.observer = observer  # type: ignore[method-assign]
    assert [(e["timeout"], e["max"]) for e in logged] == [(7_200_000, 3_600_000)]


def test_touch_restarts_the_timeout_and_fails_when_not_in_flight() -> None:
    nsqd, clock = make_nsqd()
    client = subscribed_with(nsqd, clock, count=1, ready=1)
    client.msg_timeout = 30.0
    msg = client.got[0]
    clock.advance(10)
    assert commands.touch(client, msg.id) == ()
    assert msg.deadline == pytest.approx(clock.seconds() + 30.0)
    failed = commands.touch(client, UNKNOWN)
    assert [(i, str(why)) for i, why in failed] == [(UNKNOWN, "ID not in flight")]


# -- V2: the outcomes as frames ----------------------------------------------------------------------

def test_v2_answers_sub_refusals() -> None:
    nsqd, clock = make_nsqd(max_channel_consumers=1)
    first, t1 = connect(nsqd, clock)
    first.dataReceived(b"SUB t c\n")
    assert take_frames(t1) == [(FRAME_TYPE_RESPONSE, b"OK")]
    second, t2 = connect(nsqd, clock)
    second.dataReceived(b"SUB t c\n")
    assert take_frames(t2) == [(FRAME_TYPE_ERROR, b"E_TOO_MANY_CHANNEL_CONSUMERS channel consumers for t:c "
                                                  b"exceeds limit of 1")]
    assert t2.disconnecting

    nsqd.get_topic("t").get_channel("d").exiting = True
    third, t3 = connect(nsqd, clock)
    third.dataReceived(b"SUB t d\n")
    assert take_frames(t3) == [(FRAME_TYPE_ERROR, b"E_SUB_FAILED SUB failed exiting")]
    assert t3.disconnecting and third.channel is None


def test_v2_answers_ack_failures_non_fatally() -> None:
    nsqd, clock = make_nsqd()
    proto, transport = connect(nsqd, clock)
    proto.dataReceived(b"SUB t c\n")
    take_frames(transport)
    proto.dataReceived(b"FIN " + UNKNOWN + b"\nREQ " + UNKNOWN + b" 0\nTOUCH " + UNKNOWN + b"\n")
    assert take_frames(transport) == [
        (FRAME_TYPE_ERROR, b"E_FIN_FAILED FIN " + UNKNOWN + b" failed ID not in flight"),
        (FRAME_TYPE_ERROR, b"E_REQ_FAILED REQ " + UNKNOWN + b" failed ID not in flight"),
        (FRAME_TYPE_ERROR, b"E_TOUCH_FAILED TOUCH " + UNKNOWN + b" failed ID not in flight")]
    assert not transport.disconnecting


# -- a worker's link: ACK and FAILED records ---------------------------------------------------------

def records(transport: StringTransport) -> list[tuple[int, list[Any]]]:
    """The records the core wrote: (kind, fields)."""
    return link_records(transport)


def linked(**options: Any) -> tuple[NSQD, Any, WorkerPeer, StringTransport]:
    nsqd, clock = make_nsqd(**options)
    peer = WorkerPeer(nsqd, clock, 0)
    transport = StringTransport()
    peer.link.makeConnection(transport)
    identity = json.dumps(connect(nsqd, clock)[0].identity()).encode()
    for conn in (7, 8):
        peer.link.dataReceived(b"".join(link.encode(link.OPEN, conn, identity)))
    return nsqd, clock, peer, transport


def test_a_worker_link_acks_each_sub_outcome() -> None:
    nsqd, clock, peer, transport = linked(max_channel_consumers=1)
    nsqd.get_topic("t").get_channel("d").exiting = True
    for seq, conn, name in ((1, 7, b"c"), (2, 8, b"c"), (3, 8, b"d"), (4, 99, b"c")):
        peer.link.dataReceived(b"".join(link.encode(link.SUB, seq, conn, b"t", name)))
    clock.advance(0)
    assert [fields for kind, fields in records(transport) if kind == link.ACK] == [
        [1, link.ACK_OK, ""], [2, link.ACK_TOO_MANY, ""], [3, link.ACK_FAILED, "exiting"],
        [4, link.ACK_FAILED, "unknown connection"]]
    assert peer.clients[7].state == ClientState.SUBSCRIBED and peer.clients[8].channel is None


def test_a_worker_link_reports_each_failed_ack_and_counts_the_rest() -> None:
    nsqd, clock, peer, transport = linked()
    peer.link.dataReceived(b"".join(link.encode(link.SUB, 1, 7, b"t", b"c")))
    nsqd.publish("t", [b"a", b"b"])
    peer.link.dataReceived(b"".join(link.encode(link.STATE, 7, 2, 0, int(ClientState.SUBSCRIBED))))
    clock.advance(0)
    client = peer.clients[7]
    assert client.ready_count == 2 and client.in_flight_count == 2
    ids = [m.id for m in channel(client).in_flight.live.values()]
    records(transport)
    peer.link.dataReceived(b"".join(
        b"".join(r) for r in (link.encode(link.FIN, 7, [ids[0], UNKNOWN]),
                              link.encode(link.REQ, 7, [(ids[1], 0.0), (UNKNOWN, 0.0)]),
                              link.encode(link.TOUCH, 7, UNKNOWN))))
    clock.advance(0)
    assert [fields for kind, fields in records(transport) if kind == link.FAILED] == [
        [7, "FIN", UNKNOWN, "ID not in flight"], [7, "REQ", UNKNOWN, "ID not in flight"],
        [7, "TOUCH", UNKNOWN, "ID not in flight"]]
    assert (client.finish_count, client.requeue_count) == (1, 1)


def test_a_worker_link_answers_a_sub_that_raised() -> None:
    nsqd, clock, peer, transport = linked()

    def broken(topic: str, channel: str, client: Any) -> Any:
        raise RuntimeError("boom")

    nsqd.subscribe = broken  # type: ignore[method-assign]
    peer.link.dataReceived(b"".join(link.encode(link.SUB, 1, 7, b"t", b"c")))
    clock.advance(0)
    assert [fields for kind, fields in records(transport) if kind == link.ACK] == [[1, link.ACK_FAILED, "boom"]]
    assert peer.clients[7].channel is None
