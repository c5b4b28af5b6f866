"""Hostile V2 input: hypothesis fuzzing of the parser, the protocol and a live daemon.

The daemon must never crash, never buffer past its advertised limits (a
size prefix over the maximum is refused before the body is read), answer
with nsqd's error codes and leave other clients alone.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsqtw.errors import NSQError
from nsqtw.protocol.wire import MAX_LINE_LENGTH, Command, LineTooLong, V2Parser
from tests.daemon import Daemon
from tests.helpers import connect, make_nsqd, read_frames
from tests.rawclient import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, HEARTBEAT, OK, Client, Closed, pub
from tests.reliability.conftest import assert_no_traceback, ping, rss_kib

MAX_MSG = 100
MAX_BODY = 300

#: every error code nsqd v1.3 sends on the V2 protocol
NSQD_ERROR_CODES = {
    b"E_INVALID", b"E_BAD_PROTOCOL", b"E_BAD_TOPIC", b"E_BAD_CHANNEL", b"E_BAD_BODY",
    b"E_BAD_MESSAGE", b"E_PUB_FAILED", b"E_MPUB_FAILED", b"E_DPUB_FAILED", b"E_FIN_FAILED",
    b"E_REQ_FAILED", b"E_TOUCH_FAILED", b"E_AUTH_DISABLED", b"E_AUTH_FAILED", b"E_UNAUTHORIZED",
    b"E_IDENTIFY_FAILED", b"E_TOO_MANY_CHANNEL_CONSUMERS",
}
NONFATAL_CODES = {b"E_FIN_FAILED", b"E_REQ_FAILED", b"E_TOUCH_FAILED"}

# --- strategies -----------------------------------------------------------------------

_NAMES = [b"PUB", b"MPUB", b"DPUB", b"SUB", b"RDY", b"FIN", b"REQ", b"TOUCH", b"NOP", b"CLS",
          b"IDENTIFY", b"AUTH"]
_token = st.one_of(
    st.sampled_from([b"t", b"c", b"fuzz", b"..", b"a/b", b"x" * 65, b"t#ephemeral", b"-1", b"0",
                     b"1000", b"99999999999", b"0123456789abcdef", b""]),
    st.binary(max_size=12).filter(lambda b: b"\n" not in b),
)
#: size prefixes that lie: negative, zero, one over, huge, anything
_size = st.one_of(st.sampled_from([-(2**31), -1, 0, 1, MAX_MSG, MAX_MSG + 1, MAX_BODY, MAX_BODY + 1,
                                   2**31 - 1]),
                  st.integers(-(2**31), 2**31 - 1))


@st.composite
def _command(draw: st.DrawFn) -> bytes:
    name = draw(st.one_of(st.sampled_from(_NAMES), st.binary(min_size=1, max_size=8)
                          .filter(lambda b: b"\n" not in b)))
    args = draw(st.lists(_token, max_size=3))
    line = b" ".join([name, *args]) + draw(st.sampled_from([b"\n", b"\r\n"]))
    if not draw(st.booleans()):
        return line
    body = draw(st.binary(max_size=MAX_BODY + 20))
    if name == b"MPUB" and draw(st.booleans()):
        parts = draw(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=5))
        body = struct.pack(">i", draw(st.one_of(st.just(len(parts)), _size))) + b"".join(
            struct.pack(">i", draw(st.one_of(st.just(len(p)), _size))) + p for p in parts)
    size = draw(st.one_of(st.just(len(body)), _size))
    truncate = draw(st.integers(0, len(body)))
    return line + struct.pack(">i", size) + body[:truncate]


def _framed(line: bytes, body: bytes) -> bytes:
    return line + struct.pack(">i", len(body)) + body


_topic = st.sampled_from([b"t", b"fuzz", b"t#ephemeral"])
_body = st.binary(min_size=1, max_size=MAX_MSG)
_json_value = st.one_of(st.none(), st.booleans(), st.integers(-2, 70000), st.text(max_size=5))
#: well-formed commands with plausible arguments, so the fuzz gets past the parser
_valid_command = st.one_of(
    st.builds(lambda t, b: _framed(b"PUB " + t + b"\n", b), _topic, _body),
    st.builds(lambda t, ms, b: _framed(b"DPUB %s %d\n" % (t, ms), b), _topic, st.integers(0, 3000), _body),
    st.builds(lambda t, bs: _framed(b"MPUB " + t + b"\n", struct.pack(">i", len(bs)) + b"".join(
        struct.pack(">i", len(b)) + b for b in bs)), _topic, st.lists(_body.map(lambda b: b[:60]), min_size=1,
                                                                      max_size=3)),
    st.builds(lambda t, c: b"SUB %s %s\n" % (t, c), _topic, st.sampled_from([b"c", b"c#ephemeral"])),
    st.builds(lambda n: b"RDY %d\n" % n, st.integers(0, 3000)),
    st.builds(lambda c, i, n: b"%s %s %d\n" % (c, i, n), st.sampled_from([b"FIN", b"REQ", b"TOUCH"]),
              st.binary(min_size=16, max_size=16).map(lambda b: b.hex()[:16].encode()), st.integers(0, 5000)),
    st.sampled_from([b"NOP\n", b"CLS\n"]),
    # no "snappy"/"deflate": once agreed, the answers are compressed and _check_output could not
    # read them as frames (compressed sessions: tests/unit/test_compress.py, test_features_live.py)
    st.builds(lambda d: _framed(b"IDENTIFY\n", json.dumps(d).encode()[:MAX_BODY]),
              st.dictionaries(st.sampled_from(["heartbeat_interval", "msg_timeout", "output_buffer_size",
                                               "output_buffer_timeout", "sample_rate", "client_id",
                                               "feature_negotiation", "tls_v1"]),
                              _json_value, max_size=4)),
)

#: a stream: maybe the magic, then commands and garbage, pipelined
_garbage_stream = st.builds(
    lambda magic, parts: magic + b"".join(parts),
    st.sampled_from([b"  V2", b"  V2", b"  V1", b""]),
    st.lists(st.one_of(_valid_command, _command(), st.binary(max_size=64)), max_size=12),
)
#: a plausible session (subscribed or publishing) that turns hostile somewhere
_session_stream = st.builds(
    lambda sub, parts: b"  V2" + sub + b"".join(parts),
    st.sampled_from([b"", b"SUB t c\nRDY 5\n", b"SUB fuzz c#ephemeral\nRDY 1\n"]),
    st.lists(st.one_of(_valid_command, _valid_command, _valid_command, _command()), max_size=12),
)
_stream = st.one_of(_garbage_stream, _session_stream)


def _chunkings(data: bytes) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(1, max(1, len(data))), min_size=1, max_size=8)


# --- sans-IO: the parser -------------------------------------------------------------------


def _parse(data: bytes, chunks: list[int]) -> list[object]:
    """Feed ``data`` in pieces; record commands (each line of a run apart) and the final error,
    check the bound after each feed."""
    parser = V2Parser(MAX_MSG, MAX_BODY)
    out: list[object] = []
    pos = 0
    sizes = iter(chunks)
    while pos < len(data):
        step = next(sizes, len(data))
        parser.feed(data[pos:pos + step])
        pos += step
        try:
            while (cmd := parser.next_command()) is not None:
                # a run of FINs or REQs holds what had arrived: one command per line, compared
                if cmd.ids is not None:
                    out.extend(Command(cmd.name, cmd.args, ids=[i]) for i in cmd.ids)
                elif cmd.reqs is not None:
                    out.extend(Command(cmd.name, cmd.args, reqs=[r]) for r in cmd.reqs)
                else:
                    out.append(cmd)
        except NSQError as e:
            assert e.fatal
            out.append(str(e))
            return out
        except LineTooLong:
            out.append("line too long")
            return out
        # what stays buffered is never more than one line or one announced body
        assert parser.buffered() <= max(MAX_LINE_LENGTH, MAX_BODY), parser.buffered()
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_parser_fuzz_any_chunking(data: st.DataObject) -> None:
    """Random streams parse to the same commands/error in any chunking, with a bounded buffer."""
    stream = data.draw(_stream)
    whole = _parse(stream, [len(stream) or 1])
    assert _parse(stream, data.draw(_chunkings(stream))) == whole
    assert _parse(stream, [1] * len(stream)) == whole


@settings(max_examples=300, deadline=None)
@given(cmd=st.sampled_from([b"PUB t", b"DPUB t 10", b"MPUB t", b"IDENTIFY", b"AUTH"]), size=_size)
def test_parser_refuses_lying_size_before_the_body(cmd: bytes, size: int) -> None:
    """A size prefix outside the limits raises as soon as its 4 bytes are in; no body byte is needed."""
    limit = MAX_MSG if cmd.startswith((b"PUB", b"DPUB")) else MAX_BODY
    parser = V2Parser(MAX_MSG, MAX_BODY)
    parser.feed(b"  V2" + cmd + b"\n" + struct.pack(">i", size))
    if 0 < size <= limit:
        assert parser.next_command() is None
        return
    with pytest.raises(NSQError) as err:
        parser.next_command()
    assert err.value.fatal
    assert err.value.code in ("E_BAD_MESSAGE", "E_BAD_BODY")


# --- sans-IO: the protocol over an in-memory NSQD -----------------------------------------


def _check_output(raw: bytes) -> list[tuple[int, bytes]]:
    """Every frame is whole and well-formed; every error carries one of nsqd's codes."""
    frames = read_frames(raw)
    for ftype, payload in frames:
        assert ftype in (FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE), ftype
        if ftype == FRAME_ERROR:
            assert payload.split(b" ", 1)[0] in NSQD_ERROR_CODES, payload
    return frames


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_protocol_fuzz_in_memory(data: st.DataObject) -> None:
    """Random pipelined input never raises out of dataReceived; output is nsqd frames; a fatal error hangs up."""
    nsqd, clock = make_nsqd(max_msg_size=MAX_MSG, max_body_size=MAX_BODY)
    proto, transport = connect(nsqd, clock, magic=False)
    stream = data.draw(_stream)
    pos = 0
    for step in data.draw(_chunkings(stream)) + [len(stream)]:
        proto.dataReceived(stream[pos:pos + step])
        pos += step
        clock.advance(0.01)
    frames = _check_output(transport.value())
    fatal_errors = [i for i, (t, p) in enumerate(frames)
                    if t == FRAME_ERROR and p.split(b" ", 1)[0] not in NONFATAL_CODES]
    if fatal_errors:
        assert transport.disconnecting
        assert fatal_errors[0] == len(frames) - 1, "nothing is answered after a fatal error"
    # a well-behaved client on the same daemon is unaffected
    other, t2 = connect(nsqd, clock)
    other.dataReceived(b"PUB ok\n" + struct.pack(">i", 2) + b"hi")
    assert read_frames(t2.value()) == [OK]


