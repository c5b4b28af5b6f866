"""go-diskqueue's file formats: segment records and the metadata text, as bytes in, bytes out.

A segment (``NAME.diskqueue.%06d.dat``) is ``[int32 big-endian size][data]``
records back to back; the metadata file (``NAME.diskqueue.meta.dat``) holds
``depth\\nreadFileNum,readPos\\nwriteFileNum,writePos\\n``.
:class:`nsqtw.storage.segments.DiskState` does the files and positions; this
module only turns bytes into records and back. Its per-record loops run on
the disk threads for every record written or read back, holding the GIL the
reactor's thread waits for, so setup.py compiles this module with mypyc
where it can (nsqtw/speedups.py); the same source runs as plain Python
where it cannot (tests/unit/test_segments.py runs against both).
"""

from __future__ import annotations

import re
from typing import Final

from librt.strings import BytesWriter, read_i32_be, write_i32_be

from nsqtw.core.message import MIN_VALID_MSG_LENGTH

__all__ = ["format_meta", "frame_records", "nsqd_msg_size_limits", "parse_meta", "read_size", "split_records"]


_META_RE: Final = re.compile(rb"\A(-?\d+)\n(-?\d+),(-?\d+)\n(-?\d+),(-?\d+)\n")

#: framing buffers kept from one :func:`frame_records` call to the next: a fresh one grows to a
#: 64 KiB piece by doubling, reallocating and copying what it holds each time, which cost more
#: than the framing itself. A call takes one and puts it back (list.pop and append are atomic, so
#: no two threads share one), so there are never more than the disk threads framing at once plus
#: these four, seeded as nsqd's default --disk-threads so that the list stays over half full and
#: taking and putting back never resize it
_WRITERS: Final[list[BytesWriter]] = [BytesWriter() for _ in range(4)]
#: a buffer that held more (one record bigger than segments.IO_PIECE) is let go, so a kept one
#: holds at most 128 KiB
_KEEP_AT_MOST: Final = 64 * 1024


def nsqd_msg_size_limits(max_msg_size: int) -> tuple[int, int]:
    """The (min, max) record sizes nsqd gives go-diskqueue for ``--max-msg-size``."""
    return MIN_VALID_MSG_LENGTH, max_msg_size + MIN_VALID_MSG_LENGTH


def read_size(buf: bytes) -> int:
    """The size field of the record at the start of ``buf`` (at least 4 bytes)."""
    return read_i32_be(buf, 0)


def split_records(buf: bytes, max_records: int, min_size: int, max_size: int) -> tuple[list[bytes], int]:
    """The whole, valid records at the start of ``buf`` (at most ``max_records``): their data and the bytes they take.

    Stops before the first record that ``buf`` cuts short or whose size is
    outside ``[min_size, max_size]``; what is wrong with that one matters only
    when it comes first, and :meth:`DiskState._read_records` then looks at it
    itself.
    """
    out: list[bytes] = []
    off = 0
    end = len(buf)
    while len(out) < max_records and end - off >= 4:
        size: int = read_i32_be(buf, off)
        if size < min_size or size > max_size or end - off - 4 < size:
            break
        off += 4
        out.append(buf[off:off + size])
        off += size
    return out, off


def frame_records(batch: list[bytes], start: int, room: int, min_size: int, max_size: int,
                  ) -> tuple[bytes, int]:
    """``batch[start:]`` framed as segment records, ``[int32 size][data]`` back to back, and how many.

    Takes the first record whatever its size (the caller has rolled to a
    fresh segment if it must) and then as many as fit in ``room`` bytes;
    stops before a record whose size is outside ``[min_size, max_size]``
    (the caller reports it).
    """
    try:
        out = _WRITERS.pop()
    except IndexError:
        out = BytesWriter()
    used = 0
    i = start
    n = len(batch)
    while i < n:
        data = batch[i]
        size = len(data)
        if size < min_size or size > max_size or (i > start and used + 4 + size > room):
            break
        write_i32_be(out, size)
        out.write(data)
        used += 4 + size
        i += 1
    framed = out.getvalue()
    if len(out) <= _KEEP_AT_MOST:
        out.truncate(0)
        _WRITERS.append(out)
    return framed, i - start


def parse_meta(text: bytes) -> tuple[int, int, int, int, int] | None:
    """(depth, readFileNum, readPos, writeFileNum, writePos) from a metadata file, or None if it is malformed."""
    m = _META_RE.match(text)
    if m is None:
        return None
    depth, rnum, rpos, wnum, wpos = m.groups()
    return int(depth), int(rnum), int(rpos), int(wnum), int(wpos)


def format_meta(depth: int, read_file_num: int, read_pos: int, write_file_num: int, write_pos: int) -> bytes:
    """The metadata file's text."""
    return f"{depth}\n{read_file_num},{read_pos}\n{write_file_num},{write_pos}\n".encode("ascii")
