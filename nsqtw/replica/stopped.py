"""A clean stop's mark: what lets a node without ``--durable-delivery`` read its own logs back.

Without ``--durable-delivery`` an own log writes no journal as it goes (an
entry per FIN, for a log a crash makes useless: the crash loses what the
queues held in memory, and the replica takes over). A stop (SIGTERM) loses
nothing, so once the node has closed, each own log's journal is written as
one checkpoint (:meth:`~nsqtw.replica.disklog.StandbyLog.save`), then
:data:`STOPPED_FILE` says so; the next start reads it and removes it
(:func:`read_stopped`), and only then reads the own logs back, so that a
replica chosen later still gets the messages of before the restart.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from typing import Any, Final

from twisted.internet.defer import ensureDeferred
from twisted.internet.interfaces import IReactorTime

from nsqtw.interfaces import IDiskExecutor
from nsqtw.log import Logger
from nsqtw.storage.atomic import atomic_write, fsync_dir

__all__ = ["SAVE_TIMEOUT", "STOPPED_FILE", "read_stopped", "save_own_logs"]

#: ``{"incomplete": [...]}``: the topics whose own log missed messages (a write failed), which come
#: back incomplete all the same
STOPPED_FILE: Final = "nsqtw.replica.stopped"
#: seconds a stop waits for those writes (a disk that hangs): then it goes on without the mark
SAVE_TIMEOUT: Final = 10.0

_log = Logger(namespace="nsqtw.replica.stopped")


async def save_own_logs(lane: IDiskExecutor, data_path: str, owns: Iterable[Any], incomplete: Iterable[str],
                        clock: IReactorTime) -> None:
    """Each own log (a ``Standby``) written whole with its journal, then :data:`STOPPED_FILE`. A write
    that fails, or all of them not done within :data:`SAVE_TIMEOUT`, is logged and leaves no such
    file: the next start is as after a crash."""
    try:
        await ensureDeferred(_save(lane, data_path, list(owns), sorted(incomplete))).addTimeout(SAVE_TIMEOUT, clock)
    except Exception as e:  # noqa: BLE001 - a stop goes on
        _log.error("REPLICATION: own logs not written whole at the stop - {error}; the next start begins them"
                   " empty", error=repr(e))


async def _save(lane: IDiskExecutor, data_path: str, owns: list[Any], incomplete: list[str]) -> None:
    for d in [own.disk.save(own.checkpoint()) for own in owns]:
        await d
    data = json.dumps({"incomplete": incomplete}).encode()
    await lane.submit(atomic_write, os.path.join(data_path, STOPPED_FILE), data)


def read_stopped(data_path: str, sync_dir: Callable[[str], None] = fsync_dir) -> set[str] | None:
    """Disk thread: the topics :data:`STOPPED_FILE` names incomplete, None without it (the last run
    did not stop cleanly). The file is removed, and the removal synced to the directory before the
    own logs are read: a crash of this run, a power loss included, must not read as a clean stop."""
    path = os.path.join(data_path, STOPPED_FILE)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    os.remove(path)
    sync_dir(data_path)
    try:
        value = json.loads(data)
        return {str(t) for t in value["incomplete"]}
    except (ValueError, KeyError, TypeError):
        return None
