"""IDENTIFY features and AUTH on the V2 protocol, in memory (StringTransport, task.Clock)."""

from __future__ import annotations

import json
import struct
import zlib

import snappy
from twisted.internet.defer import Deferred, fail, succeed
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nsqtw.core import flight
from nsqtw.core.message import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE
from nsqtw.interfaces import IAuthorizer
from nsqtw.observe.stats import format_text, snapshot
from nsqtw.protocol.auth import AuthError, Authorization, AuthState
from nsqtw.protocol.v2 import V2Factory
from nsqtw.protocol.wire import encode_command, encode_mpub
from tests.helpers import body, connect, make_nsqd, read_frames, take_frames

OK = (FRAME_TYPE_RESPONSE, b"OK")


def identify(proto, **settings) -> None:
    proto.dataReceived(b"IDENTIFY\n" + body(json.dumps(settings).encode()))


def settle(clock, turns: int = 5) -> None:
    for _ in range(turns):
        clock.advance(0)


def split_identify(data: bytes) -> tuple[dict, bytes]:
    """The clear IDENTIFY answer, and the bytes after it (in the negotiated encoding)."""
    (size,) = struct.unpack_from(">i", data)
    frames = read_frames(data[:4 + size])
    assert frames[0][0] == FRAME_TYPE_RESPONSE
    return json.loads(frames[0][1]), data[4 + size:]


class CompressionTests(SynchronousTestCase):
    def test_snappy_both_ways(self) -> None:
        """After IDENTIFY snappy=true: OK, commands and messages all travel as a snappy framed stream."""
        nsqd, clock = make_nsqd()
        proto, transport = connect(nsqd, clock)
        identify(proto, feature_negotiation=True, snappy=True)
        answer, rest = split_identify(transport.value())
        transport.clear()
        self.assertTrue(answer["snappy"])
        self.assertFalse(answer["deflate"])
        reader = snappy.StreamDecompressor()
        self.assertEqual(read_frames(reader.decompress(rest)), [OK])
        out = snappy.StreamCompressor()
        proto.dataReceived(out.compress(b"SUB t c\nRDY 5\n" + encode_command(b"PUB", b"t", body=b"hi")))
        settle(clock)
        frames = read_frames(reader.decompress(transport.value()))
        self.assertEqual(frames[:2], [OK, OK])
        self.assertEqual(frames[2][0], FRAME_TYPE_MESSAGE)
        self.assertTrue(frames[2][1].endswith(b"hi"))
        self.assertTrue(proto.stats()["snappy"])

    def test_deflate_level_bounded_by_max(self) -> None:
        """deflate_level is the client's, capped by --max-deflate-level; 6 when it asks for none."""
        for asked, max_level, expected in ((9, 4, 4), (0, 9, 6), (2, 6, 2)):
            nsqd, clock = make_nsqd(max_deflate_level=max_level)
            proto, transport = connect(nsqd, clock)
            identify(proto, feature_negotiation=True, deflate=True, deflate_level=asked)
            answer, rest = split_identify(transport.value())
            self.assertEqual((answer["deflate"], answer["deflate_level"]), (True, expected))
            reader = zlib.decompressobj(-zlib.MAX_WBITS)
            self.assertEqual(read_frames(reader.decompress(rest)), [OK])

    def test_deflate_commands(self) -> None:
        """A client's deflated PUB (split anywhere) is parsed and answered in deflate."""
        nsqd, clock = make_nsqd()
        proto, transport = connect(nsqd, clock)
        identify(proto, feature_negotiation=True, deflate=True)
        _, rest = split_identify(transport.value())
        transport.clear()
        reader = zlib.decompressobj(-zlib.MAX_WBITS)
        self.assertEqual(read_frames(reader.decompress(rest)), [OK])
        c = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
        wire = c.compress(encode_mpub(b"t", [b"a", b"b"])) + c.flush(zlib.Z_SYNC_FLUSH)
        for i in range(len(wire)):
            proto.dataReceived(wire[i:i + 1])
        self.assertEqual(read_frames(reader.decompress(transport.value())), [OK])
        self.assertEqual(nsqd.topics["t"].message_count, 2)

    def test_commands_sent_right_after_identify(self) -> None:
        """Compressed bytes that arrive in the same read as IDENTIFY go to the decompressor."""
        nsqd, clock = make_nsqd()
        proto, transport = connect(nsqd, clock)
        c = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
        after = c.compress(encode_command(b"PUB", b"early", body=b"x")) + c.flush(zlib.Z_SYNC_FLUSH)
        proto.dataReceived(b"IDENTIFY\n" + body(b'{"feature_negotiation":true,"deflate":true}') + after)
        _, rest = split_identify(transport.value())
        reader = zlib.decompressobj(-zlib.MAX_WBITS)
        self.assertEqual(read_frames(reader.decompress(rest)), [OK, OK])
        self.assertEqual(nsqd.topics["early"].message_count, 1)

    def test_corrupt_compressed_input_closes(self) -> None:
        """Bytes that are not snappy end the connection (nsqd's read fails)."""
        nsqd, clock = make_nsqd()
        proto, transport = connect(nsqd, clock)
        identify(proto, feature_negotiation=True, snappy=True)
        proto.dataReceived(b"PUB t\n not snappy at all")
        self.assertTrue(transport.disconnecting)

    def test_features_switched_off(self) -> None:
        """--snappy=false/--deflate=false and no TLS certificate answer false and change nothing."""
        nsqd, clock = make_nsqd(snappy=False, deflate=False)
        proto, transport = connect(nsqd, clock)
        identify(proto, feature_negotiation=True, snappy=True, tls_v1=True)
        answer, rest = split_identify(transport.value())
        self.assertEqual((answer["snappy"], answer["deflate"], answer["tls_v1"]), (False, False, False))
        self.assertEqual(rest, b"")
        transport.clear()
        proto.dataReceived(b"NOP\nPUB t\n" + body(b"plain"))
        self.assertEqual(take_frames(transport), [OK])


