"""One replication link: records both ways over a connection to the replica's HTTP port.

The owner connects to its replica's HTTP port and asks
``GET /replication/link`` with ``Upgrade: nsqtw-replication/1``; once the
replica answers ``101 Switching Protocols`` the connection carries records
(:mod:`nsqtw.replica.records`) both ways. The HTTP port, not a port of its
own: nothing more to configure or open, and with ``--workers`` the HTTP
listener is in the core with the topics.

A turn's records leave in one write at the turn's end
(:func:`~nsqtw.net.turn.turn_end_caller`: no timed call, no extra reactor
iteration), and those asked while the link's own input is read (the
replica's ACKs) at the end of that read; straight to the socket when Twisted
holds nothing unsent for it (:func:`~nsqtw.net.eager.direct_sender`: no
``epoll`` turn for a replicated publish's record or its ACK); a side that sent nothing for
:data:`BEAT_INTERVAL` (less with a short ``--replica-timeout``: a tenth of it) sends a
``BEAT``, so silence means trouble. With ``--replica-secret-file`` each side
first proves it knows the secret (:mod:`nsqtw.replica.proof`): the nonces
travel in the upgrade's head, each side's first record is its ``PROOF``,
and the handler hears of the link (``link_up``) only once the peer's checks.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final
from typing import Protocol as TypingProtocol

from twisted.internet.interfaces import IDelayedCall, IReactorTime, ITCPTransport
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.python.failure import Failure

from nsqtw.log import Logger
from nsqtw.net.eager import direct_sender
from nsqtw.net.turn import turn_end_caller
from nsqtw.replica.proof import ACCEPT, CONNECT, NONCE_HEADER, new_nonce, nonce_of, proof, valid
from nsqtw.replica.records import Kind, frame, split_records

__all__ = ["BEAT_INTERVAL", "PROOF_BEATS", "UPGRADE", "Link", "LinkHandler", "OwnerLink", "accept_nonces",
           "accepted_link", "beat_interval", "open_link", "upgrade_request"]

#: seconds without a record sent before a BEAT goes (at most: :func:`beat_interval`)
BEAT_INTERVAL: Final = 1.0


def beat_interval(timeout: float) -> float:
    """The BEAT interval for ``--replica-timeout``: a third of the timeout, the silence that replaces
    a replica, is always three beats or more."""
    return min(BEAT_INTERVAL, timeout / 10)


#: beats a side with a secret waits for the peer's PROOF (as long as ``--replica-timeout``'s
#: silence, at most 10 s) before it refuses the link: a peer that connects and stalls holds nothing
PROOF_BEATS: Final = 10
#: the ``Upgrade`` token of the link
UPGRADE: Final = b"nsqtw-replication/1"
#: the most bytes of the replica's HTTP answer the owner reads before the records
_MAX_HEAD: Final = 8192


class LinkHandler(TypingProtocol):
    """What a side does with its link's records."""

    def link_up(self, link: Link) -> None: ...

    def link_record(self, link: Link, kind: int, payload: bytes) -> None: ...

    def link_read(self, link: Link) -> None: ...

    def link_lost(self, link: Link, reason: str) -> None: ...


def upgrade_request(host: str, nonce: bytes) -> bytes:
    return (b"GET /replication/link HTTP/1.1\r\nHost: " + host.encode() +
            b"\r\nConnection: Upgrade\r\nUpgrade: " + UPGRADE + b"\r\n" + NONCE_HEADER + b": " + nonce +
            b"\r\n\r\n")


