"""nsqd's side of discovery: a V1 client to every ``--lookupd-tcp-address``.

Each nsqlookupd gets a :class:`LookupPeer`: a ``ClientService`` that keeps one
connection up (reconnecting with backoff), opens it with the magic ``"  V1"``
and an IDENTIFY (broadcast address, hostname, ports, version) and, once
IDENTIFY is answered, registers every topic and channel the node has. After
that :class:`Lookup` forwards each creation and deletion as REGISTER or
UNREGISTER and PINGs every 15 s, as nsqd's lookupLoop does.

nsqlookupd drops everything a node registered when its connection closes,
so a new connection always starts from a full registration and a command
that finds no connection is simply dropped.
"""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import LoopingCall
from twisted.python.failure import Failure
from zope.interface import implementer

from nsqtw import NSQD_VERSION
from nsqtw._go.json import go_json, go_loads
from nsqtw.log import Logger
from nsqtw.lookupd.wire import MAGIC_V1, ResponseReader, encode_command, identify

__all__ = ["PING_INTERVAL", "Lookup", "LookupPeer", "LookupPeerProtocol", "peer_info_text"]

#: nsqd PINGs every nsqlookupd this often (and nsqlookupd's
#: --inactive-producer-timeout counts from the last PING)
PING_INTERVAL = 15.0
#: how long a connection attempt may take (nsqd dials with a 1 s timeout)
CONNECT_TIMEOUT = 1.0

EndpointFactory = Callable[[str], IStreamClientEndpoint]


def peer_info_text(info: dict[str, Any]) -> str:
    """nsqd's ``%+v`` of the IDENTIFY answer: ``{TCPPort:4160 HTTPPort:4161 Version:1.3.0 BroadcastAddress:h}``."""
    def get(key: str, kind: type, zero: Any) -> Any:
        value = info.get(key)
        return value if isinstance(value, kind) and not isinstance(value, bool) else zero

    return (f"{{TCPPort:{get('tcp_port', int, 0)} HTTPPort:{get('http_port', int, 0)} "
            f"Version:{get('version', str, '')} BroadcastAddress:{get('broadcast_address', str, '')}}}")


