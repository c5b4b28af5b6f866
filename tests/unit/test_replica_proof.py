"""A link's two sides prove they know the replica secret before either takes the other's records.

Socket-free: an :class:`OwnerLink` and an accepted :class:`Link` on
StringTransports, the upgrade's head and ``101`` passed between them as the
HTTP channel does (the real processes: tests/reliability/test_replica_secret.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import globalLogPublisher

from nsqtw.replica.link import BEAT_INTERVAL, PROOF_BEATS, Link, OwnerLink, accept_nonces, accepted_link
from nsqtw.replica.proof import ACCEPT, CONNECT, new_nonce, nonce_of, proof, valid
from nsqtw.replica.records import Kind, encode_json, frame, split_records
from tests.unit.test_replica import Handler

SECRET = b"the cluster's secret"


class Hello(Handler):
    """Says HELLO as soon as its link is up, as both sides of a real link do."""

    def link_up(self, link: Link) -> None:
        super().link_up(link)
        link.send(encode_json(Kind.HELLO, {"node": "n"}))


class Pair:
    """An owner's link and the replica's, joined by hand."""

    def __init__(self, owner_secret: bytes | None, replica_secret: bytes | None, head_nonce: bool = True) -> None:
        self.clock = Clock()
        self.owner_handler, self.replica_handler = Hello(), Hello()
        self.owner = OwnerLink(self.owner_handler, self.clock, "10.0.0.2:4151", secret=owner_secret)
        self.owner_transport, self.replica_transport = StringTransport(), StringTransport()
        self.owner.makeConnection(self.owner_transport)
        head = self.owner_transport.value().split(b"\r\n\r\n")[0]
        self.owner_transport.clear()
        if not head_nonce:  # an nsqtw from before the nonces
            head = b"\r\n".join(line for line in head.split(b"\r\n") if not line.startswith(b"Nsqtw-Nonce"))
        nonces, lines = accept_nonces(head)
        self.replica = accepted_link(self.replica_handler, self.clock, self.replica_transport, secret=replica_secret,
                                     nonces=nonces)
        self.owner.dataReceived(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "
                                b"nsqtw-replication/1\r\n" + b"".join(line + b"\r\n" for line in lines) + b"\r\n")

    def run(self) -> None:
        """Turns until neither side has anything more to say."""
        for _ in range(10):
            self.clock.advance(0)
            to_replica, to_owner = self.owner_transport.value(), self.replica_transport.value()
            self.owner_transport.clear()
            self.replica_transport.clear()
            if not (to_replica or to_owner):
                return
            if to_replica and not self.replica_transport.disconnecting:
                self.replica.dataReceived(to_replica)
            if to_owner and not self.owner_transport.disconnecting:
                self.owner.dataReceived(to_owner)


@pytest.fixture
def errors() -> Any:
    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)
    yield lambda: [e["why"] for e in events if e.get("log_level") is not None and "why" in e
                   and e["log_level"].name == "error"]
    globalLogPublisher.removeObserver(events.append)


def test_sides_that_share_the_secret_are_up_after_the_proofs_and_never_see_them() -> None:
    pair = Pair(SECRET, SECRET)
    assert pair.owner_handler.ups == [] and pair.replica_handler.ups == []  # nothing before the peer's proof
    pair.run()
    assert pair.owner_handler.ups == [pair.owner] and pair.replica_handler.ups == [pair.replica]
    assert pair.owner_handler.records == pair.replica_handler.records == [(Kind.HELLO, b'{"node":"n"}')]
    assert not (pair.owner_transport.disconnecting or pair.replica_transport.disconnecting)
    assert pair.owner.sent == pair.replica.received == 2  # PROOF then HELLO: numbered alike on both sides


def test_without_a_secret_on_either_side_the_link_is_as_before() -> None:
    pair = Pair(None, None)
    assert pair.owner_handler.ups == [pair.owner] and pair.replica_handler.ups == [pair.replica]
    pair.run()
    assert pair.owner.sent == pair.replica.received == 1
    assert pair.replica_handler.records == [(Kind.HELLO, b'{"node":"n"}')]


@pytest.mark.parametrize("owner_secret, replica_secret, refuser", [
    (SECRET, b"another secret", "both"),
    (None, SECRET, "replica"),  # a node without the secret reaching one that has it
    (SECRET, None, "owner"),
])
def test_a_side_with_a_secret_takes_nothing_from_a_peer_that_cannot_prove_it(
        errors: Any, owner_secret: bytes | None, replica_secret: bytes | None, refuser: str) -> None:
    pair = Pair(owner_secret, replica_secret)
    pair.run()
    sides = {"owner": (pair.owner_handler, pair.owner_transport), "replica": (pair.replica_handler,
                                                                              pair.replica_transport)}
    for name, (handler, transport) in sides.items():
        if refuser in (name, "both"):
            assert handler.ups == [] and handler.records == [] and transport.disconnecting, name
    assert errors() and all("did not prove it knows the replica secret" in why for why in errors())


def test_a_secret_side_says_nothing_but_its_proof_to_an_unproven_peer() -> None:
    """No HELLO, no message leaves for a node that has not shown the secret (an owner's records
    sent to whatever lookupd named)."""
    pair = Pair(SECRET, SECRET)
    pair.clock.advance(0)
    assert [k for k, _ in split_records(pair.owner_transport.value())[0]] == [Kind.PROOF]
    assert [k for k, _ in split_records(pair.replica_transport.value())[0]] == [Kind.PROOF]


def test_a_refusing_owner_still_sends_its_proof_when_the_peers_came_with_the_101(errors: Any) -> None:
    """The 101 and the replica's PROOF often arrive in one read: the owner refuses that proof, but its
    own has left already, so the replica refuses too and says why (not just a closed connection)."""
    clock = Clock()
    owner_handler, replica_handler = Hello(), Hello()
    owner = OwnerLink(owner_handler, clock, "10.0.0.2:4151", secret=SECRET)
    owner_transport, replica_transport = StringTransport(), StringTransport()
    owner.makeConnection(owner_transport)
    nonces, lines = accept_nonces(owner_transport.value().split(b"\r\n\r\n")[0])
    owner_transport.clear()
    replica = accepted_link(replica_handler, clock, replica_transport, secret=b"another secret", nonces=nonces)
    owner.dataReceived(b"HTTP/1.1 101 Switching Protocols\r\n" + b"".join(line + b"\r\n" for line in lines)
                       + b"\r\n" + replica_transport.value())
    assert owner_transport.disconnecting and owner_handler.ups == []
    assert [k for k, _ in split_records(owner_transport.value())[0]] == [Kind.PROOF]
    replica.dataReceived(owner_transport.value())
    assert replica_transport.disconnecting and replica_handler.ups == []
    assert errors() == ["it did not prove it knows the replica secret (--replica-secret-file)"] * 2


def test_a_peer_that_stalls_before_its_proof_is_refused_after_proof_beats(errors: Any) -> None:
    """A side with a secret whose peer connects and then says nothing closes the link after
    PROOF_BEATS beats (10 s with the default --replica-timeout), and not before."""
    pair = Pair(SECRET, SECRET)
    pair.clock.advance(0)  # each side's PROOF is written, and never delivered to the other
    for _ in range(PROOF_BEATS - 1):
        pair.clock.advance(BEAT_INTERVAL)
    assert not (pair.owner_transport.disconnecting or pair.replica_transport.disconnecting)
    pair.clock.advance(BEAT_INTERVAL)
    assert pair.owner_transport.disconnecting and pair.replica_transport.disconnecting
    assert pair.owner_handler.ups == [] and pair.replica_handler.ups == []
    assert errors() == [f"it sent no proof within {PROOF_BEATS * BEAT_INTERVAL:g}s"] * 2


def test_a_proof_from_another_connection_or_reflected_back_is_refused(errors: Any) -> None:
    first = Pair(SECRET, SECRET)
    first.clock.advance(0)
    [(_, overheard)] = split_records(first.owner_transport.value())[0]
    replayed = Pair(None, SECRET)  # an attacker without the secret, sending the proof it overheard
    replayed.clock.advance(0)
    replayed.replica.dataReceived(frame(Kind.PROOF, overheard))
    assert replayed.replica_handler.ups == [] and replayed.replica_transport.disconnecting
    reflected = Pair(None, SECRET)  # the replica's own proof, sent back to it
    reflected.clock.advance(0)
    [(_, own)] = split_records(reflected.replica_transport.value())[0]
    reflected.replica.dataReceived(frame(Kind.PROOF, own))
    assert reflected.replica_handler.ups == [] and reflected.replica_transport.disconnecting
    assert len(errors()) == 2


def test_an_upgrade_without_a_nonce_is_refused_by_a_side_with_a_secret(errors: Any) -> None:
    pair = Pair(SECRET, SECRET, head_nonce=False)
    assert pair.replica_transport.disconnecting and pair.replica_handler.ups == []
    assert errors() == ["its upgrade carried no nonce (an nsqtw too old for --replica-secret-file)"]


def test_a_bad_first_record_names_itself(errors: Any) -> None:
    pair = Pair(None, SECRET)
    pair.replica.dataReceived(frame(Kind.BEAT))
    assert errors() == [f"record {int(Kind.BEAT)} before its proof"]


def test_proofs_are_bound_to_role_and_both_nonces() -> None:
    a, b = new_nonce(), new_nonce()
    made = proof(SECRET, CONNECT, a, b)
    assert valid(SECRET, made, CONNECT, a, b)
    assert not valid(SECRET, made, ACCEPT, a, b)  # the other direction
    assert not valid(SECRET, made, CONNECT, b, a)  # nonces swapped
    assert not valid(b"other", made, CONNECT, a, b)
    assert not valid(SECRET, made, CONNECT, b"", b)  # no nonce: never valid
    assert len(made) == 32 and a != b and len(a) == 32


@pytest.mark.parametrize("line, nonce", [
    (b"Nsqtw-Nonce: " + b"ab" * 16, b"ab" * 16),
    (b"nsqtw-nonce:" + b"AB" * 16, b"ab" * 16),  # header names are case-insensitive; hex read as lowercase
    (b"Nsqtw-Nonce: " + b"ab" * 15, b""),  # too short
    (b"Nsqtw-Nonce: " + b"zz" * 16, b""),  # not hex
    (b"X-Other: " + b"ab" * 16, b""),
])
def test_the_nonce_is_read_from_the_head(line: bytes, nonce: bytes) -> None:
    assert nonce_of(b"GET /replication/link HTTP/1.1\r\nHost: x\r\n" + line) == nonce
    assert nonce_of(line) == b""  # (the first line is the request or status line, never a header)
