"""The V2 parser: every command shape, fed in every chunking, and its size checks."""

from __future__ import annotations

import random
import struct

from twisted.trial.unittest import SynchronousTestCase

from nsqtw.errors import NSQError
from nsqtw.protocol import wire
from nsqtw.protocol.wire import MAX_LINE_LENGTH, Command, LineTooLong, V2Parser, encode_command, encode_mpub

MAX_MSG = 1024
MAX_BODY = 4096


def parse_all(data: bytes, chunk: int, **kw: object) -> list[Command]:
    parser = V2Parser(MAX_MSG, MAX_BODY, **kw)  # type: ignore[arg-type]
    out = []
    for i in range(0, len(data), chunk):
        parser.feed(data[i:i + chunk])
        while (cmd := parser.next_command()) is not None:
            out.append(cmd)
    return out


STREAM = (b"  V2"
          + encode_command(b"IDENTIFY", body=b'{"client_id":"x"}')
          + b"SUB t c\r\n"
          + b"RDY 10\n"
          + encode_command(b"PUB", b"t", body=b"hello")
          + encode_command(b"DPUB", b"t", b"1000", body=b"later")
          + encode_mpub(b"t", [b"a", b"bb", b"ccc"])
          + b"FIN 0123456789abcdef\n"
          + b"NOP\n"
          + encode_command(b"AUTH", body=b"secret"))

EXPECTED = [
    Command(b"IDENTIFY", [], body=b'{"client_id":"x"}'),
    Command(b"SUB", [b"t", b"c"]),
    Command(b"RDY", [b"10"]),
    Command(b"PUB", [b"t"], body=b"hello"),
    Command(b"DPUB", [b"t", b"1000"], body=b"later"),
    Command(b"MPUB", [b"t"], messages=[b"a", b"bb", b"ccc"]),
    Command(b"FIN", [b"0123456789abcdef"]),
    Command(b"NOP", []),
    Command(b"AUTH", [], body=b"secret"),
]


class ChunkingTests(SynchronousTestCase):
    def test_every_chunk_size(self) -> None:
        """The same stream parses to the same commands whether it arrives whole or byte by byte."""
        for chunk in list(range(1, 17)) + [64, len(STREAM)]:
            self.assertEqual(parse_all(STREAM, chunk), EXPECTED, f"chunk={chunk}")

    def test_header_check_sees_line_before_size(self) -> None:
        """The header check runs once the line is in, before the size bytes arrive."""
        seen = []
        parser = V2Parser(MAX_MSG, MAX_BODY, check_header=lambda n, a: seen.append((n, a)))
        parser.feed(b"  V2PUB topic\n")
        self.assertIsNone(parser.next_command())
        self.assertEqual(seen, [(b"PUB", [b"topic"])])

    def test_in_command_tracks_partial_frames(self) -> None:
        """in_command() is true while a frame is half-received (used for read deadlines)."""
        parser = V2Parser(MAX_MSG, MAX_BODY, expect_magic=False)
        self.assertFalse(parser.in_command())
        parser.feed(b"PUB t\n\x00\x00")
        self.assertIsNone(parser.next_command())
        self.assertTrue(parser.in_command())


def outcome(data: bytes, chunk: int) -> list[object]:
    """The commands ``data`` parses to, fed ``chunk`` bytes at a time, then the error that ended it."""
    parser = V2Parser(MAX_MSG, MAX_BODY)
    out: list[object] = []
    for i in range(0, len(data), chunk):
        parser.feed(data[i:i + chunk])
        try:
            while (cmd := parser.next_command()) is not None:
                out.append(cmd)
        except NSQError as e:
            return [*out, str(e)]
    return [*out, ("left", parser.buffered(), parser.in_command())]


def _mpub(declared: int, count: int, sizes: list[int], extra: bytes = b"") -> bytes:
    return (b"MPUB t\n" + struct.pack(">ii", declared, count)
            + b"".join(struct.pack(">i", n) + b"m" * max(n, 0) for n in sizes) + extra)