class Link(Protocol):
    """Records in and out; numbered per direction (the first is 1)."""

    log = Logger()

    #: which side of the connection this is (its PROOF is made for it)
    role = ACCEPT

    def __init__(self, handler: LinkHandler, clock: IReactorTime, beat: float = BEAT_INTERVAL,
                 secret: bytes | None = None, nonces: tuple[bytes, bytes] = (b"", b"")) -> None:
        self.handler = handler
        #: the cluster's replica secret (``--replica-secret-file``), None: peers are not asked to prove it
        self.secret = secret
        #: this side's nonce and the peer's, as the upgrade's head carries them (b"": none)
        self.own_nonce, self.peer_nonce = nonces
        #: a secret is set and the peer's PROOF has not come yet: nothing of it is taken
        self.proving = False
        #: the peer could not prove it knows the secret: nothing more is read
        self.refused = False
        self.clock = clock
        self.beat = beat
        #: records sent and taken in so far (an ACK names ``received``)
        self.sent = 0
        self.received = 0
        #: when the last record arrived, and when the last one left (reactor seconds)
        self.last_heard = clock.seconds()
        self._last_sent = self.last_heard
        self._out: list[bytes] = []
        #: writes to the socket at once (a plain TCP connection), else None: Twisted's write
        self._direct: Callable[[bytes], None] | None = None
        #: runs the flush at the end of this reactor turn
        self._at_turn_end = turn_end_caller(clock)
        #: a flush is asked for (at the turn's end, or at the end of the read under way)
        self._flush_due = False
        #: records are being read: what they make us send leaves at the end of the read
        self._reading = False
        self._beat_call: IDelayedCall | None = None
        #: the bytes of a record not whole yet, as they came, and how many it needs in all (0: not
        #: known yet); joined once there are enough, so a record of many reads is copied once
        self._partial: list[bytes] = []
        self._partial_size = 0
        self._need = 0
        self.connected_up = False
        self.closed = False
        #: the peer's HELLO, once it came
        self.hello: dict[str, Any] | None = None

    # -- up and down ------------------------------------------------------------------------

    def records_begin(self) -> None:
        """The connection carries records from now on."""
        self.connected_up = True
        self._direct = direct_sender(self.transport)
        self.last_heard = self._last_sent = self.clock.seconds()
        self._beat_call = self.clock.callLater(self.beat, self._beat)
        if self.secret is None:
            self.handler.link_up(self)
            return
        if not self.peer_nonce:
            self._refuse("its upgrade carried no nonce (an nsqtw too old for --replica-secret-file)")
            return
        self.proving = True
        # the proof leaves now, not at the turn's end: the peer's own may be in the same read, and a
        # refusal of it must not keep ours back (the peer could not tell why the link went)
        self.send(frame(Kind.PROOF, proof(self.secret, self.role, self.peer_nonce, self.own_nonce)))
        self._flush()

    def _refuse(self, why: str) -> None:
        self.log.error("REPLICATION: link with {peer} refused - {why}", peer=self.peer_text(), why=why)
        self.refused = True
        self.proving = False
        self._out.clear()
        self.abort()

    def connectionLost(self, reason: Failure = Failure(ConnectionError())) -> None:
        self.closed = True
        if self._beat_call is not None and self._beat_call.active():
            self._beat_call.cancel()
        self._beat_call = None
        self.handler.link_lost(self, reason.getErrorMessage())

    def flush_now(self) -> None:
        """Write what is queued now (a flush asked for the turn's end then finds nothing)."""
        self._flush()

    def close_now(self) -> None:
        """Write what is queued, then close."""
        self.flush_now()
        if self.transport is not None and not self.closed:
            self.transport.loseConnection()

    def abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abortConnection()  # type: ignore[attr-defined]

    # -- out --------------------------------------------------------------------------------

    def send(self, record: bytes) -> int:
        """Queue one encoded record for this turn's write; its number."""
        self._out.append(record)
        self.sent += 1
        if not self._flush_due:
            self._flush_due = True
            if not self._reading:
                self._at_turn_end(self._flush)
        return self.sent

    def _flush(self) -> None:
        self._flush_due = False
        out, self._out = self._out, []
        if out and not self.closed and self.transport is not None:
            if self._direct is not None:
                self._direct(b"".join(out))  # (one record: itself, not a copy)
            else:
                self.transport.writeSequence(out)
            self._last_sent = self.clock.seconds()

    def _beat(self) -> None:
        self._beat_call = self.clock.callLater(self.beat, self._beat)
        if self.proving and self.clock.seconds() - self.last_heard >= PROOF_BEATS * self.beat:
            self._refuse(f"it sent no proof within {PROOF_BEATS * self.beat:g}s")  # (nothing heard since the 101)
            return
        if self.clock.seconds() - self._last_sent >= self.beat and not self._out:
            self.send(frame(Kind.BEAT))

    # -- in ---------------------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        if not self.connected_up or self.refused:
            return
        if self._partial:
            self._partial.append(data)
            self._partial_size += len(data)
            if self._partial_size < self._need:
                return
            buf = b"".join(self._partial)
            self._partial = []
        else:
            buf = data
        try:
            records, rest = split_records(buf)
        except ValueError as e:
            self.log.error("REPLICATION: bad record from {peer} - {error}", peer=self.peer_text(), error=e)
            self.abort()
            return
        if rest:
            self._partial = [rest]
            self._partial_size = len(rest)
            self._need = 4 + int.from_bytes(rest[:4], "big") if len(rest) >= 4 else 0
        if not records:
            return
        self.last_heard = self.clock.seconds()
        # what the records make this side send (the replica's ACK) leaves at the end of the read,
        # not a turn later: it is what an OK waits for
        self._reading = True
        try:
            for kind, payload in records:
                self.received += 1
                if self.proving:
                    if not self._proven(kind, payload):
                        return
                elif kind != Kind.BEAT and kind != Kind.PROOF:  # (a PROOF to a side without a secret)
                    try:
                        self.handler.link_record(self, kind, payload)
                    except (ValueError, KeyError, TypeError, struct.error) as e:  # cut short or malformed
                        self.log.error("REPLICATION: bad record from {peer} - {error}",
                                       peer=self.peer_text(), error=e)
                        self._out.clear()
                        self.abort()
                        return
            if not self.proving:
                self.handler.link_read(self)
        finally:
            self._reading = False
            if self._flush_due:
                self._flush()

    def _proven(self, kind: int, payload: bytes) -> bool:
        """The peer's first record, while this side has a secret: its PROOF that checks (the link is up
        from now on), else the link is refused."""
        assert self.secret is not None
        role = ACCEPT if self.role == CONNECT else CONNECT
        if kind != Kind.PROOF or not valid(self.secret, payload, role, self.own_nonce, self.peer_nonce):
            self._refuse("it did not prove it knows the replica secret (--replica-secret-file)"
                         if kind == Kind.PROOF or kind == Kind.HELLO else f"record {kind} before its proof")
            return False
        self.proving = False
        self.handler.link_up(self)
        return True

    def peer_text(self) -> str:
        peer = self.transport.getPeer() if self.transport is not None else None
        host = getattr(peer, "host", "?")
        port = getattr(peer, "port", "?")
        return f"{host}:{port}"


