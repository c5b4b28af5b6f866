"""``nsqd.dat``: which topics and channels exist and which are paused.

The same JSON Go nsqd writes (``{"topics":[{"name","paused","channels":[…]}],
"version"}``), so a data directory moves between nsqd and nsqtw either way.
Ephemeral topics and channels are never written, as in nsqd.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from nsqtw import NSQD_VERSION
from nsqtw.log import Logger
from nsqtw.names import is_valid_channel_name, is_valid_topic_name
from nsqtw.storage.atomic import atomic_write

if TYPE_CHECKING:
    from nsqtw.core.nsqd import NSQD

FILENAME = "nsqd.dat"
#: nsqtw's own: due times of deferred messages flushed at stop (nsqd has no place for them)
DEFERRED_FILENAME = "nsqtw.deferred.json"

log = Logger(namespace="nsqtw.storage.metadata")

Submit = Callable[..., "Deferred[Any]"]


#: a node's topics and channels as plain values: ``[(topic, paused, [(channel, paused)])]``
State = list[tuple[str, bool, list[tuple[str, bool]]]]


def snapshot(nsqd: NSQD) -> State:
    """The durable topics and channels, taken on the reactor (no sorting, no encoding)."""
    return [(topic.name, topic.paused,
             [(c.name, c.paused) for c in topic.channels.values() if not c.ephemeral])
            for topic in nsqd.topics.values() if not topic.ephemeral]


#: channels encoded between two releases of the GIL. The encoding runs on the metadata lane,
#: and ``json.dumps`` of a whole document holds the GIL until it is done: 13 ms for 10,000
#: channels, all of it a stall for the reactor waiting to answer a client
ENCODE_SLICE = 256
_BOOL = ("false", "true")


def encode_state(state: State) -> bytes:
    """The metadata document for a snapshot (sorted, as nsqd.dat is written); safe off the reactor.

    The same bytes as ``json.dumps`` of the document with compact separators
    (``test_metadata_store.py``), built a channel at a time with the GIL
    released every :data:`ENCODE_SLICE` channels, so a node of thousands of
    channels answers its clients while ``nsqd.dat`` is encoded.
    """
    dumps = json.dumps
    topics = []
    count = 0
    for name, paused, channels in sorted(state):
        entries = []
        for channel, channel_paused in sorted(channels):
            entries.append(f'{{"name":{dumps(channel)},"paused":{_BOOL[channel_paused]}}}')
            count += 1
            if count % ENCODE_SLICE == 0:
                time.sleep(0)  # lets a thread waiting for the GIL (the reactor) take it
        topics.append(f'{{"name":{dumps(name)},"paused":{_BOOL[paused]},"channels":[{",".join(entries)}]}}')
    return f'{{"topics":[{",".join(topics)}],"version":{dumps(NSQD_VERSION)}}}'.encode()


def encode(nsqd: NSQD) -> bytes:
    """The metadata document for the node's current topics and channels."""
    return encode_state(snapshot(nsqd))


def decode(data: bytes) -> list[dict[str, Any]]:
    """Topics and channels from a metadata document; invalid names are skipped (logged)."""
    doc = json.loads(data)
    out = []
    for t in doc.get("topics") or []:
        name = t.get("name", "")
        if not isinstance(name, str) or not is_valid_topic_name(name):
            log.warn("NSQ: skipping creation of invalid topic {topic}", topic=name)
            continue
        channels = []
        for c in t.get("channels") or []:
            cname = c.get("name", "")
            if not isinstance(cname, str) or not is_valid_channel_name(cname):
                log.warn("NSQ: skipping creation of invalid channel {channel}", channel=cname)
                continue
            channels.append({"name": cname, "paused": bool(c.get("paused"))})
        out.append({"name": name, "paused": bool(t.get("paused")), "channels": channels})
    return out