class WholePublishTests(SynchronousTestCase):
    """A PUB or MPUB that arrives whole is taken in one go; the outcome is the generic path's."""

    CASES = [
        encode_command(b"PUB", b"t", body=b"x"),
        encode_command(b"PUB", b"t", body=b"x" * MAX_MSG),
        b"PUB t\n" + struct.pack(">i", MAX_MSG + 1) + b"x" * (MAX_MSG + 1),
        b"PUB t\n" + struct.pack(">i", 0),
        b"PUB t\n" + struct.pack(">i", -1) + b"xx",
        b"PUB t\n" + struct.pack(">i", 5) + b"abc",  # not all there yet
        encode_mpub(b"t", [b"a"]),
        encode_mpub(b"t", [b"a", b"bb", b"ccc"]),
        encode_mpub(b"t", [b"x" * MAX_MSG] * 3),
        _mpub(100, 1, [3], b"NOP\n"),  # declared more than the message takes: the rest is commands
        _mpub(8, 2, [3, 3]),  # messages past the declared size: followed, as nsqd does
        _mpub(3, 1, [3]),  # declared smaller than the count itself
        _mpub(16, 0, [3]),
        _mpub(16, -1, [3]),
        _mpub(16, MAX_BODY, [3]),
        _mpub(16, 2, [3, 0]),
        _mpub(16, 1, [MAX_MSG + 1]),
        _mpub(MAX_BODY, 4, [MAX_MSG] * 4),  # past --max-body-size by the messages themselves
        _mpub(MAX_BODY + 1, 1, [1]),
        _mpub(0, 1, [1]),
        _mpub(40, 2, [3]),  # the second message not there yet
    ]

    def test_same_outcome_whole_and_byte_by_byte(self) -> None:
        for case in self.CASES:
            for then in (b"", b"NOP\n", encode_command(b"PUB", b"t", body=b"next")):
                data = b"  V2" + case + then
                whole = outcome(data, len(data))
                self.assertEqual(whole, outcome(data, 1), case)
                self.assertEqual(whole, outcome(data, 7), case)

    def test_a_whole_publish_is_taken_without_the_state_machine(self) -> None:
        """A valid, complete PUB or MPUB leaves the parser at a line boundary after one call."""
        for data, want in [(encode_command(b"PUB", b"t", body=b"hi"), Command(b"PUB", [b"t"], body=b"hi")),
                           (encode_mpub(b"t", [b"a", b"b"]), Command(b"MPUB", [b"t"], messages=[b"a", b"b"]))]:
            parser = V2Parser(MAX_MSG, MAX_BODY, expect_magic=False)
            parser.feed(data)
            taken: list[list[bytes] | None] = []
            real = parser._take_whole_publish
            parser._take_whole_publish = lambda name, real=real, taken=taken: taken.append(  # type: ignore[method-assign]
                real(name)) or taken[-1]
            self.assertEqual(parser.next_command(), want)
            self.assertEqual(len(taken), 1)
            self.assertIsNotNone(taken[0])
            self.assertFalse(parser.in_command())

    def test_compiled_and_pure_mpub_splits_agree(self) -> None:
        """_split_mpub as used (compiled where built) takes the same messages as the pure one
        and stops at the same place: a size of 0 or below, one past --max-msg-size, one that
        would pass --max-body-size, a body or size not fully arrived, the count reached."""
        rng = random.Random(11)

        def message_of(size: int) -> bytes:
            # a huge size comes without its body (it has not arrived)
            return struct.pack(">i", size) + bytes(rng.getrandbits(8) for _ in range(max(size, 0) % 1000))

        implementations = {wire.PURE_SPLIT_MPUB, wire._split_mpub}
        for _ in range(1000):
            data = b"".join(message_of(rng.choice([1, 7, 50, 100, 101, 0, -2, 2**31 - 1]))
                            for _ in range(rng.randrange(5)))
            data = data[:rng.randrange(len(data) + 1)] if rng.random() < 0.3 else data
            left, total = rng.randrange(6), rng.choice([4, 100])
            got = {}
            for impl in implementations:
                out: list[bytes] = []
                got[impl] = (impl(data, left, total, 100, 400, out), out)
            self.assertEqual(len({(r, tuple(o)) for r, o in got.values()}), 1, (data, left, total, got))
        out = []
        self.assertEqual(wire._split_mpub(message_of(3) + message_of(2) + b"\x00\x00", 5, 4, 100, 400, out),
                         (13, 3, 17))
        self.assertEqual([len(m) for m in out], [3, 2])
        self.assertIs(wire._split_mpub, wire.PURE_SPLIT_MPUB)  # its compiled twin (hand-written C) is gone


