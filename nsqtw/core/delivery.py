"""nsqd's own delivery modes: buffered (the default) and commit-after-write (``--sync-every=1``).

A delivery mode answers a topic's and a channel's questions in plain
values (:class:`~nsqtw.interfaces.ITopicDelivery`,
:class:`~nsqtw.interfaces.IChannelDelivery`); the pumps themselves live in
:class:`~nsqtw.core.topic.Topic` and :class:`~nsqtw.core.channel.Channel`,
which never ask which mode they are in. The third mode,
``--durable-delivery``, needs journals and lives with them in
:mod:`nsqtw.storage.durable`.

- **Buffered** (:class:`PlainTopicDelivery`): nsqd's behaviour. Messages wait in
  memory up to ``--mem-queue-size``, then in the backend; publishers are
  answered at once.
- **Commit-after-write** (:class:`CommitAfterWriteTopicDelivery`, chosen by
  ``--sync-every=1`` over disk queues): publishers wait for the write, and
  the topic's read position passes a batch only once every channel has
  written its copy, so a kill -9 loses nothing acknowledged between the two.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from twisted.internet.defer import Deferred, succeed
from zope.interface import implementer

from nsqtw.interfaces import IChannelDelivery, IDeliveryMode, IDurableBackendQueue, ITopicDelivery, Position

if TYPE_CHECKING:
    from nsqtw.core.channel import Channel
    from nsqtw.core.message import Message
    from nsqtw.core.topic import Topic

__all__ = ["BufferedDelivery", "CommitAfterWriteTopicDelivery", "PlainChannelDelivery", "PlainTopicDelivery"]

#: no due times kept by the mode
_NONE: Mapping[bytes, float] = MappingProxyType({})


@implementer(IDeliveryMode)
class BufferedDelivery:
    """nsqd's own mode; with ``sync_every <= 1`` over disk queues, commit-after-write."""

    def __init__(self, sync_every: int) -> None:
        self.sync_every = sync_every

    def for_topic(self, topic: Topic) -> ITopicDelivery:
        wait = self.sync_every <= 1
        mem_queue_size: int = topic.options.mem_queue_size
        if wait and IDurableBackendQueue.providedBy(topic.backend):
            return CommitAfterWriteTopicDelivery(mem_queue_size)
        return PlainTopicDelivery(mem_queue_size, wait_for_write=wait)

    def for_channel(self, channel: Channel) -> IChannelDelivery:
        return PlainChannelDelivery(channel)


@implementer(ITopicDelivery)
class PlainTopicDelivery:
    """Memory first, then the backend; the read position moves as the topic reads."""

    commit_after_handoff = False

    def __init__(self, mem_queue_size: int, wait_for_write: bool) -> None:
        self.mem_queue_size = mem_queue_size
        self.wait_for_write = wait_for_write

    def published(self, delayed: list[Message], written: Deferred[None]) -> Deferred[None]:
        return written

    def dues(self) -> Mapping[bytes, float]:
        return _NONE

    def committed(self, due_ids: list[bytes]) -> None:
        pass

    def health(self) -> str | None:
        return None

    def close(self) -> Deferred[object]:
        return succeed(None)

    def delete(self) -> Deferred[object]:
        return succeed(None)


class CommitAfterWriteTopicDelivery(PlainTopicDelivery):
    """``--sync-every=1``: publishers wait for the write; the topic's read position passes a
    batch only once every channel wrote it."""

    commit_after_handoff = True

    def __init__(self, mem_queue_size: int) -> None:
        super().__init__(mem_queue_size, wait_for_write=True)


@implementer(IChannelDelivery)
class PlainChannelDelivery:
    """Backend first, then memory; nothing to record beyond the channel's own queues."""

    journaled = False
    handoff_floor: Position | None = None

    def __init__(self, channel: Channel) -> None:
        self.mem_queue_size: int = channel.options_mem_queue_size
        self._backend = channel.backend

    def restored(self) -> list[tuple[Message, float]]:
        return []

    def refuses_handoff(self) -> bool:
        return False

    def handed_off(self, pos: Position) -> None:
        pass

    def synced(self) -> Deferred[None]:
        return succeed(None)

    def may_take(self) -> bool:
        return True

    def read(self, n: int) -> list[bytes]:
        return self._backend.read(n)

    def owns(self, msg_id: bytes) -> bool:
        return False

    def taking(self, msgs: list[Message]) -> None:
        pass

    def deferred(self, msg: Message, when: float) -> None:
        pass

    def finished(self, msg_ids: list[bytes]) -> None:
        pass

    def emptied(self) -> None:
        pass

    def health(self) -> str | None:
        return None

    def flushed(self) -> None:
        pass

    def close(self, keep: bool) -> Deferred[None]:
        return succeed(None)

    def delete(self) -> None:
        pass
