"""Publish admission (:mod:`nsqtw.core.admission`): each outcome, and how each caller answers it.

The node's two calls (``wait_for_room``, ``publish``) are scripted on a real
NSQD, so each outcome is made on purpose; the callers are a V2 connection on
a StringTransport, the HTTP API's publish path, and a worker's link seen
from the core (its ACK records read back from the transport).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from nsqtw.core.admission import PUBLISHED, Failed, WaitForRoom, Written, admit, settled
from nsqtw.core.message import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE
from nsqtw.core.nsqd import NSQD
from nsqtw.errors import BackendError, ExitingError
from nsqtw.http.base import APIError
from nsqtw.nsqd.http import HTTPAPI, PUBLISH_ROOM_WAIT
from nsqtw.protocol.wire import encode_command
from nsqtw.workers import link
from nsqtw.workers.peer import WorkerPeer
from tests.helpers import connect, link_records, make_nsqd, take_frames


class Script:
    """What the scripted node answers: ``room`` from ``wait_for_room`` (an exception to raise),
    then ``written`` from ``publish`` (an exception to raise); the publishes it saw."""

    def __init__(self, nsqd: NSQD) -> None:
        self.room: Deferred[None] | Exception | None = None
        self.written: Deferred[None] | Exception | None = None
        self.published: list[tuple[str, list[bytes], float, Any]] = []
        nsqd.wait_for_room = self.wait_for_room  # type: ignore[method-assign]
        nsqd.publish = self.publish  # type: ignore[method-assign]

    def wait_for_room(self, topic: str) -> Deferred[None] | None:
        room, self.room = self.room, None  # room once: asked again, there is some
        if isinstance(room, Exception):
            raise room
        return room

    def publish(self, topic: str, bodies: list[bytes], defer: float = 0.0,
                client: Any = None) -> Deferred[None] | None:
        self.published.append((topic, bodies, defer, client))
        written, self.written = self.written, None
        if isinstance(written, Exception):
            raise written
        return written


class Counted:
    def __init__(self) -> None:
        self.pub_counts: dict[str, int] = {}


def scripted() -> tuple[NSQD, Any, Script]:
    nsqd, clock = make_nsqd()
    return nsqd, clock, Script(nsqd)


# -- the outcomes ----------------------------------------------------------------------------------

def test_a_publish_to_memory_is_published_now_and_counted() -> None:
    nsqd, _, script = scripted()
    client = Counted()
    assert admit(nsqd, "t", [b"a", b"b"], 0.5, client) is PUBLISHED
    assert script.published == [("t", [b"a", b"b"], 0.5, client)]
    assert client.pub_counts == {"t": 2}


def test_a_publish_to_disk_is_written_later_and_counted_now() -> None:
    nsqd, _, script = scripted()
    script.written = d = Deferred()
    client = Counted()
    outcome = admit(nsqd, "t", [b"a"], 0.0, client)
    assert isinstance(outcome, Written) and outcome.deferred is d
    assert client.pub_counts == {"t": 1}


def test_a_publish_past_the_bounds_waits_for_room_and_is_not_accepted() -> None:
    nsqd, _, script = scripted()
    script.room = room = Deferred()
    client = Counted()
    outcome = admit(nsqd, "t", [b"a"], 0.0, client)
    assert isinstance(outcome, WaitForRoom) and outcome.room is room
    assert script.published == [] and client.pub_counts == {}


@pytest.mark.parametrize("where", ["room", "written"])
@pytest.mark.parametrize("error, why", [(ExitingError(), "exiting"), (BackendError("disk full"), "disk full")])
def test_a_refused_publish_fails_with_why_and_is_not_counted(where: str, error: Exception, why: str) -> None:
    nsqd, _, script = scripted()
    setattr(script, where, error)
    client = Counted()
    outcome = admit(nsqd, "t", [b"a"], 0.0, client)
    assert isinstance(outcome, Failed) and outcome.why == why
    assert client.pub_counts == {}


def test_without_a_client_nothing_is_counted() -> None:
    nsqd, _, script = scripted()
    assert admit(nsqd, "t", [b"a"]) is PUBLISHED
    assert script.published == [("t", [b"a"], 0.0, None)]


def test_a_real_node_admits_to_memory() -> None:
    nsqd, _ = make_nsqd()
    assert admit(nsqd, "t", [b"a"]) is PUBLISHED
    assert [m.body for m in nsqd.topics["t"].memory] == [b"a"]


def test_settled_reads_a_deferreds_result() -> None:
    assert settled(None) is PUBLISHED
    failed = settled(Failure(BackendError("disk full")))
    assert isinstance(failed, Failed) and failed.why == "disk full"


# -- V2: OK now, OK later with the connection blocked, or a fatal E_<CMD>_FAILED -------------------

def test_v2_answers_each_outcome() -> None:
    nsqd, clock, script = scripted()
    proto, transport = connect(nsqd, clock)
    proto.dataReceived(encode_command(b"PUB", b"t", body=b"a"))
    assert take_frames(transport) == [(FRAME_TYPE_RESPONSE, b"OK")]
    assert proto.pub_counts == {"t": 1}

    script.written = written = Deferred()
    proto.dataReceived(encode_command(b"PUB", b"t", body=b"b") + encode_command(b"PUB", b"t", body=b"c"))
    assert take_frames(transport) == []  # blocked: the second PUB waits unread
    assert len(script.published) == 2
    written.callback(None)
    assert take_frames(transport) == [(FRAME_TYPE_RESPONSE, b"OK"), (FRAME_TYPE_RESPONSE, b"OK")]

    script.room = room = Deferred()
    proto.dataReceived(encode_command(b"PUB", b"t", body=b"d"))
    assert take_frames(transport) == [] and len(script.published) == 3
    room.callback(None)  # room: asked again, published
    assert take_frames(transport) == [(FRAME_TYPE_RESPONSE, b"OK")]
    assert proto.pub_counts == {"t": 4}


@pytest.mark.parametrize("how", ["now", "written", "room"])
def test_v2_refusals_are_fatal_pub_failed(how: str) -> None:
    nsqd, clock, script = scripted()
    proto, transport = connect(nsqd, clock)
    later: Deferred[None] = Deferred()
    if how == "now":
        script.room = ExitingError()
    elif how == "written":
        script.written = later
    else:
        script.room = later
    proto.dataReceived(encode_command(b"MPUB", b"t", body=b"\x00\x00\x00\x01\x00\x00\x00\x01a"))
    if how != "now":
        assert take_frames(transport) == []
        later.errback(BackendError("disk full") if how == "written" else ExitingError())
    why = b"disk full" if how == "written" else b"exiting"
    assert take_frames(transport) == [(FRAME_TYPE_ERROR, b"E_MPUB_FAILED MPUB failed " + why)]
    assert transport.disconnecting


# -- HTTP: "OK" now or later, 503 EXITING for any refusal -------------------------------------------

def test_http_answers_each_outcome() -> None:
    nsqd, clock, script = scripted()
    api = HTTPAPI(nsqd)
    assert api._publish("t", [b"a"]) == "OK"

    script.written = written = Deferred()
    answer = api._publish("t", [b"b"])
    assert isinstance(answer, Deferred)
    written.callback(None)
    assert answer.result == "OK"

    script.room = room = Deferred()
    answer = api._publish("t", [b"c"])
    assert isinstance(answer, Deferred) and len(script.published) == 2
    room.callback(None)
    assert answer.result == "OK" and len(script.published) == 3


def test_http_refusals_are_503_exiting() -> None:
    nsqd, clock, script = scripted()
    api = HTTPAPI(nsqd)
    script.room = ExitingError()
    with pytest.raises(APIError) as refused:
        api._publish("t", [b"a"])
    assert (refused.value.code, refused.value.text) == (503, "EXITING")

    script.written = written = Deferred()
    answer = api._publish("t", [b"b"])
    assert isinstance(answer, Deferred)
    written.errback(BackendError("disk full"))
    failure = answer.result
    answer.addErrback(lambda _: None)
    assert isinstance(failure, Failure) and failure.value.code == 503  # type: ignore[attr-defined]

    script.room = Deferred()  # never fires: 503 after the bounded wait
    answer = api._publish("t", [b"c"])
    assert isinstance(answer, Deferred)
    clock.advance(PUBLISH_ROOM_WAIT)
    failure = answer.result
    answer.addErrback(lambda _: None)
    assert isinstance(failure, Failure) and failure.value.text == "EXITING"  # type: ignore[attr-defined]


# -- a worker's link: an ACK record, OK or FAILED with why -------------------------------------------

def acks(transport: StringTransport) -> list[tuple[int, int, str]]:
    """The ACK records the core wrote: (seq, status, text)."""
    return [(seq, status, why) for kind, (seq, status, why) in link_records(transport) if kind == link.ACK]


def test_a_worker_link_acks_each_outcome() -> None:
    nsqd, clock, script = scripted()
    peer = WorkerPeer(nsqd, clock, 0)
    transport = StringTransport()
    peer.link.makeConnection(transport)
    identity = json.dumps(connect(nsqd, clock)[0].identity()).encode()  # a V2 client's, as a worker sends it
    peer.link.dataReceived(b"".join(link.encode(link.OPEN, 7, identity)))
    client = peer.clients[7]

    script.written = written = Deferred()
    script.room = room = Deferred()
    records = [link.encode(link.PUB, 1, 7, 0, b"t", [b"a"]), link.encode(link.PUB, 2, 7, 0, b"t", [b"b"])]
    peer.link.dataReceived(b"".join(b"".join(r) for r in records))
    clock.advance(0)
    assert acks(transport) == []  # 1 waits for room, 2 for its write
    written.callback(None)
    room.callback(None)
    peer.link.dataReceived(b"".join(link.encode(link.PUB, 3, 7, 0, b"t", [b"c"])))
    clock.advance(0)
    assert acks(transport) == [(2, link.ACK_OK, ""), (1, link.ACK_OK, ""), (3, link.ACK_OK, "")]
    assert client.pub_counts == {"t": 3}

    script.room = ExitingError()
    script.written = later = Deferred()
    records = [link.encode(link.PUB, 4, 7, 0, b"t", [b"d"]), link.encode(link.PUB, 5, 7, 0, b"t", [b"e"])]
    peer.link.dataReceived(b"".join(b"".join(r) for r in records))
    later.errback(BackendError("disk full"))
    script.room = room = Deferred()
    peer.link.dataReceived(b"".join(link.encode(link.PUB, 6, 7, 0, b"t", [b"f"])))
    room.errback(ExitingError())
    clock.advance(0)
    assert acks(transport) == [(4, link.ACK_FAILED, "exiting"), (5, link.ACK_FAILED, "disk full"),
                               (6, link.ACK_FAILED, "exiting")]
    assert client.pub_counts == {"t": 4}