class _Sent:
    """A command waiting for its answer (compared by identity across heartbeats)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class LookupPeerProtocol(Protocol):
    """One connection to an nsqlookupd; commands are answered in order, so answers pair FIFO."""

    log = Logger()

    def __init__(self, peer: LookupPeer) -> None:
        self.peer = peer
        self.reader = ResponseReader(peer.lookup.max_response_size)
        #: the commands sent and not answered yet
        self.pending: deque[_Sent] = deque()
        self.ready = False
        self._oldest_at_last_tick: _Sent | None = None

    def connectionMade(self) -> None:
        self.transport.write(MAGIC_V1)  # type: ignore[union-attr]
        self.send(identify(self.peer.lookup.identify_body()), "IDENTIFY")

    def send(self, command: bytes, text: str) -> None:
        self.pending.append(_Sent(text))
        self.transport.write(command)  # type: ignore[union-attr]

    def dataReceived(self, data: bytes) -> None:
        self.reader.feed(data)
        while self.transport is not None and not self.transport.disconnecting:  # type: ignore[attr-defined]
            try:
                response = self.reader.next_response()
                if response is not None and not self.pending:
                    raise ValueError("response to no command")
            except ValueError as e:
                self.log.error("LOOKUPD({peer}): {command} - {error}", peer=self.peer.address,
                               command=self.pending[0].text if self.pending else "-", error=str(e))
                self.abort()
                return
            if response is None:
                return
            command = self.pending.popleft().text
            if command == "IDENTIFY":
                self._identified(response)
            elif response != b"OK":
                self.log.error("LOOKUPD({peer}): {command} - {error}", peer=self.peer.address,
                               command=command, error=response.decode("utf-8", "replace"))

    def _identified(self, response: bytes) -> None:
        address = self.peer.address
        if response == b"E_INVALID":
            self.log.info("LOOKUPD({peer}): lookupd returned {response}", peer=address,
                          response=response.decode())
            self.abort()
            return
        try:
            info = go_loads(response)
            if not isinstance(info, dict):
                raise ValueError(response)
        except ValueError:
            self.log.error("LOOKUPD({peer}): parsing response - {response}", peer=address,
                           response=response.decode("utf-8", "replace"))
            self.abort()
            return
        self.log.info("LOOKUPD({peer}): peer info {info}", peer=address, info=peer_info_text(info))
        if not info.get("broadcast_address"):
            self.log.error("LOOKUPD({peer}): no broadcast address", peer=address)
        self.ready = True
        port = info.get("http_port")
        if isinstance(port, int) and port > 0:
            host = address.rsplit(":", 1)[0]
            self.peer.http_address = f"{host}:{port}"
        self.peer.connected(self)

    def heartbeat(self) -> None:
        """PING; a connection whose oldest command went unanswered for a whole interval is dropped."""
        oldest = self.pending[0] if self.pending else None
        if oldest is not None and oldest is self._oldest_at_last_tick:
            self.log.error("LOOKUPD({peer}): {command} - no response", peer=self.peer.address,
                           command=oldest.text)
            self.abort()
            return
        if self.ready:
            self.log.debug("LOOKUPD({peer}): sending heartbeat", peer=self.peer.address)
            self.send(encode_command("PING"), "PING")
        self._oldest_at_last_tick = self.pending[0] if self.pending else None

    def abort(self) -> None:
        self.ready = False
        if self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]

    def connectionLost(self, reason: Failure = Failure(ConnectionError())) -> None:
        self.ready = False
        self.peer.disconnected(self)


class _PeerFactory(Factory):
    noisy = False

    def __init__(self, peer: LookupPeer) -> None:
        self.peer = peer

    def buildProtocol(self, addr: Any) -> LookupPeerProtocol:
        return LookupPeerProtocol(self.peer)


@implementer(IStreamClientEndpoint)
class _LoggedEndpoint:
    """Logs each failed connection attempt the way nsqd logs a failed lookupd command."""

    log = Logger()

    def __init__(self, address: str, endpoint: IStreamClientEndpoint) -> None:
        self.address = address
        self.endpoint = endpoint
        #: the peer is being stopped: an attempt cancelled now failed for no reason worth a line
        #: (a start that failed stopped it mid-resolution: "DNS lookup failed '127.0.0.1'")
        self.stopping = False

    def connect(self, factory: Any) -> Deferred[Any]:
        d: Deferred[Any] = self.endpoint.connect(factory)

        def failed(f: Failure) -> Failure:
            if not self.stopping:
                self.log.error("LOOKUPD({peer}): connect - {error}", peer=self.address,
                               error=f.getErrorMessage())
            return f

        return d.addErrback(failed)


class LookupPeer:
    """One nsqlookupd: a reconnecting connection and the commands sent over it."""

    log = Logger()

    def __init__(self, lookup: Lookup, address: str, endpoint: IStreamClientEndpoint) -> None:
        self.lookup = lookup
        self.address = address
        self.connection: LookupPeerProtocol | None = None
        #: the lookupd's HTTP address, from its IDENTIFY answer (``--replicas=2`` reads its /nodes)
        self.http_address: str | None = None
        # imported here: ClientService brings automat, which a node without nsqlookupd never needs
        from twisted.application.internet import ClientService, backoffPolicy

        self._endpoint = _LoggedEndpoint(address, endpoint)
        self.service = ClientService(
            self._endpoint, _PeerFactory(self),
            retryPolicy=backoffPolicy(initialDelay=0.5, maxDelay=PING_INTERVAL, factor=1.5),
            clock=lookup.clock)

    def start(self) -> None:
        self.service.startService()

    def stop(self) -> Deferred[Any]:
        self._endpoint.stopping = True
        d = self.service.stopService()
        return d if d is not None else succeed(None)

    def connected(self, connection: LookupPeerProtocol) -> None:
        """IDENTIFY was answered: register everything this node has, then tell those who read the
        lookupds' HTTP addresses (:attr:`Lookup.identified`)."""
        self.connection = connection
        for command, text in self.lookup.registrations():
            self.log.info("LOOKUPD({peer}): {command}", peer=self.address, command=text)
            connection.send(command, text)
        for identified in self.lookup.identified:
            identified()

    def disconnected(self, connection: LookupPeerProtocol) -> None:
        if self.connection is connection:
            self.connection = None

    def command(self, command: bytes, text: str, branch: str) -> None:
        if self.connection is not None and self.connection.ready:
            self.log.info("LOOKUPD({peer}): {branch} {command}", peer=self.address, branch=branch,
                          command=text)
            self.connection.send(command, text)

    def heartbeat(self) -> None:
        if self.connection is not None:
            self.connection.heartbeat()


