"""``nsqd.dat``: which topics and channels exist and which are paused.

The same JSON Go nsqd writes (``{"topics":[{"name","paused","channels":[…]}],
"version"}``), so a data directory moves between nsqd and nsqtw either way.
Ephemeral topics and channels are never written, as in nsqd.
"""

from __future__ import annotations

import json
import os
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


def encode(nsqd: NSQD) -> bytes:
    """The metadata document for the node's current topics and channels."""
    topics = []
    for name in sorted(nsqd.topics):
        topic = nsqd.topics[name]
        if topic.ephemeral:
            continue
        channels = [{"name": c.name, "paused": c.paused}
                    for c in sorted(topic.channels.values(), key=lambda c: c.name) if not c.ephemeral]
        topics.append({"name": topic.name, "paused": topic.paused, "channels": channels})
    doc = {"topics": topics, "version": NSQD_VERSION}
    return json.dumps(doc, separators=(",", ":")).encode()


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


class MetadataStore:
    """Keeps ``nsqd.dat`` in step with the node, one write per reactor turn.

    Any number of changes in one turn cost one write of the latest state;
    writes run in order on ``submit`` (a one-thread executor) and a failure
    is reported to the node's health.
    """

    def __init__(self, nsqd: NSQD, data_path: str, clock: IReactorTime, submit: Submit) -> None:
        self.nsqd = nsqd
        self.data_path = data_path
        self._clock = clock
        self._submit = submit
        self._scheduled = False

    def changed(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._clock.callLater(0, self._write)

    def _write(self) -> None:
        self._scheduled = False
        self.persist()

    def persist(self) -> Deferred[Any]:
        """Write the current state now (also used at shutdown)."""
        data = encode(self.nsqd)
        d = self._submit(write_file, self.data_path, data)
        d.addCallbacks(self._ok, self._failed)
        return d

    def _ok(self, _: Any) -> None:
        self.nsqd.set_health("metadata", None)

    def _failed(self, failure: Any) -> None:
        self.nsqd.set_health("metadata", f"failed to persist metadata - {failure.getErrorMessage()}")
