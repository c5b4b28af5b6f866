"""nsqd's lookupd client in memory: an NSQD talking to an NSQLookupd over iosim pumps."""

from __future__ import annotations

import dataclasses
import json
import struct
from typing import Any

from twisted.internet.defer import succeed
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.testing import StringTransport
from twisted.test import iosim
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from nsqtw.lookupd.db import Registration
from nsqtw.lookupd.protocol import LookupFactory
from nsqtw.nsqd.lookup import PING_INTERVAL, Lookup, LookupPeerProtocol, peer_info_text
from tests.helpers import make_lookupd, make_nsqd


@implementer(IStreamClientEndpoint)
class LoopbackEndpoint:
    """Connects a client factory to a lookupd's V1 factory through an in-memory pump."""

    def __init__(self, server_factory: Any) -> None:
        self.server_factory = server_factory
        self.pumps: list[iosim.IOPump] = []
        self.refuse = False
        self.attempts = 0

    def connect(self, factory: Any) -> Any:
        self.attempts += 1
        if self.refuse:
            from twisted.internet.defer import fail
            from twisted.internet.error import ConnectionRefusedError

            return fail(ConnectionRefusedError())
        client = factory.buildProtocol(None)
        server = self.server_factory.buildProtocol(None)
        pump = iosim.connect(server, iosim.makeFakeServer(server), client,
                             iosim.makeFakeClient(client), greet=False)
        self.pumps.append(pump)
        return succeed(client)

    def flush(self) -> None:
        for _ in range(3):
            for pump in self.pumps:
                pump.flush()


class Cluster:
    """One nsqd (with a Lookup) and one lookupd, sharing a task.Clock."""

    def __init__(self) -> None:
        self.nsqd, self.clock = make_nsqd(broadcast_address="127.0.0.1",
                                          lookupd_tcp_address=("lookupd:4160",))
        self.nsqd.tcp_port, self.nsqd.http_port = 4150, 4151
        self.lookupd, _ = make_lookupd()
        self.lookupd.clock = self.lookupd.db.clock = self.clock
        self.endpoint = LoopbackEndpoint(LookupFactory(self.lookupd))
        self.addresses: list[str] = []
        self.lookup = Lookup(self.nsqd, self.clock, self._connect, hostname="node1")

    def _connect(self, address: str) -> Any:
        if ":" not in address:
            raise ValueError(f"missing port in address {address!r}")
        self.addresses.append(address)
        return self.endpoint

    def registered(self) -> set[Registration]:
        """Registrations this nsqd is a producer under (besides "client")."""
        return {k for k, ps in self.lookupd.db.registrations.items()
                if ps and k.category != "client"}

    def flush(self) -> None:
        self.endpoint.flush()


def reg(category: str, key: str, subkey: str = "") -> Registration:
    return Registration(category, key, subkey)


class LookupClientTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.c = Cluster()

    def tearDown(self) -> None:
        if self.c.lookup.running:
            self.c.lookup.stopService()
            self.c.flush()

    def test_identify_and_full_registration(self) -> None:
        """On connect nsqd IDENTIFIES with its broadcast ports and registers what it has."""
        t = self.c.nsqd.get_topic("t")
        t.get_channel("c1")
        t.get_channel("c2")
        self.c.nsqd.get_topic("lonely")
        self.c.lookup.startService()
        self.c.flush()
        [client] = self.c.lookupd.db.find_producers("client", "", "")
        peer = client.peer
        self.assertEqual((peer.broadcast_address, peer.hostname, peer.tcp_port, peer.http_port,
                          peer.version), ("127.0.0.1", "node1", 4150, 4151, "1.3.0"))
        self.assertEqual(self.c.registered(), {reg("topic", "t"), reg("channel", "t", "c1"),
                                               reg("channel", "t", "c2"), reg("topic", "lonely")})
        self.assertEqual(self.c.addresses, ["lookupd:4160"])

    def test_identified_hooks_are_told_once_the_lookupds_http_address_is_known(self) -> None:
        """--replicas=2 reads lookupd's /nodes as soon as it answered IDENTIFY (its HTTP address)."""
        seen: list[list[str]] = []
        self.c.lookup.identified.append(lambda: seen.append(self.c.lookup.lookupd_http_addresses()))
        self.c.lookup.startService()
        self.assertEqual(seen, [])
        self.c.flush()
        self.assertEqual(len(seen), 1)
        self.assertTrue(seen[0] and seen[0] == self.c.lookup.lookupd_http_addresses())

    def test_an_attempt_cancelled_by_the_stop_is_not_an_error(self) -> None:
        """A node stopped while it is still connecting (a start that failed on its port stops at
        once) says nothing about that attempt; one that fails while running is an error line."""
        from twisted.internet.defer import Deferred
        from twisted.internet.error import DNSLookupError
        from twisted.logger import LogLevel, globalLogPublisher

        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)

        def pending(factory: Any) -> Deferred[Any]:
            # what HostnameEndpoint's cancellation mid-resolution answers
            return Deferred(lambda d: d.errback(DNSLookupError("'127.0.0.1'")))

        self.c.endpoint.connect = pending  # type: ignore[method-assign]
        self.c.lookup.startService()
        self.c.lookup.stopService()
        errors = [e for e in events if e.get("log_level") == LogLevel.error]
        self.assertEqual(errors, [])
        from twisted.internet.defer import fail

        self.c.endpoint.connect = lambda factory: fail(DNSLookupError("'nowhere'"))  # type: ignore[method-assign]
        self.c.lookup.startService()
        errors = [e for e in events if e.get("log_level") == LogLevel.error]
        self.assertEqual(len(errors), 1)
        self.assertIn("LOOKUPD(lookupd:4160): connect - DNS lookup failed", errors[0]["log_format"].format(**errors[0]))

    def test_identify_wire_format(self) -> None:
        """IDENTIFY is the magic, the line and a JSON body with Go's sorted keys."""
        c = self.c
        c.nsqd.options = dataclasses.replace(c.nsqd.options, broadcast_tcp_port=9000)
        peer_proto = LookupPeerProtocol(_FakePeer(c.lookup))  # type: ignore[arg-type]
        transport = StringTransport()
        peer_proto.makeConnection(transport)
        body = (b'{"broadcast_address":"127.0.0.1","hostname":"node1","http_port":4151,'
                b'"tcp_port":9000,"version":"1.3.0"}')
        self.assertEqual(transport.value(), b"  V1IDENTIFY\n" + struct.pack(">i", len(body)) + body)

    def test_register_and_unregister_as_things_change(self) -> None:
        """Creations and deletions of topics and channels (ephemeral too) reach lookupd."""
        c = self.c
        c.lookup.startService()
        c.flush()
        t = c.nsqd.get_topic("t")
        t.get_channel("c")
        t.get_channel("e#ephemeral")
        c.flush()
        self.assertEqual(c.registered(), {reg("topic", "t"), reg("channel", "t", "c"),
                                          reg("channel", "t", "e#ephemeral")})
        self.successResultOf(t.delete_channel("e#ephemeral"))
        c.flush()
        self.assertNotIn(reg("channel", "t", "e#ephemeral"), c.lookupd.db.registrations)
        self.successResultOf(t.delete_channel("c"))
        c.flush()
        self.assertEqual(c.registered(), {reg("topic", "t")})
        c.nsqd.delete_topic("t")
        c.flush()
        self.assertEqual(c.registered(), set())

    def test_ping_every_15s(self) -> None:
        """A PING every 15 s keeps the node's last_update fresh."""
        c = self.c
        c.lookup.startService()
        c.flush()
        [client] = c.lookupd.db.find_producers("client", "", "")
        first = client.peer.last_update
        c.clock.advance(PING_INTERVAL)
        c.flush()
        self.assertEqual(client.peer.last_update - first, round(PING_INTERVAL * 1e9))

    def test_reconnect_registers_everything_again(self) -> None:
        """When lookupd drops the connection, nsqd reconnects with backoff and re-registers."""
        c = self.c
        c.nsqd.get_topic("t").get_channel("c")
        c.lookup.startService()
        c.flush()
        c.endpoint.refuse = True
        c.endpoint.pumps[0].server.transport.loseConnection()
        c.flush()
        self.assertEqual(c.registered(), set())
        c.nsqd.get_topic("later")  # created while disconnected
        c.clock.pump([1.0] * 20)
        self.assertGreater(c.endpoint.attempts, 3)
        c.endpoint.refuse = False
        c.clock.pump([1.0] * 16)  # backoff is capped at the PING interval
        c.flush()
        self.assertEqual(c.registered(), {reg("topic", "t"), reg("channel", "t", "c"),
                                          reg("topic", "later")})

    def test_unanswered_ping_drops_connection(self) -> None:
        """A lookupd that stops answering is disconnected one interval after the silent PING."""
        c = self.c
        c.lookup.startService()
        c.flush()
        conn = c.lookup.peers["lookupd:4160"].connection
        assert conn is not None
        c.clock.advance(PING_INTERVAL)  # PING sent, never pumped: no answer
        self.assertEqual(len(conn.pending), 1)
        c.clock.advance(PING_INTERVAL)
        self.assertTrue(conn.transport.disconnecting)  # type: ignore[union-attr]

    def test_runtime_address_change(self) -> None:
        """PUT /config/nsqlookupd_tcp_addresses adds and removes peers at run time."""
        c = self.c
        c.nsqd.get_topic("t")
        c.lookup.startService()
        c.flush()
        c.nsqd.runtime_lookupd_tcp_addresses = ["bad-address", "other:4160"]
        c.nsqd.config_changed("nsqlookupd_tcp_addresses")
        c.flush()
        self.assertEqual(sorted(c.lookup.peers), ["other:4160"])
        # the removed peer's connection closed, so lookupd dropped it; the new one registered
        self.assertEqual(len(c.lookupd.db.find_producers("client", "", "")), 1)
        self.assertEqual(c.registered(), {reg("topic", "t")})
        c.nsqd.runtime_lookupd_tcp_addresses = None
        c.nsqd.config_changed("nsqlookupd_tcp_addresses")
        c.flush()
        self.assertEqual(c.lookup.peers, {})
        self.assertEqual(c.lookupd.db.find_producers("client", "", ""), [])

    def test_error_answers(self) -> None:
        """E_INVALID to IDENTIFY or a non-JSON answer closes; other errors are logged only."""
        for answer, closed in ((b"E_INVALID", True), (b"junk", True), (b"{}", False)):
            proto = LookupPeerProtocol(_FakePeer(self.c.lookup))  # type: ignore[arg-type]
            transport = StringTransport()
            proto.makeConnection(transport)
            proto.dataReceived(struct.pack(">i", len(answer)) + answer)
            self.assertEqual(transport.disconnecting, closed, answer)
            self.assertEqual(proto.ready, not closed)
        proto.send(b"REGISTER t\n", "REGISTER t")
        proto.dataReceived(struct.pack(">i", 9) + b"E_INVALID")
        self.assertFalse(transport.disconnecting)
        proto.dataReceived(struct.pack(">i", 1 << 30))  # past --max-body-size
        self.assertTrue(transport.disconnecting)

    def test_peer_info_text(self) -> None:
        """The peer info log text is nsqd's %+v of its peerInfo struct."""
        info = json.loads(b'{"broadcast_address":"h","hostname":"x","http_port":4161,'
                          b'"tcp_port":4160,"version":"1.3.0"}')
        self.assertEqual(peer_info_text(info),
                         "{TCPPort:4160 HTTPPort:4161 Version:1.3.0 BroadcastAddress:h}")


class _FakePeer:
    """What LookupPeerProtocol needs of a LookupPeer, without a ClientService."""

    address = "fake:4160"

    def __init__(self, lookup: Lookup) -> None:
        self.lookup = lookup
        self.connections: list[Any] = []

    def connected(self, connection: Any) -> None:
        self.connections.append(connection)

    def disconnected(self, connection: Any) -> None:
        pass
