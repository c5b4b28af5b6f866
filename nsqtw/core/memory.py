"""Backend queues that keep no files: the ephemeral one, and the in-memory one."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from twisted.internet.defer import Deferred, succeed
from zope.interface import implementer

from nsqtw.errors import BackendError
from nsqtw.interfaces import IBackendQueue


@implementer(IBackendQueue)
class EphemeralBackend:
    """What ``#ephemeral`` topics and channels overflow into: nothing.

    nsqd drops the messages that do not fit in memory; so do we.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def put(self, data: bytes) -> None:
        return None

    def put_many(self, records: Sequence[bytes]) -> None:
        return None

    def written(self) -> Deferred[None]:
        return succeed(None)

    def backlog(self) -> int:
        return 0

    def backlog_bytes(self) -> int:
        return 0

    def read(self, max_count: int) -> list[bytes]:
        return []

    def set_readable_callback(self, callback: Callable[[], None]) -> None:
        return None

    def depth(self) -> int:
        return 0

    def empty(self) -> Deferred[None]:
        return succeed(None)

    def delete(self) -> Deferred[None]:
        return succeed(None)

    def close(self) -> Deferred[None]:
        return succeed(None)

    def health(self) -> str | None:
        return None

    def watch_health(self, listener: Callable[[object, str | None], None]) -> None:
        pass  # memory never fails


@implementer(IBackendQueue)
class MemoryBackend(EphemeralBackend):
    """An unbounded in-memory queue of records (tests, and runs without a disk).

    Writes are done at once, as the ephemeral backend's: only keeping and
    handing back the records differs.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._records: deque[bytes] = deque()
        self._closed = False

    def put(self, data: bytes) -> None:
        if self._closed:
            raise BackendError("exiting")
        self._records.append(data)

    def put_many(self, records: Sequence[bytes]) -> None:
        if self._closed:
            raise BackendError("exiting")
        self._records.extend(records)

    def read(self, max_count: int) -> list[bytes]:
        records = self._records
        n = min(max_count, len(records))
        return [records.popleft() for _ in range(n)]

    def depth(self) -> int:
        return len(self._records)

    def empty(self) -> Deferred[None]:
        self._records.clear()
        return succeed(None)

    def delete(self) -> Deferred[None]:
        self._records.clear()
        self._closed = True
        return succeed(None)

    def close(self) -> Deferred[None]:
        self._closed = True
        return succeed(None)