def fast_outcome(data: bytes, chunk: int, known: dict[bytes, str]) -> tuple[list[object], int]:
    """:func:`outcome`, with :meth:`V2Parser.take_publish` asked first at every step, as
    the protocol asks it; its results as the Commands the generic path gives. Also how
    many commands it took."""
    parser = V2Parser(MAX_MSG, MAX_BODY)
    out: list[object] = []
    taken = 0
    for i in range(0, len(data), chunk):
        parser.feed(data[i:i + chunk])
        try:
            while True:
                found = parser.take_publish(known)
                if found is not None:
                    name, topic, bodies = found
                    arg = next(raw for raw, t in known.items() if t == topic)
                    out.append(Command(name, [arg], body=bodies[0]) if name == b"PUB"
                               else Command(name, [arg], messages=bodies))
                    taken += 1
                    continue
                cmd = parser.next_command()
                if cmd is None:
                    break
                out.append(cmd)
        except NSQError as e:
            return [*out, str(e)], taken
    return [*out, ("left", parser.buffered(), parser.in_command())], taken


class TakePublishTests(SynchronousTestCase):
    """A publisher's PUB or MPUB of a topic it already named, taken in one step: the outcome is
    the generic path's."""

    KNOWN = {b"t": "t", b"x" * 64: "x" * 64}
    ODD = [
        b"PUB t \n" + struct.pack(">i", 1) + b"a",  # an empty second argument
        b"PUB t extra\n" + struct.pack(">i", 1) + b"a",  # more arguments than nsqd reads
        b"PUB t\r\n" + struct.pack(">i", 1) + b"a",
        b"PUB  t\n" + struct.pack(">i", 1) + b"a",
        b"PUB u\n" + struct.pack(">i", 1) + b"a",  # a valid name this connection never checked
        b"PUB \n" + struct.pack(">i", 1) + b"a",
        b"MPUB\tt\n" + struct.pack(">i", 1) + b"a",
        b"PUB\n",
        encode_command(b"PUB", b"x" * 64, body=b"long name"),
        encode_command(b"PUB", b"x" * 65, body=b"too long"),
        encode_mpub(b"x" * 64, [b"a", b"b"]),
        encode_command(b"DPUB", b"t", b"10", body=b"later"),
        b"PUB t\n\x00\x00",  # its size not all there yet
        b"MPUB t\n" + struct.pack(">ii", 9, 1),
    ]

    def test_same_outcome_as_the_generic_path(self) -> None:
        """Whole, byte by byte and in 7-byte pieces: the same commands and the same error as
        next_command() alone, and the fast path took every valid whole one."""
        for case in WholePublishTests.CASES + self.ODD:
            for then in (b"", b"NOP\n", encode_command(b"PUB", b"t", body=b"next"),
                         encode_mpub(b"t", [b"m1", b"m2"])):
                data = b"  V2" + case + then
                want = outcome(data, len(data))
                for chunk in (len(data), 1, 7):
                    got, _ = fast_outcome(data, chunk, self.KNOWN)
                    self.assertEqual(got, want, (case, then, chunk))

    def test_whole_publishes_are_taken_in_one_step(self) -> None:
        """Back-to-back PUBs and MPUBs of known topics arriving whole are all taken by it; the
        input ends empty and at a line boundary."""
        data = (b"  V2" + encode_command(b"PUB", b"t", body=b"a") + encode_mpub(b"t", [b"b", b"c"])
                + encode_command(b"PUB", b"x" * 64, body=b"d"))
        got, taken = fast_outcome(data, len(data), self.KNOWN)
        self.assertEqual(taken, 2)  # next_command() reads the magic, and the PUB right after it
        self.assertEqual(got, outcome(data, len(data)))
        self.assertEqual(got[-1], ("left", 0, False))
        parser = V2Parser(MAX_MSG, MAX_BODY, expect_magic=False)
        parser.feed(b"PUB u\n" + struct.pack(">i", 1) + b"a")
        self.assertIsNone(parser.take_publish(self.KNOWN))  # unknown topic: left untouched
        self.assertEqual(parser.buffered(), 11)
        self.assertEqual(parser.next_command(), Command(b"PUB", [b"u"], body=b"a"))

    def test_compiled_and_pure_agree(self) -> None:
        """take_publish as used (compiled where built) and the pure one: the same answer for
        random streams of valid, invalid and cut-off publishes at random positions."""
        rng = random.Random(17)
        pieces = [encode_command(b"PUB", b"t", body=b"hi"), encode_mpub(b"t", [b"a", b"bb"]),
                  encode_mpub(b"x" * 64, [b"z" * 300]), b"PUB t\n" + struct.pack(">i", MAX_MSG + 1),
                  b"PUB t\n" + struct.pack(">i", 0), b"MPUB t\n" + struct.pack(">ii", 3, 1),
                  b"MPUB t\n" + struct.pack(">ii", 12, 0), b"MPUB t\n" + struct.pack(">ii", MAX_BODY + 1, 1),
                  _mpub(8, 2, [3, 3]), _mpub(16, 2, [3, -1]), b"NOP\n", b"PUB u\n", b"PUB t\r\n", b"FIN x\n"]
        implementations = {wire.PURE_TAKE_PUBLISH, wire.take_publish}
        for _ in range(2000):
            data = b"".join(rng.choice(pieces) for _ in range(rng.randrange(1, 4)))
            data = data[:rng.randrange(len(data) + 1)] if rng.random() < 0.4 else data
            buf = bytearray(b"junk" + data)
            pos = rng.choice([0, 4, 4, 4, rng.randrange(len(buf) + 1)])
            got = {impl: impl(buf, pos, self.KNOWN, MAX_MSG, MAX_BODY) for impl in implementations}
            self.assertEqual(len(set(map(repr, got.values()))), 1, (bytes(buf), pos, got))
        self.assertEqual(wire.take_publish(bytearray(encode_mpub(b"t", [b"a", b"b"])), 0, self.KNOWN, MAX_MSG,
                                           MAX_BODY), (25, b"MPUB", "t", [b"a", b"b"]))
        self.assertIs(wire.take_publish, wire.PURE_TAKE_PUBLISH)  # its compiled twin (hand-written C) is gone