class Lookup(Service):
    """Keeps every configured nsqlookupd told about this node's topics and channels.

    Listens to the NSQD registry (topics and channels created and deleted) and
    to ``PUT /config/nsqlookupd_tcp_addresses``, which adds and removes peers
    at run time.
    """

    log = Logger()

    def __init__(self, nsqd: Any, clock: Any, connect: EndpointFactory,
                 hostname: str | None = None) -> None:
        self.nsqd = nsqd
        self.clock = clock
        self.connect = connect
        self.hostname = socket.gethostname() if hostname is None else hostname
        self.peers: dict[str, LookupPeer] = {}
        #: called each time a lookupd answers IDENTIFY (its HTTP address known from then on: see
        #: :meth:`lookupd_http_addresses`); ``--replicas=2`` reads its /nodes at once
        self.identified: list[Callable[[], None]] = []
        #: nsqd bounds lookupd answers by --max-body-size
        self.max_response_size = int(getattr(nsqd.options, "max_body_size", 5 * 1024 * 1024))
        self._heartbeat = LoopingCall(self.heartbeat)
        self._heartbeat.clock = clock

    # -- service -------------------------------------------------------------------------

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self.nsqd.listeners.append(self)
        self.nsqd.config_listeners.append(self.config_changed)
        self.sync_peers()
        self._heartbeat.start(PING_INTERVAL, now=False)

    def stopService(self) -> Deferred[Any]:
        super().stopService()  # type: ignore[no-untyped-call]
        if self in self.nsqd.listeners:
            self.nsqd.listeners.remove(self)
        if self.config_changed in self.nsqd.config_listeners:
            self.nsqd.config_listeners.remove(self.config_changed)
        if self._heartbeat.running:
            self._heartbeat.stop()
        self.log.info("LOOKUP: closing")
        peers, self.peers = list(self.peers.values()), {}
        return DeferredList([p.stop() for p in peers], consumeErrors=True)

    def lookupd_http_addresses(self) -> list[str]:
        """The HTTP addresses of the lookupds this node registers with, as their IDENTIFY answers gave."""
        return [p.http_address for p in self.peers.values() if p.http_address]

    def config_changed(self, name: str) -> None:
        if name == "nsqlookupd_tcp_addresses":
            self.sync_peers()

    def sync_peers(self) -> None:
        """Connect to every configured address not yet connected; drop the others."""
        wanted = list(dict.fromkeys(self.nsqd.runtime_lookupd_tcp_addresses or []))
        keep = set(wanted)
        for address in list(self.peers):
            if address not in keep:
                self.log.info("LOOKUP({peer}): removing peer", peer=address)
                self.peers.pop(address).stop()
        for address in wanted:
            if address in self.peers or not self.running:
                continue
            try:
                endpoint = self.connect(address)
            except ValueError as e:
                self.log.error("LOOKUP({peer}): bad address - {error}", peer=address, error=str(e))
                continue
            self.log.info("LOOKUP({peer}): adding peer", peer=address)
            peer = self.peers[address] = LookupPeer(self, address, endpoint)
            peer.start()

    def heartbeat(self) -> None:
        for peer in list(self.peers.values()):
            peer.heartbeat()

    # -- what nsqlookupd is told ---------------------------------------------------------------

    def identify_body(self) -> bytes:
        """IDENTIFY's JSON: keys sorted, as Go marshals nsqd's map; ports as broadcast."""
        nsqd = self.nsqd
        o = nsqd.options
        return go_json({
            "broadcast_address": o.broadcast_address,
            "hostname": self.hostname,
            "http_port": o.broadcast_http_port or nsqd.http_port,
            "tcp_port": o.broadcast_tcp_port or nsqd.tcp_port,
            "version": NSQD_VERSION,
        })

    def registrations(self) -> list[tuple[bytes, str]]:
        """REGISTER for every channel, and for every topic that has none (nsqd's full sync)."""
        out: list[tuple[bytes, str]] = []
        for topic in list(self.nsqd.topics.values()):
            names = [(topic.name, c) for c in topic.channels] or [(topic.name, "")]
            out.extend(_command("REGISTER", t, c) for t, c in names)
        return out

    def _tell(self, branch: str, action: str, topic: str, channel: str = "") -> None:
        command, text = _command(action, topic, channel)
        for peer in list(self.peers.values()):
            peer.command(command, text, branch)

    # -- IRegistryListener ----------------------------------------------------------------------

    def topic_created(self, topic: Any) -> None:
        self._tell("topic", "REGISTER", topic.name)

    def topic_deleted(self, topic: Any) -> None:
        self._tell("topic", "UNREGISTER", topic.name)

    def channel_created(self, topic: Any, channel: Any) -> None:
        self._tell("channel", "REGISTER", topic.name, channel.name)

    def channel_deleted(self, topic: Any, channel: Any) -> None:
        self._tell("channel", "UNREGISTER", topic.name, channel.name)


def _command(action: str, topic: str, channel: str = "") -> tuple[bytes, str]:
    command = encode_command(action, topic, channel)
    return command, command[:-1].decode("utf-8", "surrogateescape")