def read_file(data_path: str, filename: str = FILENAME) -> bytes | None:
    """Disk thread: the raw metadata, or None when there is none yet."""
    try:
        with open(os.path.join(data_path, filename), "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def encode_deferred(due: dict[str, dict[bytes, float]]) -> bytes:
    """``{"topic:channel": {"<id>": due_unix_ms}}`` for every channel with deferred messages."""
    doc = {name: {i.decode("ascii", "replace"): int(t * 1000) for i, t in ids.items()}
           for name, ids in due.items() if ids}
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def decode_deferred(data: bytes) -> dict[str, dict[bytes, float]]:
    doc = json.loads(data)
    return {name: {i.encode("ascii"): ms / 1000.0 for i, ms in ids.items()}
            for name, ids in doc.items()}


def take_deferred_file(data_path: str) -> bytes | None:
    """Disk thread: read and remove the deferred due times (they are used once)."""
    path = os.path.join(data_path, DEFERRED_FILENAME)
    data = read_file(data_path, DEFERRED_FILENAME)
    if data is not None:
        os.remove(path)
    return data


def write_file(data_path: str, data: bytes, filename: str = FILENAME) -> None:
    """Disk thread: replace the metadata atomically (temp file, fsync, rename, directory fsync)."""
    atomic_write(os.path.join(data_path, filename), data)


def write_state(data_path: str, state: State) -> None:
    """Disk thread: encode a snapshot and write it as ``nsqd.dat``."""
    write_file(data_path, encode_state(state))


#: seconds between attempts to write ``nsqd.dat`` after a failed one
RETRY_INTERVAL = 1.0
#: the longest pause between two writes of ``nsqd.dat`` while changes keep coming
MAX_WRITE_PAUSE = 1.0


class MetadataStore:
    """Keeps ``nsqd.dat`` in step with the node, with at most one write in flight.

    A change schedules a write of the then-current state for the end of the
    reactor turn; changes made while a write is on the disk thread are
    folded into one more write after it. So a storm of creates costs a
    handful of writes, not one per topic, and the reactor only takes the
    snapshot (linear, no sorting or JSON): encoding and the fsync run on
    ``submit`` (the metadata lane). A failure is reported to the node's
    health and the write is tried again every :data:`RETRY_INTERVAL`
    seconds until it succeeds (a full disk that gets room back: health OK
    again without another change).
    """

    def __init__(self, nsqd: NSQD, data_path: str, clock: IReactorTime, submit: Submit) -> None:
        self.nsqd = nsqd
        self.data_path = data_path
        self._clock = clock
        self._submit = submit
        self._scheduled = False
        self._writing = 0
        self._dirty = False
        self._started = 0.0
        #: writes done since start (tests count them)
        self.writes = 0

    def changed(self) -> None:
        if self._writing:
            self._dirty = True
        elif not self._scheduled:
            self._scheduled = True
            self._clock.callLater(0, self._write)

    def _write(self) -> None:
        self._scheduled = False
        if not self._writing:
            self.persist().addErrback(lambda _: None)  # reported to health, retried (_failed)

    def persist(self) -> Deferred[Any]:
        """Write the current state now (at start-up, and at shutdown after any write in flight).

        The Deferred fails as the write did, after the failure reached the
        node's health and a retry was scheduled.
        """
        self._writing += 1
        self._dirty = False
        self._started = self._clock.seconds()
        d = self._submit(write_state, self.data_path, snapshot(self.nsqd))
        d.addCallbacks(self._ok, self._failed)
        d.addBoth(self._written)
        return d

    def _written(self, result: Any) -> Any:
        self.writes += 1
        self._writing -= 1
        if self._dirty and not self._writing:
            # Each write encodes every topic and channel, and the encoding holds the GIL:
            # creating 10,000 topics one request at a time made it quadratic (over 10
            # minutes). The next write waits as long as this one took, so nsqd.dat
            # costs at most half of the CPU however fast the changes come.
            took = min(max(self._clock.seconds() - self._started, 0.0), MAX_WRITE_PAUSE)
            self._scheduled = True
            self._clock.callLater(took, self._write)
        return result

    def _ok(self, _: Any) -> None:
        self.nsqd.set_health("metadata", None)

    def _failed(self, failure: Any) -> Any:
        self.nsqd.set_health("metadata", f"failed to persist metadata - {failure.getErrorMessage()}")
        if not self.nsqd.exiting:
            self._clock.callLater(RETRY_INTERVAL, self.changed)
        return failure