class FinRunTests(SynchronousTestCase):
    def parser(self, data: bytes) -> V2Parser:
        parser = V2Parser(MAX_MSG, MAX_BODY, expect_magic=False)
        parser.feed(data)
        return parser

    def test_takes_a_run_of_fins(self) -> None:
        """Back-to-back FINs come out as IDs; the next command is left for next_command()."""
        ids = [f"{i:016x}".encode() for i in range(5)]
        parser = self.parser(b"".join(b"FIN " + i + b"\n" for i in ids) + b"RDY 3\nFIN 0000")
        self.assertEqual(parser.take_fins(), ids)
        self.assertEqual(parser.take_fins(), [])
        self.assertEqual(parser.next_command(), Command(b"RDY", [b"3"]))
        self.assertEqual(parser.take_fins(), [])  # partial line: wait for the rest
        parser.feed(b"00000000000a\n")
        self.assertEqual(parser.take_fins(), [b"000000000000000a"])
        self.assertEqual(parser.next_command(), None)

    def test_odd_fins_go_the_generic_way(self) -> None:
        """A FIN whose ID holds a space or ends in \\r is parsed (and refused) like nsqd does."""
        for line in (b"FIN 0123456 89abcdef\n", b"FIN 0123456789abcde\r\n", b"FIN 0123456789abcdef0\n",
                     b"FIN  123456789abcdef\n",
                     # a short ID, then a line that ends where a 16-byte ID would: two lines, not one ID
                     b"FIN 0123\n56789abcdef\n", b"FIN \n123456789abcdef\n"):
            parser = self.parser(b"FIN 0123456789abcdef\n" + line)
            self.assertEqual(parser.take_fins(), [b"0123456789abcdef"], line)
            self.assertEqual(parser.take_fins(), [], line)
            cmd = parser.next_command()
            assert cmd is not None
            self.assertEqual(cmd.name, b"FIN")
            self.assertNotEqual([len(a) for a in cmd.args], [16], line)

    def test_compiled_and_pure_runs_agree(self) -> None:
        """fin_run as used (compiled where built) takes exactly the lines the regular expression
        of the pure one takes, over random mixes of plain and odd FIN lines, from any position."""
        rng = random.Random(9)
        pieces = [b"FIN 0123456789abcdef\n", b"FIN 0123456 89abcdef\n", b"FIN 0123456789abcde\r\n",
                  b"FIN 0123456789abcd\r\n\n", b"FIN \xff\x00\t23456789abcdef\n", b"FIN 0123456789abcdef",
                  b"FIN 0123456789abcde\n\n", b"RDY 1\n", b"FIN", b"\n"]
        implementations = {wire.PURE_FIN_RUN, wire.fin_run}
        for _ in range(2000):
            data = bytearray(b"".join(rng.choice(pieces) for _ in range(rng.randrange(6))))
            pos = rng.randrange(len(data) + 1)
            got = {impl: impl(data, pos) for impl in implementations}
            self.assertEqual(len(set(map(tuple, got.values()))), 1, (bytes(data), pos, got))
        self.assertEqual(wire.fin_run(bytearray(b"xFIN 0123456789abcdef\n"), 1), [b"0123456789abcdef"])
        self.assertEqual(wire.fin_run(b"", 0), [])
        self.assertIs(wire.fin_run, wire.PURE_FIN_RUN)  # its compiled twin (hand-written C) is gone

    def test_not_inside_a_body(self) -> None:
        """Bytes that look like a FIN inside a PUB body are body bytes."""
        body = b"FIN 0123456789abcdef\n"
        parser = self.parser(encode_command(b"PUB", b"t", body=body))
        self.assertEqual(parser.take_fins(), [])
        parser = self.parser(b"PUB t\n")
        self.assertIsNone(parser.next_command())
        parser.feed(struct.pack(">i", len(body)) + body)
        self.assertEqual(parser.take_fins(), [])
        self.assertEqual(parser.next_command(), Command(b"PUB", [b"t"], body=body))