class TLSRequiredTests(SynchronousTestCase):
    def test_commands_before_tls_are_refused(self) -> None:
        """With --tls-required every command but IDENTIFY is E_INVALID ... (TLS required), before its body."""
        for command in (b"PUB t\n", b"SUB t c\n", b"AUTH\n", b"NOP\n", b"FOO\n",
                        b"FIN 0123456789abcdef\nFIN 0123456789abcdef\n", b"REQ 0123456789abcdef 0\n"):
            nsqd, clock = make_nsqd(tls_required=1)
            proto, transport = connect(nsqd, clock)
            proto.dataReceived(command)
            name = command.split()[0].decode()
            self.assertEqual(take_frames(transport), [
                (FRAME_TYPE_ERROR, f"E_INVALID cannot {name} in current state (TLS required)".encode())])
            self.assertTrue(transport.disconnecting)
        nsqd, clock = make_nsqd(tls_required=2)
        proto, transport = connect(nsqd, clock)
        identify(proto, client_id="x")
        self.assertEqual(take_frames(transport), [OK])


class TLSHandshakeTests(SynchronousTestCase):
    """After a tls_v1 IDENTIFY: TLS begins on the client's first TLS byte, within nsqd's deadline."""

    def _connect(self):
        from twisted.internet.testing import StringTransport

        class TLSTransport(StringTransport):
            started: object = None
            aborting = False

            def __init__(self) -> None:
                super().__init__()
                self.fed: list[bytes] = []
                # what the TLS layer would receive once started
                self.protocol = type("TLSLayer", (), {"dataReceived": lambda _, data: self.fed.append(data)})()

            def startTLS(self, ctx: object, normal: bool = True) -> None:
                self.started = ctx

            def abortConnection(self) -> None:
                self.aborting = True

        nsqd, clock = make_nsqd()
        nsqd.tls = object()  # a stand-in context: only its hand-over is checked
        proto = V2Factory(nsqd, clock).buildProtocol(None)
        transport = TLSTransport()
        proto.makeConnection(transport)
        proto.dataReceived(b"  V2")
        identify(proto, feature_negotiation=True, tls_v1=True)
        answer, rest = split_identify(transport.value())
        self.assertTrue(answer["tls_v1"])
        self.assertEqual(rest, b"")
        transport.clear()
        return proto, transport, clock

    def test_handshake_must_finish_in_time(self) -> None:
        """Once a ClientHello starts TLS the handshake has TLS_HANDSHAKE_TIMEOUT seconds; then abort."""
        from nsqtw.protocol.handshake import TLS_HANDSHAKE_TIMEOUT

        for finished in (False, True):
            proto, transport, clock = self._connect()
            self.assertIsNone(transport.started)  # not before the client's first byte
            proto.dataReceived(b"\x16\x03\x01")
            self.assertIsNotNone(transport.started)
            self.assertEqual(transport.fed, [b"\x16\x03\x01"])  # the bytes go on to TLS
            # nsqd's OK, written into TLS
            self.assertEqual(read_frames(transport.value()), [(FRAME_TYPE_RESPONSE, b"OK")])
            if finished:
                proto._handshake_call.cancel()  # what handshakeCompleted() does first
                proto._handshake_call = None
            clock.advance(TLS_HANDSHAKE_TIMEOUT + 0.01)
            self.assertEqual(transport.aborting, not finished)

    def test_silence_gets_nsqds_timeout_error_in_plain_text(self) -> None:
        """No byte within the deadline: E_IDENTIFY_FAILED ... i/o timeout, as Go nsqd's read deadline says."""
        from nsqtw.protocol.handshake import TLS_HANDSHAKE_TIMEOUT

        proto, transport, clock = self._connect()
        clock.advance(TLS_HANDSHAKE_TIMEOUT + 0.01)
        self.assertIsNone(transport.started)
        [(kind, error)] = read_frames(transport.value())
        self.assertEqual(kind, FRAME_TYPE_ERROR)
        self.assertRegex(error, rb"^E_IDENTIFY_FAILED IDENTIFY failed read tcp \S+->\S+: i/o timeout$")
        self.assertTrue(transport.disconnecting)

    def test_plain_text_after_tls_v1_is_refused_in_plain_text(self) -> None:
        """A client that goes on without TLS gets Go's E_IDENTIFY_FAILED wording, and the close."""
        proto, transport, clock = self._connect()
        proto.dataReceived(b"NOP\n")
        self.assertIsNone(transport.started)
        self.assertEqual(read_frames(transport.value()),
                         [(FRAME_TYPE_ERROR, b"E_IDENTIFY_FAILED IDENTIFY failed tls: first record does not "
                                            b"look like a TLS handshake")])
        self.assertTrue(transport.disconnecting)