# --- live: a real daemon -------------------------------------------------------------------


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Iterator[Daemon]:
    """One daemon with small limits, shared by the live hostile-input tests."""
    d = Daemon(str(tmp_path_factory.mktemp("hostile")), f"--max-msg-size={MAX_MSG}",
               f"--max-body-size={MAX_BODY}")
    d.start()
    yield d
    d.stop()


def _exchange(address: str, data: bytes, quiet: float = 0.3) -> tuple[list[tuple[int, bytes]], bool]:
    """Send ``data``; collect frames until the daemon hangs up (True) or is quiet for ``quiet``."""
    c = Client(address, magic=False, timeout=5)
    frames: list[tuple[int, bytes]] = []
    try:
        c.send(data)
    except OSError:
        pass  # hung up on us mid-send: read what it said
    try:
        while True:
            f = c.read_frame(quiet)
            if f != HEARTBEAT:
                frames.append(f)
    except Closed:
        return frames, True
    except TimeoutError:
        return frames, False
    finally:
        c.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(stream=_stream)
def test_live_fuzz(hostile, stream: bytes) -> None:
    """Random pipelined bytes on a real socket: nsqd frames only, hang-up after a fatal error."""
    # a trailing invalid command makes a parser that is between frames answer (and hang up) at once
    frames, closed = _exchange(hostile.tcp_address, stream + b"\nZZZ\n")
    for ftype, payload in frames:
        assert ftype in (FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE), ftype
        if ftype == FRAME_ERROR:
            assert payload.split(b" ", 1)[0] in NSQD_ERROR_CODES, payload
    fatal = [p for t, p in frames if t == FRAME_ERROR and p.split(b" ", 1)[0] not in NONFATAL_CODES]
    if fatal:
        assert closed


