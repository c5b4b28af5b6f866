"""A replication log's journal: its bookkeeping on disk, so the log outlives its process.

A log (a standby's copies of an owner's topic, or a node's own log of its
replicated topic) keeps its messages in segments as they arrived; which of
them are finished, and on which channels, lives in memory. The journal
writes that bookkeeping down as it changes: the log's identity (``META``),
each channel made, gone or emptied, each ``FIN``, each run of messages a
``SNAP`` brought with the channels owing them, and the start of a takeover.
Each entry names the arrival number it happened at, so a process that
starts again replays the segments and the journal side by side and gets
the same state back (:meth:`nsqtw.replica.standby.Standby.restore`).

What it promises is one-sided: an entry lost (a crash before it reached
the disk) can only make the replay hold a message that was finished, so a
takeover delivers it again; it never makes a message look finished that was
not. The journal is rewritten as one ``CHECKPOINT`` of the whole state once
it grows past its state's size (:meth:`~nsqtw.replica.standby.Standby.maintain`).

Files, in the node's data directory (Go nsqd reads none of them):
``OWNER~TOPIC.nsqtw.standby.N.journal`` and the segments
``OWNER~TOPIC.nsqtw.standby.N.SEGMENT.FIRST.dat``, FIRST being the arrival
number of the segment's first message.
"""

from __future__ import annotations

import json
import os
import re
import struct
from array import array
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Final

from nsqtw.replica.records import index_messages
from nsqtw.storage.atomic import atomic_write

__all__ = ["JOURNAL_MIN", "Entry", "Found", "LogFiles", "decode_checkpoint", "encode_checkpoint", "encode_entry",
           "parse_entries", "read_logs", "remove_files", "replace_journal"]

_HEAD: Final = struct.Struct(">IBQ")  # length (of kind, arrival and payload), kind, arrival number
_U32: Final = struct.Struct(">I")
#: a journal is rewritten as a checkpoint once past this and twice its state's size
JOURNAL_MIN: Final = 1024 * 1024

_NAME: Final = re.compile(r"^(?P<prefix>.+\.nsqtw\.standby\.(?P<log>\d+))\."
                          r"(?:(?P<segment>\d{6})\.(?P<first>\d+)\.dat|journal)$")


class Entry(IntEnum):
    """The journal's entry kinds."""

    META = 1          # {"owner", "topic", "role": "main"|"part"|"own", "incarnation", "host", "http_port", "started"}
    CHANNEL = 2       # {"name", "backlog"}
    CHANNEL_GONE = 3  # {"name"}
    EMPTY = 4         # {"name"}: every message so far done there (null: the topic's, which changes nothing)
    FIN = 5           # 2-byte length and channel name, then 16-hex-digit IDs back to back
    OWING = 6         # {"n", "owing"}: the n messages from this arrival on came by SNAP, owed by exactly these
    CHECKPOINT = 7    # the whole state (:func:`encode_checkpoint`)
    TAKEN = 8         # {}: its takeover began (a process that starts again takes it over at once)


def encode_entry(kind: Entry, at: int, payload: bytes = b"") -> bytes:
    return _HEAD.pack(len(payload) + 9, kind, at) + payload


def encode_json_entry(kind: Entry, at: int, value: dict[str, Any]) -> bytes:
    return encode_entry(kind, at, json.dumps(value, separators=(",", ":")).encode())


def parse_entries(data: bytes) -> list[tuple[int, int, bytes]]:
    """A journal's entries as (kind, arrival, payload); a torn last one (a crash mid-write) is left out."""
    out: list[tuple[int, int, bytes]] = []
    pos = 0
    size = len(data)
    while pos + _HEAD.size <= size:
        n, kind, at = _HEAD.unpack_from(data, pos)
        if n < 9 or pos + 4 + n > size:
            break
        out.append((kind, at, data[pos + _HEAD.size:pos + 4 + n]))
        pos += 4 + n
    return out


def encode_checkpoint(base: int, channels: list[tuple[str, int, bytes]], done: bytes) -> bytes:
    """The state of a log whose held messages start at arrival ``base``: per message whether it is
    done, and per channel from which arrival it owes messages and which held ones it finished."""
    head = json.dumps({"base": base, "channels": [[name, start] for name, start, _ in channels]},
                      separators=(",", ":")).encode()
    return _U32.pack(len(head)) + head + done + b"".join(finished for _, _, finished in channels)


def decode_checkpoint(payload: bytes) -> tuple[int, list[tuple[str, int, bytes]], bytes]:
    (n,) = _U32.unpack_from(payload, 0)
    head = json.loads(payload[4:4 + n])
    rest = payload[4 + n:]
    channels = head["channels"]
    held = len(rest) // (1 + len(channels))
    done = rest[:held]
    out = [(str(name), int(start), rest[held * (k + 1):held * (k + 2)]) for k, (name, start) in enumerate(channels)]
    return int(head["base"]), out, done


@dataclass
class LogFiles:
    """One log's files as a start found them: its journal's bytes and its segments, each as
    (segment number, first arrival, bytes, ID values, body sizes)."""

    prefix: str
    number: int
    journal: bytes | None = None
    #: every file of it found (its journal and segments), by name
    names: list[str] = field(default_factory=list)
    segments: list[tuple[int, int, int, array[int], array[int]]] = field(default_factory=list)


@dataclass
class Found:
    """What :func:`read_logs` found: every log, and the files of none (an earlier format) to remove."""

    logs: list[LogFiles]
    strays: list[str]


def read_logs(directory: str, suffix: str) -> Found:
    """Disk thread: every log left in ``directory`` (files with ``suffix`` in their names), read."""
    logs: dict[str, LogFiles] = {}
    strays: list[str] = []
    for name in sorted(os.listdir(directory)):
        if suffix + "." not in name:
            continue
        m = _NAME.match(name)
        if m is None:
            strays.append(name)
            continue
        log = logs.setdefault(m["prefix"], LogFiles(m["prefix"], int(m["log"])))
        log.names.append(name)
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        if m["segment"] is None:
            log.journal = data
        else:
            values, sizes = index_messages(data, torn_ok=True)
            log.segments.append((int(m["segment"]), int(m["first"]), len(data), array("Q", values),
                                 array("I", sizes)))
    for log in logs.values():
        log.segments.sort()
    return Found(sorted(logs.values(), key=lambda log: log.number), strays)


def remove_files(paths: list[str]) -> None:
    """Disk thread: each file gone (one already gone too)."""
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def replace_journal(path: str, data: bytes, fsync: bool) -> None:
    """Disk thread: the journal rewritten as ``data`` (written aside, then renamed over it; a write
    that fails, a full disk, leaves the old journal and no part of the new one)."""
    atomic_write(path, data, fsync=os.fsync if fsync else _no_fsync, sync_dir=fsync)


def _no_fsync(fd: int) -> None:
    """Without --durable-delivery a rewritten journal is not fsynced (nothing waits on it)."""
