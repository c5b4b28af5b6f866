"""The V2 parser: every command shape, fed in every chunking, and its size checks."""

from __future__ import annotations

import random
import struct

from twisted.trial.unittest import SynchronousTestCase

from nsqtw.errors import NSQError
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
    Command(b"FIN", [], ids=[b"0123456789abcdef"]),
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

    def test_header_check_sees_every_command_once(self) -> None:
        """Every command's line goes through the header check before it is handed out; a run
        of FINs or REQs once, with no arguments."""
        seen: list[tuple[bytes, list[bytes]]] = []
        parser = V2Parser(MAX_MSG, MAX_BODY, check_header=lambda n, a: seen.append((n, a)), expect_magic=False)
        parser.feed(b"FIN 0123456789abcdef\n" * 2 + b"RDY 1\n" + b"REQ 0123456789abcdef 5\n" * 2 + b"NOP\n")
        while parser.next_command() is not None:
            pass
        self.assertEqual(seen, [(b"FIN", []), (b"RDY", [b"1"]), (b"REQ", []), (b"NOP", [])])

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

    ODD = [
        b"PUB t \n" + struct.pack(">i", 1) + b"a",  # an empty second argument
        b"PUB t extra\n" + struct.pack(">i", 1) + b"a",  # more arguments than nsqd reads
        b"PUB t\r\n" + struct.pack(">i", 1) + b"a",
        b"PUB  t\n" + struct.pack(">i", 1) + b"a",
        b"PUB \n" + struct.pack(">i", 1) + b"a",
        b"MPUB\tt\n" + struct.pack(">i", 1) + b"a",
        b"PUB\n",
        encode_command(b"PUB", b"x" * 65, body=b"too long"),
        encode_mpub(b"x" * 64, [b"a", b"b"]),
        encode_command(b"DPUB", b"t", b"10", body=b"later"),
        b"PUB t\n\x00\x00",  # its size not all there yet
        b"MPUB t\n" + struct.pack(">ii", 9, 1),
    ]

    def test_odd_lines_the_same_in_any_chunking(self) -> None:
        """Publish lines with odd spacing, line ends or names: the same commands and errors
        whole, byte by byte and in 7-byte pieces, followed by anything."""
        for case in self.ODD:
            for then in (b"", b"NOP\n", encode_command(b"PUB", b"t", body=b"next"),
                         encode_mpub(b"t", [b"m1", b"m2"])):
                data = b"  V2" + case + then
                whole = outcome(data, len(data))
                self.assertEqual(whole, outcome(data, 1), (case, then))
                self.assertEqual(whole, outcome(data, 7), (case, then))

    def test_a_whole_publish_comes_out_of_the_call_that_read_its_line(self) -> None:
        """Back-to-back PUBs and MPUBs that arrived whole: one next_command() call each, and
        the parser is at a line boundary with nothing left after the last."""
        pieces = [(encode_command(b"PUB", b"t", body=b"hi"), Command(b"PUB", [b"t"], body=b"hi")),
                  (encode_mpub(b"t", [b"a", b"b"]), Command(b"MPUB", [b"t"], messages=[b"a", b"b"])),
                  (encode_mpub(b"t", [b"x" * MAX_MSG] * 3), Command(b"MPUB", [b"t"], messages=[b"x" * MAX_MSG] * 3))]
        parser = V2Parser(MAX_MSG, MAX_BODY, expect_magic=False)
        parser.feed(b"".join(data for data, _ in pieces))
        for _, want in pieces:
            self.assertEqual(parser.next_command(), want)
        self.assertEqual((parser.buffered(), parser.in_command()), (0, False))
        self.assertIsNone(parser.next_command())

    def test_an_mpub_in_pieces_takes_what_has_arrived(self) -> None:
        """An MPUB arriving in pieces: each message is kept as it arrives, the command comes out
        with the last one, and a message past the declared size is read one by one."""
        parser = V2Parser(MAX_MSG, MAX_BODY, expect_magic=False)
        data = encode_mpub(b"t", [b"a" * 10, b"b" * 20, b"c" * 30])
        parser.feed(data[:-5])
        self.assertIsNone(parser.next_command())
        self.assertTrue(parser.in_command())
        self.assertEqual(parser.buffered(), 30 - 5)  # the first two taken, the third one's size read
        parser.feed(data[-5:])
        self.assertEqual(parser.next_command(), Command(b"MPUB", [b"t"], messages=[b"a" * 10, b"b" * 20, b"c" * 30]))
        parser.feed(_mpub(11, 2, [3, 3]) + b"NOP\n")  # declares one message's size, sends two
        self.assertEqual(parser.next_command(), Command(b"MPUB", [b"t"], messages=[b"mmm", b"mmm"]))
        self.assertEqual(parser.next_command(), Command(b"NOP", []))


    def test_reads_arriving_mid_body_are_joined_once(self) -> None:
        """A body arriving in many reads is held aside read by read and joined once it is whole
        (the input is not copied again at every read), with nothing lost in between."""
        body = bytes(range(256)) * 3
        data = encode_command(b"PUB", b"t", body=body)
        parser = V2Parser(MAX_MSG, MAX_BODY, expect_magic=False)
        parser.feed(data[:20])  # the line, the size and the body's first bytes
        self.assertIsNone(parser.next_command())
        for at in range(20, len(data) - 10, 50):
            parser.feed(data[at:min(at + 50, len(data) - 10)])
            self.assertIsNone(parser.next_command())
            self.assertEqual(len(parser._buf), 20)  # the first read, not yet joined with the rest
            self.assertEqual(parser.buffered(), min(at + 50, len(data) - 10) - 10)  # past the line and size
        parser.feed(data[-10:])
        self.assertEqual(parser.next_command(), Command(b"PUB", [b"t"], body=body))
        self.assertEqual((parser.buffered(), parser.in_command()), (0, False))