def test_live_hostile_run_leaves_daemon_healthy(hostile) -> None:
    """After the fuzzing, a flood of lying prefixes and stalled bodies: still serving, no traceback, RSS bounded.

    Runs after test_live_fuzz (same module daemon); its consumer was subscribed
    before the hostile traffic below and must keep receiving.
    """
    consumer = Client(hostile.tcp_address)
    consumer.sub("calm", "c", rdy=10)
    before = rss_kib(hostile)
    stalled = []
    for i in range(200):
        # lying prefixes: each is answered from the prefix alone, the body never sent
        size = [2**31 - 1, MAX_BODY + 1, -1, 0][i % 4]
        cmd = [b"PUB t\n", b"MPUB t\n", b"DPUB t 5\n", b"IDENTIFY\n"][i % 4]
        frames, closed = _exchange(hostile.tcp_address, b"  V2" + cmd + struct.pack(">i", size), quiet=3)
        assert closed and len(frames) == 1 and frames[0][0] == FRAME_ERROR, frames
        assert frames[0][1].split(b" ", 1)[0] in (b"E_BAD_MESSAGE", b"E_BAD_BODY"), frames
        if i % 10 == 0:
            # a body announced at the limit, then a stall: at most the limit is buffered
            s = Client(hostile.tcp_address)
            s.send(b"MPUB t\n" + struct.pack(">ii", MAX_BODY, 2) + b"\x00\x00\x00\x50" + b"x" * 10)
            stalled.append(s)
    pub(hostile.tcp_address, "calm", b"still here")
    assert consumer.message().body == b"still here"
    after = rss_kib(hostile)
    assert after - before < 64 * 1024, (before, after)
    for s in stalled:
        assert s.is_open(0)
        s.close()
    assert ping(hostile) == (200, b"OK")
    assert_no_traceback(hostile)