@implementer(IAuthorizer)
class FakeAuthorizer:
    """Answers AUTH from a list of prepared results (AuthState or exception); records the queries."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)
        self.queries: list[tuple] = []
        self.pending: Deferred | None = None

    def query(self, remote_ip, tls, secret, common_name):
        self.queries.append((remote_ip, tls, secret, common_name))
        answer = self.answers.pop(0)
        if answer == "wait":
            self.pending = Deferred()
            return self.pending
        if isinstance(answer, Exception):
            return fail(answer)
        return succeed(answer)


def state(ttl: int = 60, now: float = 0.0, *authorizations, identity: str = "alice") -> AuthState:
    auths = list(authorizations) or [Authorization(".*", [".*"], ["publish", "subscribe"])]
    return AuthState(ttl, identity, "https://id.example/alice?a=1&b=2", auths, now + ttl)


class AuthTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.nsqd, self.clock = make_nsqd()

    def connect(self, *answers):
        self.nsqd.auth = authd = FakeAuthorizer(*answers)
        proto, transport = connect(self.nsqd, self.clock)
        return proto, transport, authd

    def test_fake_provides_interface(self) -> None:
        """The test authorizer provides IAuthorizer, as the HTTP one does."""
        self.assertTrue(verifyObject(IAuthorizer, FakeAuthorizer()))

    def test_identify_says_auth_required(self) -> None:
        """IDENTIFY answers auth_required true when an auth server is configured."""
        proto, transport, _ = self.connect()
        identify(proto, feature_negotiation=True)
        answer, _ = split_identify(transport.value())
        self.assertTrue(answer["auth_required"])

    def test_commands_need_auth_first(self) -> None:
        """PUB, MPUB (before its body), DPUB and SUB without AUTH are E_AUTH_FIRST."""
        for command, name in ((encode_command(b"PUB", b"t", body=b"x"), "PUB"), (b"MPUB t\n", "MPUB"),
                              (encode_command(b"DPUB", b"t", b"10", body=b"x"), "DPUB"),
                              (b"SUB t c\n", "SUB")):
            proto, transport, _ = self.connect()
            proto.dataReceived(command)
            self.assertEqual(take_frames(transport),
                             [(FRAME_TYPE_ERROR, f"E_AUTH_FIRST AUTH required before {name}".encode())])
            self.assertTrue(transport.disconnecting)

    def test_auth_answer_and_publish(self) -> None:
        """AUTH answers nsqd's JSON (Go's escaping), then publishing works; the query carries IP and secret."""
        proto, transport, authd = self.connect(state(now=self.clock.seconds()))
        proto.dataReceived(b"AUTH\n" + body(b"s3cret") + encode_command(b"PUB", b"t", body=b"x"))
        frames = take_frames(transport)
        self.assertEqual(frames[0], (FRAME_TYPE_RESPONSE,
                                     b'{"identity":"alice","identity_url":"https://id.example/alice?a=1\\u0026b=2",'
                                     b'"permission_count":1}'))
        self.assertEqual(frames[1], OK)
        self.assertEqual(authd.queries, [("192.168.1.1", False, "s3cret", "")])
        stats = proto.stats()
        self.assertEqual((stats["authed"], stats["auth_identity"]), (True, "alice"))

    def test_commands_wait_for_the_auth_server(self) -> None:
        """Commands pipelined behind AUTH run only once the auth server has answered."""
        proto, transport, authd = self.connect("wait")
        proto.dataReceived(b"AUTH\n" + body(b"s") + encode_command(b"PUB", b"t", body=b"x"))
        self.assertEqual(transport.value(), b"")
        self.assertEqual(transport.producerState, "paused")
        authd.pending.callback(state(now=self.clock.seconds()))
        frames = take_frames(transport)
        self.assertEqual([f[0] for f in frames], [FRAME_TYPE_RESPONSE, FRAME_TYPE_RESPONSE])
        self.assertEqual(frames[1], OK)
        self.assertEqual(transport.producerState, "producing")

    def test_auth_failures(self) -> None:
        """Server down: E_AUTH_FAILED; no authorizations: E_UNAUTHORIZED; AUTH twice: E_INVALID."""
        proto, transport, _ = self.connect(AuthError("connection refused"))
        proto.dataReceived(b"AUTH\n" + body(b"s"))
        self.assertEqual(take_frames(transport), [(FRAME_TYPE_ERROR, b"E_AUTH_FAILED AUTH failed")])
        self.assertTrue(transport.disconnecting)

        empty = AuthState(60, "bob", "", [], self.clock.seconds() + 60)
        proto, transport, _ = self.connect(empty)
        proto.dataReceived(b"AUTH\n" + body(b"s"))
        self.assertEqual(take_frames(transport),
                         [(FRAME_TYPE_ERROR, b"E_UNAUTHORIZED AUTH no authorizations found")])

        proto, transport, _ = self.connect(state(now=self.clock.seconds()))
        proto.dataReceived(b"AUTH\n" + body(b"s") + b"AUTH\n" + body(b"s"))
        self.assertEqual(take_frames(transport)[1], (FRAME_TYPE_ERROR, b"E_INVALID AUTH already set"))

    def test_permissions(self) -> None:
        """Topic/channel regexes and permissions decide; a refusal is E_UNAUTHORIZED naming the command."""
        now = self.clock.seconds()
        subscribe_only = state(60, now, Authorization("^logs", ["^archive$"], ["subscribe"]))
        proto, transport, _ = self.connect(subscribe_only)
        proto.dataReceived(b"AUTH\n" + body(b"s") + b"SUB logs_web archive\n")
        self.assertEqual(take_frames(transport)[1:], [OK])

        proto, transport, _ = self.connect(subscribe_only)
        proto.dataReceived(b"AUTH\n" + body(b"s") + b"SUB logs_web other\n")
        self.assertEqual(take_frames(transport)[1:], [
            (FRAME_TYPE_ERROR, b'E_UNAUTHORIZED AUTH failed for SUB on "logs_web" "other"')])

        proto, transport, _ = self.connect(subscribe_only)
        proto.dataReceived(b"AUTH\n" + body(b"s") + b"MPUB logs_web\n")
        self.assertEqual(take_frames(transport)[1:], [
            (FRAME_TYPE_ERROR, b'E_UNAUTHORIZED AUTH failed for MPUB on "logs_web" ""')])

    def test_expired_authorization_is_renewed(self) -> None:
        """After the TTL the next PUB asks the auth server again, waits, and goes on with the new answer."""
        now = self.clock.seconds()
        proto, transport, authd = self.connect(state(10, now), "wait")
        proto.dataReceived(b"AUTH\n" + body(b"s"))
        take_frames(transport)
        self.clock.advance(11)
        proto.dataReceived(encode_command(b"PUB", b"t", body=b"x"))
        self.assertEqual(transport.value(), b"")
        self.assertEqual(len(authd.queries), 2)
        authd.pending.callback(state(10, self.clock.seconds(), identity="alice2"))
        self.assertEqual(take_frames(transport), [OK])
        self.assertEqual(proto.stats()["auth_identity"], "alice2")

    def test_failed_renewal(self) -> None:
        """If the auth server fails when the authorization is renewed, the command gets E_AUTH_FAILED."""
        now = self.clock.seconds()
        proto, transport, _ = self.connect(state(10, now), AuthError("down"))
        proto.dataReceived(b"AUTH\n" + body(b"s"))
        take_frames(transport)
        self.clock.advance(11)
        proto.dataReceived(b"SUB t c\n")
        self.assertEqual(take_frames(transport), [(FRAME_TYPE_ERROR, b"E_AUTH_FAILED AUTH failed")])
        self.assertTrue(transport.disconnecting)


class SampleRateTests(SynchronousTestCase):
    def test_sampled_out_messages_are_dropped(self) -> None:
        """A client with sample_rate gets messages whose draw is at most the rate; the rest are gone."""
        draws = iter([10, 30, 31, 99, 0, 50] * 10)
        self.patch(flight.random, "randrange", lambda n: next(draws))
        nsqd, clock = make_nsqd()
        proto, transport = connect(nsqd, clock)
        identify(proto, sample_rate=30)
        proto.dataReceived(b"SUB t c\nRDY 10\n")
        pub, _ = connect(nsqd, clock)
        pub.dataReceived(encode_mpub(b"t", [b"%d" % i for i in range(6)]))
        settle(clock)
        frames = [f for f in take_frames(transport) if f[0] == FRAME_TYPE_MESSAGE]
        self.assertEqual([f[1][26:] for f in frames], [b"0", b"1", b"4"])
        channel = nsqd.topics["t"].channels["c"]
        self.assertEqual((channel.depth(), len(channel.in_flight)), (0, 3))


class E2ELatencyTests(SynchronousTestCase):
    def test_stats_report_latency_of_finished_messages(self) -> None:
        """FINed messages give the channel and topic percentiles in /stats (JSON and text)."""
        nsqd, clock = make_nsqd(e2e_processing_latency_percentile=(1.0, 0.5))
        sub, st = connect(nsqd, clock)
        sub.dataReceived(b"SUB t c\nRDY 10\n")
        pub, _ = connect(nsqd, clock)
        pub.dataReceived(encode_mpub(b"t", [b"a", b"b"]))
        settle(clock)
        ids = [f[1][10:26] for f in take_frames(st) if f[0] == FRAME_TYPE_MESSAGE]
        clock.advance(0.002)
        sub.dataReceived(b"FIN " + ids[0] + b"\n")
        clock.advance(0.002)
        sub.dataReceived(b"FIN " + ids[1] + b"\n")
        snap = snapshot(nsqd)
        topic = snap["topics"][0]
        channel = topic["channels"][0]
        for e2e in (topic["e2e_processing_latency"], channel["e2e_processing_latency"]):
            self.assertEqual(e2e["count"], 2)
            self.assertEqual([p["quantile"] for p in e2e["percentiles"]], [1.0, 0.5])
            # float seconds since 1970 carry the clock to within a microsecond
            self.assertLess(abs(e2e["percentiles"][0]["value"] - 4_000_000), 1000)
            # nsqd's (perks') rank rule picks the upper sample of two for the median
            self.assertLess(abs(e2e["percentiles"][1]["value"] - 4_000_000), 1000)
        text = format_text(snap, clock.seconds())
        self.assertEqual(text.count("e2e%: 4.0ms, 4.0ms"), 2)
