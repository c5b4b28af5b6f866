"""The per-record loops a disk thread runs: splitting a segment read into records, framing records to write.

nsqtw.storage.formats is compiled where it can be (nsqtw/speedups.py);
.ci/run runs this module against the compiled build and the pure one. Each
must give what a plain ``struct`` reading of the format gives, including
where it stops.
"""

from __future__ import annotations

import random
import struct
import threading

from twisted.trial.unittest import SynchronousTestCase

from nsqtw.storage.formats import frame_records, split_records

MIN, MAX = 4, 40


def record(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def split_by_struct(buf: bytes, max_records: int) -> tuple[list[bytes], int]:
    """The test's own reading of a segment: each size with ``struct``, records up to the first bad or cut one."""
    out: list[bytes] = []
    off = 0
    while len(out) < max_records and len(buf) - off >= 4:
        (size,) = struct.unpack_from(">i", buf, off)
        if not MIN <= size <= MAX or len(buf) - off - 4 < size:
            break
        out.append(buf[off + 4:off + 4 + size])
        off += 4 + size
    return out, off


class SplitRecordsTests(SynchronousTestCase):
    def test_whole_records_and_where_they_end(self) -> None:
        buf = record(b"aaaa") + record(b"bbbbbb") + record(b"cccc")[:6]
        self.assertEqual(split_records(buf, 10, MIN, MAX), ([b"aaaa", b"bbbbbb"], 18))
        self.assertEqual(split_records(buf, 1, MIN, MAX), ([b"aaaa"], 8))
        self.assertEqual(split_records(buf, 0, MIN, MAX), ([], 0))

    def test_stops_before_a_bad_size_or_a_short_header(self) -> None:
        """A size below the minimum, above the maximum or negative ends the run; so do 1-3 bytes left over."""
        good = record(b"aaaa")
        for bad in (struct.pack(">i", 3) + b"xxx", struct.pack(">i", 41) + b"x" * 41,
                    struct.pack(">i", -5) + b"xxxxx", b"\x00", b"\x00\x00\x00"):
            self.assertEqual(split_records(good + bad + good, 10, MIN, MAX), ([b"aaaa"], 8), bad)
            self.assertEqual(split_records(bad + good, 10, MIN, MAX), ([], 0), bad)
        self.assertEqual(split_records(b"", 10, MIN, MAX), ([], 0))

    def test_random_runs_read_as_struct_reads_them(self) -> None:
        """Random runs of good and bad records, cut anywhere, with any limit: the same records, the same end."""
        rng = random.Random(17)
        for _ in range(3000):
            parts = []
            for _ in range(rng.randrange(8)):
                size = rng.choice([rng.randrange(MIN, MAX + 1), rng.randrange(MIN, MAX + 1), 0, 3, 41, -1, 2**31 - 1])
                parts.append(struct.pack(">i", size) + bytes(rng.randrange(256) for _ in range(max(0, min(size, 50)))))
            buf = b"".join(parts)
            buf = buf[:rng.randrange(len(buf) + 1)]
            limit = rng.randrange(10)
            self.assertEqual(split_records(buf, limit, MIN, MAX), split_by_struct(buf, limit), (buf, limit))


class FrameRecordsTests(SynchronousTestCase):
    def test_frames_as_many_as_fit(self) -> None:
        batch = [b"aaaa", b"bbbbbb", b"cccc"]
        self.assertEqual(frame_records(batch, 0, 100, MIN, MAX), (b"".join(map(record, batch)), 3))
        self.assertEqual(frame_records(batch, 0, 18, MIN, MAX), (record(b"aaaa") + record(b"bbbbbb"), 2))
        self.assertEqual(frame_records(batch, 1, 18, MIN, MAX), (record(b"bbbbbb") + record(b"cccc"), 2))
        self.assertEqual(frame_records(batch, 3, 18, MIN, MAX), (b"", 0))

    def test_the_first_record_is_taken_whatever_the_room(self) -> None:
        """The caller rolls to a fresh segment first when it must: a record bigger than a segment gets its own."""
        self.assertEqual(frame_records([b"x" * 30, b"aaaa"], 0, 5, MIN, MAX), (record(b"x" * 30), 1))

    def test_stops_before_a_bad_size(self) -> None:
        batch = [b"aaaa", b"abc", b"bbbb"]
        self.assertEqual(frame_records(batch, 0, 100, MIN, MAX), (record(b"aaaa"), 1))
        self.assertEqual(frame_records(batch, 1, 100, MIN, MAX), (b"", 0))
        self.assertEqual(frame_records([b"x" * 41], 0, 100, MIN, MAX), (b"", 0))

    def test_random_batches_frame_as_struct_packs_them_and_split_undoes_them(self) -> None:
        rng = random.Random(23)
        for _ in range(3000):
            batch = [bytes(rng.randrange(256) for _ in range(rng.choice([rng.randrange(MIN, MAX + 1)] * 5 + [2, 45])))
                     for _ in range(rng.randrange(8))]
            start = rng.randrange(len(batch) + 1)
            room = rng.randrange(120)
            framed, count = frame_records(batch, start, room, MIN, MAX)
            taken = batch[start:start + count]
            self.assertEqual(framed, b"".join(map(record, taken)), (batch, start, room))
            fits = [i for i in range(1, len(batch) - start + 1)
                    if all(MIN <= len(d) <= MAX for d in batch[start:start + i])
                    and (i == 1 or sum(4 + len(d) for d in batch[start:start + i]) <= room)]
            self.assertEqual(count, max(fits, default=0), (batch, start, room))
            self.assertEqual(split_records(framed, 100, MIN, MAX), (taken, len(framed)))

    def test_framing_buffers_are_reused_and_never_shared(self) -> None:
        """Calls reuse framing buffers (formats._WRITERS): a piece bigger than a kept buffer, the small
        ones after it, and batches framed by several threads at once all come out as their own records."""
        big = [b"b" * 40_000, b"c" * 40_000]
        self.assertEqual(frame_records(big, 0, 1 << 20, MIN, 1 << 20), (b"".join(map(record, big)), 2))
        self.assertEqual(frame_records([b"aaaa"], 0, 100, MIN, MAX), (record(b"aaaa"), 1))
        wrong: list[bytes] = []

        def frame_many(fill: bytes) -> None:
            batch = [fill * (1 + i % MAX) for i in range(MAX)] * 20
            expected = b"".join(map(record, batch))
            for _ in range(300):
                framed, count = frame_records(batch, 0, 1 << 20, 1, MAX)
                if (framed, count) != (expected, len(batch)):
                    wrong.append(fill)
        threads = [threading.Thread(target=frame_many, args=(bytes([65 + n]),)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(wrong, [])