# --- size limits (moved here from the protocol suite) ----------------------------------


@pytest.mark.parametrize("sent, error", [
    (b"PUB big\n" + struct.pack(">i", MAX_MSG + 1),
     b"E_BAD_MESSAGE PUB message too big 101 > 100"),
    (b"DPUB big 10\n" + struct.pack(">i", MAX_MSG + 1),
     b"E_BAD_MESSAGE DPUB message too big 101 > 100"),
    (b"MPUB big\n" + struct.pack(">i", MAX_BODY + 1),
     b"E_BAD_BODY MPUB body too big 301 > 300"),
    (b"MPUB big\n" + struct.pack(">ii", 200, 2) + struct.pack(">i", MAX_MSG + 1),
     b"E_BAD_MESSAGE MPUB message too big 101 > 100"),
    (b"IDENTIFY\n" + struct.pack(">i", MAX_BODY + 1),
     b"E_BAD_BODY IDENTIFY body too big 301 > 300"),
    (b"PUB big\n" + struct.pack(">i", 2**31 - 1),
     b"E_BAD_MESSAGE PUB message too big 2147483647 > 100"),
], ids=["PUB", "DPUB", "MPUB-body", "MPUB-message", "IDENTIFY", "PUB-huge"])
def test_size_limits_answered_from_the_prefix(hostile, sent, error) -> None:
    """An oversized size prefix is refused with nsqd's error and a hang-up, before any body is sent."""
    c = Client(hostile.tcp_address)
    c.send(sent)
    assert c.wait_closed(3) == [(FRAME_ERROR, error)]