class ErrorTests(SynchronousTestCase):
    def error(self, data: bytes) -> str:
        parser = V2Parser(MAX_MSG, MAX_BODY)
        parser.feed(data)
        with self.assertRaises(NSQError) as ctx:
            while parser.next_command() is not None:
                pass
        self.assertTrue(ctx.exception.fatal)
        return str(ctx.exception)

    def test_bad_magic(self) -> None:
        """Anything but '  V2' is E_BAD_PROTOCOL."""
        self.assertEqual(self.error(b"  V1"), "E_BAD_PROTOCOL")

    def test_pub_sizes(self) -> None:
        """PUB/DPUB sizes: zero, negative and over --max-msg-size are refused before buffering."""
        self.assertEqual(self.error(b"  V2PUB t\n" + struct.pack(">i", 0)),
                         "E_BAD_MESSAGE PUB invalid message body size 0")
        self.assertEqual(self.error(b"  V2PUB t\n" + struct.pack(">i", -5)),
                         "E_BAD_MESSAGE PUB invalid message body size -5")
        self.assertEqual(self.error(b"  V2DPUB t 1\n" + struct.pack(">i", MAX_MSG + 1)),
                         f"E_BAD_MESSAGE DPUB message too big {MAX_MSG + 1} > {MAX_MSG}")

    def test_identify_and_auth_sizes(self) -> None:
        """IDENTIFY/AUTH bodies are bounded by --max-body-size; 'too big' is checked first."""
        self.assertEqual(self.error(b"  V2IDENTIFY\n" + struct.pack(">i", MAX_BODY + 1)),
                         f"E_BAD_BODY IDENTIFY body too big {MAX_BODY + 1} > {MAX_BODY}")
        self.assertEqual(self.error(b"  V2AUTH\n" + struct.pack(">i", 0)),
                         "E_BAD_BODY AUTH invalid body size 0")

    def test_mpub_errors(self) -> None:
        """MPUB: body size, message count and each message size are checked like nsqd."""
        self.assertEqual(self.error(b"  V2MPUB t\n" + struct.pack(">i", 0)),
                         "E_BAD_BODY MPUB invalid body size 0")
        self.assertEqual(self.error(b"  V2MPUB t\n" + struct.pack(">i", MAX_BODY + 1)),
                         f"E_BAD_BODY MPUB body too big {MAX_BODY + 1} > {MAX_BODY}")
        self.assertEqual(self.error(b"  V2MPUB t\n" + struct.pack(">ii", 8, 0)),
                         "E_BAD_BODY MPUB invalid message count 0")
        self.assertEqual(self.error(b"  V2MPUB t\n" + struct.pack(">ii", 8, MAX_BODY)),
                         f"E_BAD_BODY MPUB invalid message count {MAX_BODY}")
        self.assertEqual(self.error(b"  V2MPUB t\n" + struct.pack(">iiii", 20, 2, 1, 0)[:-4]
                                    + b"x" + struct.pack(">i", 0)),
                         "E_BAD_MESSAGE MPUB invalid message(1) body size 0")
        self.assertEqual(self.error(b"  V2MPUB t\n" + struct.pack(">iii", 20, 1, MAX_MSG + 1)),
                         f"E_BAD_MESSAGE MPUB message too big {MAX_MSG + 1} > {MAX_MSG}")

    def test_mpub_never_buffers_past_max_body(self) -> None:
        """A count that reads past the declared body is followed, but never past --max-body-size."""
        many = struct.pack(">i", 1000) + b"x" * 1000
        data = b"  V2MPUB t\n" + struct.pack(">ii", 10, 100) + many * 5
        self.assertEqual(self.error(data), f"E_BAD_BODY MPUB body too big {4 + 1004 * 5} > {MAX_BODY}")

    def test_line_too_long(self) -> None:
        """A line over 16 KiB without a newline ends the connection (no frame, as nsqd)."""
        parser = V2Parser(MAX_MSG, MAX_BODY, expect_magic=False)
        parser.feed(b"X" * (MAX_LINE_LENGTH + 1))
        self.assertRaises(LineTooLong, parser.next_command)

    def test_parser_keeps_no_more_than_it_needs(self) -> None:
        """Consumed bytes are released: the buffer holds only the unparsed tail."""
        parser = V2Parser(MAX_MSG, MAX_BODY)
        parser.feed(b"  V2" + b"NOP\n" * 1000 + b"RD")
        cmds = []
        while (c := parser.next_command()) is not None:
            cmds.append(c)
        self.assertEqual(len(cmds), 1000)
        self.assertEqual(parser.buffered(), 2)