class OwnerLink(Link):
    """The connecting end (an owner, or a replica with notes): asks for the upgrade, then carries records."""

    role = CONNECT

    def __init__(self, handler: LinkHandler, clock: IReactorTime, host: str, beat: float = BEAT_INTERVAL,
                 secret: bytes | None = None) -> None:
        super().__init__(handler, clock, beat, secret, (new_nonce(), b""))  # (the peer's comes in its 101)
        self.host = host
        self._head = b""

    def connectionMade(self) -> None:
        if ITCPTransport.providedBy(self.transport):
            self.transport.setTcpNoDelay(True)  # records are small: no Nagle wait
        self.transport.write(upgrade_request(self.host, self.own_nonce))  # type: ignore[union-attr]

    def dataReceived(self, data: bytes) -> None:
        if self.connected_up:
            super().dataReceived(data)
            return
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > _MAX_HEAD:
                self.abort()
            return
        head, rest = self._head[:end], self._head[end + 4:]
        self._head = b""
        if not head.startswith(b"HTTP/1.1 101 "):
            self.log.warn("REPLICATION({peer}): link refused - {answer}", peer=self.host,
                          answer=head.split(b"\r\n", 1)[0].decode("utf-8", "replace"))
            self.abort()
            return
        self.peer_nonce = nonce_of(head)
        self.records_begin()
        if rest:
            super().dataReceived(rest)


def open_link(reactor: Any, host: str, http_port: int, handler: LinkHandler, beat: float, timeout: float,
              failed: Callable[[str], None], secret: bytes | None = None) -> None:
    """Connect to a peer's HTTP port for a link (an :class:`OwnerLink`, ``handler``'s records, the
    reactor's clock); a connection that cannot be made is ``failed(why)``."""
    address = f"{host}:{http_port}"

    class _Factory(ClientFactory):
        noisy = False

        def buildProtocol(self, addr: Any) -> OwnerLink:
            return OwnerLink(handler, reactor, address, beat, secret)

        def clientConnectionFailed(self, connector: Any, reason: Any) -> None:
            failed(reason.getErrorMessage())

    reactor.connectTCP(host, http_port, _Factory(), timeout=timeout)


def accepted_link(handler: LinkHandler, clock: IReactorTime, transport: Any, beat: float = BEAT_INTERVAL,
                  secret: bytes | None = None, nonces: tuple[bytes, bytes] = (b"", b"")) -> Link:
    """The answering end of a link whose upgrade its HTTP channel just answered; ``nonces``: its own,
    sent in the ``101``, and the one the request carried (:func:`accept_nonces`)."""
    link = Link(handler, clock, beat, secret, nonces)
    link.makeConnection(transport)  # type: ignore[no-untyped-call]
    link.records_begin()
    return link


def accept_nonces(head: bytes) -> tuple[tuple[bytes, bytes], list[bytes]]:
    """For an upgrade request's ``head``: the answering side's fresh nonce and the request's (b"" for
    none), for :func:`accepted_link`, and the ``101``'s header line that carries the former."""
    own = new_nonce()
    return (own, nonce_of(head)), [NONCE_HEADER + b": " + own]