def test_size_limits_allow_the_maximum(hostile) -> None:
    """Bodies exactly at --max-msg-size and bodies within --max-body-size are accepted."""
    c = Client(hostile.tcp_address)
    c.pub("ok", b"x" * MAX_MSG)
    c.cmd("DPUB", "ok", 10, body=b"x" * MAX_MSG)
    assert c.response() == OK
    c.mpub("ok", [b"y" * MAX_MSG, b"z" * MAX_MSG])
    assert c.response() == OK
    c.cmd("IDENTIFY", body=b" " * 290 + b'{"a": 1}')
    assert c.response() == OK


def test_mpub_body_at_max_body_size(daemon_factory) -> None:
    """An MPUB whose body is exactly --max-body-size is accepted; one byte more is refused."""
    d = daemon_factory("--max-msg-size=200", "--max-body-size=300")
    c = Client(d.tcp_address)
    c.mpub("ok", [b"y" * 144, b"z" * 144])  # 4 + 2 * (4 + 144) = 300
    assert c.response() == OK
    c.mpub("ok", [b"y" * 144, b"z" * 145])
    assert c.wait_closed(3) == [(FRAME_ERROR, b"E_BAD_BODY MPUB body too big 301 > 300")]


def test_default_limits_refuse_huge_prefix_without_body() -> None:
    """With nsqd's defaults (1 MiB message, 5 MiB body) a 2 GiB prefix is refused at once; nothing is read."""
    parser = V2Parser(1024 * 1024, 5 * 1024 * 1024)
    parser.feed(b"  V2MPUB t\n" + struct.pack(">i", 2**31 - 1))
    with pytest.raises(NSQError, match="E_BAD_BODY MPUB body too big 2147483647 > 5242880"):
        parser.next_command()


# --- stalls and isolation (moved here from the protocol suite) --------------------------


def test_client_stalled_mid_frame_is_disconnected(hostile) -> None:
    """A client that sends half a command (line or body) and stalls is hung up on."""
    body_stall = Client(hostile.tcp_address)
    line_stall = Client(hostile.tcp_address)
    for c in (body_stall, line_stall):
        assert c.identify(heartbeat_interval=1000) == OK
    body_stall.send(b"PUB stall\n" + struct.pack(">i", 100) + b"only part of it")
    line_stall.send(b"PUB sta")
    t0 = time.monotonic()
    for c in (body_stall, line_stall):
        frames = c.wait_closed(5)
        assert set(frames) <= {HEARTBEAT}
    assert time.monotonic() - t0 < 3.5


def test_malformed_input_does_not_disturb_other_clients(hostile) -> None:
    """Garbage on one connection closes only that connection; others keep publishing and consuming."""
    consumer = Client(hostile.tcp_address)
    consumer.sub("iso", "ch", rdy=10)
    producer = Client(hostile.tcp_address)
    producer.pub("iso", b"before")
    assert consumer.message().body == b"before"
    bad_inputs = [
        b"  V9",
        b"  V2" + b"\xff" * 20 + b"\n",
        b"  V2PUB iso\n\xff\xff\xff\xff",
        b"  V2MPUB iso\n\x7f\xff\xff\xff",
        b"  V2" + b"A" * 70000,
        b"  V2IDENTIFY\n\x00\x00\x00\x05[1,2]",
        b"\x00" * 64,
    ]
    for data in bad_inputs:
        frames, closed = _exchange(hostile.tcp_address, data, quiet=3)
        assert closed, data[:20]
        assert all(t == FRAME_ERROR for t, _ in frames), (data[:20], frames)
    producer.pub("iso", b"after")
    assert consumer.message().body == b"after"
    assert ping(hostile) == (200, b"OK")