class FinRunTests(SynchronousTestCase):
    def parser(self, data: bytes) -> V2Parser:
        parser = V2Parser(MAX_MSG, MAX_BODY, expect_magic=False)
        parser.feed(data)
        return parser

    def test_takes_a_run_of_fins(self) -> None:
        """Back-to-back FINs come out as one command carrying their IDs; then the next command."""
        ids = [f"{i:016x}".encode() for i in range(5)]
        parser = self.parser(b"".join(b"FIN " + i + b"\n" for i in ids) + b"RDY 3\nFIN 0000")
        self.assertEqual(parser.next_command(), Command(b"FIN", [], ids=ids))
        self.assertEqual(parser.next_command(), Command(b"RDY", [b"3"]))
        self.assertIsNone(parser.next_command())  # partial line: wait for the rest
        parser.feed(b"00000000000a\n")
        self.assertEqual(parser.next_command(), Command(b"FIN", [], ids=[b"000000000000000a"]))
        self.assertIsNone(parser.next_command())

    def test_odd_fins_go_the_generic_way(self) -> None:
        """A FIN whose ID holds a space or ends in \\r is parsed (and refused) like nsqd does."""
        for line in (b"FIN 0123456 89abcdef\n", b"FIN 0123456789abcde\r\n", b"FIN 0123456789abcdef0\n",
                     b"FIN  123456789abcdef\n",
                     # a short ID, then a line that ends where a 16-byte ID would: two lines, not one ID
                     b"FIN 0123\n56789abcdef\n", b"FIN \n123456789abcdef\n"):
            parser = self.parser(b"FIN 0123456789abcdef\n" + line)
            self.assertEqual(parser.next_command(), Command(b"FIN", [], ids=[b"0123456789abcdef"]), line)
            cmd = parser.next_command()
            assert cmd is not None
            self.assertEqual(cmd.name, b"FIN")
            self.assertIsNone(cmd.ids, line)
            self.assertNotEqual([len(a) for a in cmd.args], [16], line)

    def test_long_runs_stop_at_the_first_odd_line(self) -> None:
        """Runs longer than the pieces they are checked in (64 lines, then 256, ...) end exactly
        at the first line that is not plain, wherever it falls, and go on after it."""
        ids = [f"{i:016x}".encode() for i in range(400)]
        for odd in (b"FIN 0123456 89abcdef\n", b"FIN 0123456789abcde\r\n", b"RDY 1\n", b"FIN 0123\n"):
            for at in (0, 1, 63, 64, 65, 319, 320, 399):
                parser = self.parser(b"".join(b"FIN " + i + b"\n" for i in ids[:at]) + odd
                                     + b"".join(b"FIN " + i + b"\n" for i in ids[at:]))
                if at:
                    self.assertEqual(parser.next_command(), Command(b"FIN", [], ids=ids[:at]), (odd, at))
                cmd = parser.next_command()
                assert cmd is not None
                self.assertIsNone(cmd.ids, (odd, at))
                self.assertEqual(parser.next_command(), Command(b"FIN", [], ids=ids[at:]), (odd, at))
                self.assertIsNone(parser.next_command())

    def test_runs_match_the_line_by_line_parse(self) -> None:
        """Over random mixes of plain and odd FIN lines, the IDs of the runs are exactly the
        arguments of the lines a line-by-line split would give as one 16-byte ID."""
        rng = random.Random(9)
        pieces = [b"FIN 0123456789abcdef\n", b"FIN 0123456 89abcdef\n", b"FIN 0123456789abcde\r\n",
                  b"FIN 0123456789abcd\r\n\n", b"FIN \xff\x00\t23456789abcdef\n", b"FIN 0123456789abcdef",
                  b"FIN 0123456789abcde\n\n", b"RDY 1\n", b"FIN", b"\n"]
        for _ in range(2000):
            data = b"".join(rng.choice(pieces) for _ in range(rng.randrange(6)))
            got: list[tuple[bytes, list[bytes]]] = []
            for cmd in parse_all(b"  V2" + data, len(data) + 4):
                if cmd.ids is not None:
                    got.extend((b"FIN", [i]) for i in cmd.ids)
                else:
                    got.append((cmd.name, cmd.args))
            lines = data.split(b"\n")[:-1]  # the last is unfinished
            want = []
            for line in lines:
                params = (line[:-1] if line.endswith(b"\r") else line).split(b" ")
                want.append((params[0], params[1:]))
            self.assertEqual(got, want, data)

    def test_not_inside_a_body(self) -> None:
        """Bytes that look like a FIN inside a PUB body are body bytes."""
        body = b"FIN 0123456789abcdef\n"
        parser = self.parser(encode_command(b"PUB", b"t", body=body))
        self.assertEqual(parser.next_command(), Command(b"PUB", [b"t"], body=body))
        parser = self.parser(b"PUB t\n")
        self.assertIsNone(parser.next_command())
        parser.feed(struct.pack(">i", len(body)) + body)
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
