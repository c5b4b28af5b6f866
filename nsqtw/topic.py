"""A topic: its queue and its channels; the pump gives every channel a copy."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IReactorTime

from nsqtw.channel import Channel
from nsqtw.errors import BackendError, ExitingError
from nsqtw.interfaces import IBackendQueue
from nsqtw.log import Logger
from nsqtw.message import Message, decode_message
from nsqtw.names import is_ephemeral
from nsqtw.pump import Pump

if TYPE_CHECKING:
    from nsqtw.nsqd import NSQD

#: messages copied to the channels in one reactor turn before yielding
TOPIC_BATCH = 8192
#: past this many records waiting for the disk thread, publishers wait for the write
BACKLOG_LIMIT = 10000


class Topic:
    """Messages published to one topic, before they are copied to channels.

    While a topic has no channel, or is paused, messages wait here (memory up
    to ``--mem-queue-size``, then the backend), as in nsqd.
    """

    log = Logger()

    def __init__(self, nsqd: NSQD, name: str, backend: IBackendQueue, clock: IReactorTime,
                 on_delete: Callable[[Topic], None]) -> None:
        self.nsqd = nsqd
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.backend = backend
        self._clock = clock
        self._on_delete = on_delete
        self.channels: dict[str, Channel] = {}
        self.memory: deque[Message] = deque()
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.message_bytes = 0
        self._pump = Pump(clock, self._distribute, f"TOPIC({name})")
        self._pump.start()
        backend.set_readable_callback(self._pump.wake)

    def __repr__(self) -> str:
        return f"<Topic {self.name}>"

    def depth(self) -> int:
        return len(self.memory) + self.backend.depth()

    # -- publishing -------------------------------------------------------

    def put_messages(self, msgs: list[Message]) -> Deferred[None] | None:
        """Queue published messages; raises ExitingError or BackendError.

        Returns None when the publisher can be answered now: the messages
        are in memory, or handed to the disk thread. Returns the backend's
        ``written()`` when the publisher must wait for the write: with
        ``--sync-every=1`` (every acknowledged message survives kill -9), or
        when the disk is behind by more than BACKLOG_LIMIT records (so a
        publisher faster than the disk is slowed down to its pace).
        """
        if self.exiting:
            raise ExitingError()
        memory = self.memory
        room = self.nsqd.options.mem_queue_size - len(memory)
        rest = msgs
        if room > 0:
            memory.extend(msgs[:room])
            rest = msgs[room:]
        if rest:
            try:
                self.backend.put_many([m.encode() for m in rest])
            except BackendError as e:
                self.log.error("TOPIC({topic}): failed to write message to backend - {error}",
                               topic=self.name, error=e)
                # what went to memory stays: nsqd accepts a batch whole or not at all
                for _ in range(len(msgs) - len(rest)):
                    memory.pop()
                raise
        self.message_count += len(msgs)
        self.message_bytes += sum(len(m.body) for m in msgs)
        if self.channels:  # else nothing to do until get_channel() wakes the pump
            self._pump.wake()
        if rest and (self.nsqd.options.sync_every <= 1 or self.backend.backlog() > BACKLOG_LIMIT):
            return self.backend.written()
        return None

    def _distribute(self) -> bool:
        channels = list(self.channels.values())
        if not channels or self.paused or self.exiting:
            return False
        msgs: list[Message] = []
        if self.backend.depth():
            for data in self.backend.read(TOPIC_BATCH):
                try:
                    msgs.append(decode_message(data))
                except ValueError as e:
                    self.log.error("TOPIC({topic}): failed to decode message - {error}",
                                   topic=self.name, error=e)
        memory = self.memory
        k = min(TOPIC_BATCH - len(msgs), len(memory))
        if k == len(memory):
            msgs.extend(memory)
            memory.clear()
        elif k > 0:
            pop = memory.popleft
            msgs.extend(pop() for _ in range(k))
        if not msgs:
            return False
        first, others = channels[0], channels[1:]
        for channel in others:
            self._put(channel, [m.copy() for m in msgs])
        self._put(first, msgs)
        return bool(memory) or self.backend.depth() > 0

    def _put(self, channel: Channel, msgs: list[Message]) -> None:
        try:
            channel.put_many(msgs)
        except (ExitingError, BackendError) as e:
            self.log.error("TOPIC({topic}): failed to put msg(s) to channel({channel}) - {error}",
                           topic=self.name, channel=channel.name, error=e)

    # -- channels ---------------------------------------------------------

    def get_channel(self, name: str) -> Channel:
        """The channel of that name, created (and announced) if new."""
        channel = self.channels.get(name)
        if channel is None:
            if self.exiting:
                raise ExitingError()
            channel = self.nsqd.make_channel(self, name)
            self.channels[name] = channel
            self.log.info("TOPIC({topic}): new channel({channel})", topic=self.name, channel=name)
            self.nsqd.channel_created(self, channel)
            self._pump.wake()
        return channel

    def delete_channel(self, name: str) -> Deferred[None]:
        """Remove a channel and its data; raises KeyError when there is none."""
        channel = self.channels.pop(name)
        self.log.info("TOPIC({topic}): deleting channel {channel}", topic=self.name, channel=name)
        d = channel.delete()
        self.nsqd.channel_deleted(self, channel)
        if not self.channels and self.ephemeral and not self.exiting:
            self._on_delete(self)
        return d

    def _channel_wants_delete(self, channel: Channel) -> None:
        # an ephemeral channel lost its last client
        if self.channels.get(channel.name) is channel:
            self.delete_channel(channel.name).addErrback(
                lambda f: self.log.failure("TOPIC({topic}): delete channel failed", f, topic=self.name))

    # -- administration ---------------------------------------------------

    def pause(self) -> None:
        self.paused = True
        self.nsqd.metadata_changed()

    def unpause(self) -> None:
        self.paused = False
        self.nsqd.metadata_changed()
        self._pump.wake()

    def empty(self) -> Deferred[None]:
        self.memory.clear()
        return self.backend.empty()

    def _stop(self) -> None:
        self.exiting = True
        self._pump.stop()

    def close(self) -> Deferred[Any]:
        """Graceful stop: every message goes to its backend, every backend closes."""
        self._stop()
        ds = [c.close() for c in self.channels.values()]
        try:
            if self.memory:
                self.backend.put_many([m.encode() for m in self.memory])
                self.memory.clear()
        except BackendError as e:
            self.log.error("TOPIC({topic}): failed to flush - {error}", topic=self.name, error=e)
        ds.append(self.backend.close())
        return DeferredList(ds, consumeErrors=True)

    def delete(self) -> Deferred[Any]:
        """Remove the topic, its channels and their data."""
        self._stop()
        ds = []
        for name in list(self.channels):
            channel = self.channels.pop(name)
            ds.append(channel.delete())
            self.nsqd.channel_deleted(self, channel)
        self.memory.clear()
        ds.append(self.backend.delete())
        return DeferredList(ds, consumeErrors=True)
