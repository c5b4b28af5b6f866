"""Channels without clients share their topic's messages instead of each holding a copy.

A topic hands every batch to every channel. A channel nobody reads only
keeps its copy: a pointer in its memory queue, put there by a loop over
all the channels (:func:`nsqtw.core.handoff.put_in_memory`). At a few
hundred channels that loop, not the publish, set the pace of one-message
PUBs (about half a microsecond a channel on a cache-cold object), and a
node with thousands of idle channels held a pointer per message per
channel.

Here such a channel is *parked*: the topic appends each batch once to a
shared log, and the parked channel's share is the log from where it
parked. Its depth and its ``message_count`` count that share; the first
thing that needs its messages as its own (a client subscribing, an
empty, a flush at stop, a delete, a hand-off the log cannot take) calls
:meth:`Parking.unpark`, which appends the share to the channel's memory
queue in order, as the loop would have. The log keeps only what the
oldest parked channel still shares.

A parked channel never holds more than ``--mem-queue-size`` in memory,
as before: it parks with the room its memory queue has, and the topic
unparks it before a batch that would not fit (:meth:`Parking.full_for`),
so that batch takes the usual way and its overflow reaches the
channel's backend. A full channel is not parked again until it has room.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable
from itertools import count, islice
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from nsqtw.core.message import Message

__all__ = ["Parkable", "Parking"]


class Parkable(Protocol):
    """What the parking needs of a channel (``nsqtw.core.channel.Channel``, which imports this module)."""

    def may_park(self) -> bool:
        """Whether its copies may wait in the log now (no client, not closing, not journaled)."""

    def room(self) -> int:
        """How many more messages its memory queue takes."""

    def take_share(self, msgs: Iterable[Message], n: int) -> None:
        """Its ``n`` shared messages, as its own queued messages from now on."""

    def share_dropped(self, n: int) -> None:
        """Its ``n`` shared messages are dropped (an empty), though they were given to it."""


C = TypeVar("C", bound=Parkable)


class Parking(Generic[C]):
    """One topic's shared log and the channels parked on it (see the module's docstring)."""

    def __init__(self) -> None:
        #: the messages some parked channel still shares, oldest first
        self._log: deque[Message] = deque()
        #: the sequence number of ``_log[0]`` (every message appended gets the next one)
        self._base = 0
        #: parked channel -> the sequence number it parked at; insertion order is park order,
        #: so the first entry shares the most
        self._parked: dict[C, int] = {}
        #: (the sequence number past which it is full, tie-break, channel, its park sequence)
        self._limits: list[tuple[int, int, C, int]] = []
        self._order = count()
        #: the topic's other channels: the hand-off reaches them one by one
        self._active: dict[C, None] = {}
        #: channels to park at the next batch (parking mid-hand-off would reorder their copies)
        self._candidates: dict[C, None] = {}

    @property
    def end(self) -> int:
        return self._base + len(self._log)

    def __len__(self) -> int:
        """How many channels are parked."""
        return len(self._parked)

    def is_parked(self, channel: C) -> bool:
        return channel in self._parked

    def takes_whole(self, n: int) -> bool:
        """Whether a batch of ``n`` plain messages reaches every channel of the topic by
        :meth:`append` alone: each is parked, none waits to be, none would be full for it.
        (A stale limit of a channel unparked since only makes this say no.)"""
        limits = self._limits
        return (bool(self._parked) and not self._active and not self._candidates
                and not (limits and limits[0][0] < self.end + n))

    def active(self) -> list[C]:
        """The channels not parked: those a batch's hand-off has to reach one by one."""
        return list(self._active)

    def join(self, channel: C) -> None:
        """A new channel of the topic (parked at the next batch if it may)."""
        self._active[channel] = None
        self._candidates[channel] = None

    def leave(self, channel: C) -> None:
        """``channel`` is deleted: its share is dropped, not given to it."""
        self.drop_share(channel)
        self._active.pop(channel, None)

    def share(self, channel: C) -> int:
        """How many of the log's messages are ``channel``'s (0 when it is not parked)."""
        at = self._parked.get(channel)
        return 0 if at is None else self.end - at

    def want(self, channel: C) -> None:
        """``channel`` has no client now: park it at the start of the topic's next batch."""
        self._candidates[channel] = None

    def park_candidates(self) -> None:
        """Park the candidates that still may: no client, not closing, room in memory.

        The topic calls this between hand-offs only, so a channel parks
        after it had every batch before, in order.
        """
        if not self._candidates:
            return
        candidates, self._candidates = self._candidates, {}
        end = self.end
        for channel in candidates:
            if channel not in self._active or not channel.may_park():
                continue
            room = channel.room()
            if room <= 0:
                continue
            del self._active[channel]
            self._parked[channel] = end
            heapq.heappush(self._limits, (end + room, next(self._order), channel, end))

    def full_for(self, n: int) -> None:
        """Unpark the channels that a batch of ``n`` more would overfill: the topic gives them
        that batch the usual way."""
        limits = self._limits
        parked = self._parked
        until = self.end + n
        while limits and limits[0][0] < until:
            _, _, channel, at = heapq.heappop(limits)
            if parked.get(channel) == at:  # (else an older entry of a channel unparked since)
                self.unpark(channel)

    def append(self, msgs: list[Message]) -> None:
        """A batch every parked channel takes (none of them is full for it: :meth:`full_for`)."""
        if self._parked:
            self._log.extend(msgs)
        else:
            self._base += len(msgs)

    def unpark(self, channel: C) -> None:
        """Give ``channel`` its share as its own queued messages; it is no longer parked.

        (A candidate stays one: :meth:`park_candidates` asks it whether it may park.)
        """
        at = self._parked.pop(channel, None)
        if at is None:
            return
        self._active[channel] = None
        share = self.end - at
        if share:
            channel.take_share(islice(self._log, at - self._base, None), share)
        self._trim()

    def drop_share(self, channel: C) -> None:
        """Unpark ``channel`` without giving it its share (emptied, deleted); it still counts them."""
        self._candidates.pop(channel, None)
        at = self._parked.pop(channel, None)
        if at is not None:
            self._active[channel] = None
            channel.share_dropped(self.end - at)
            self._trim()

    def unpark_all(self) -> None:
        """Unpark every parked channel (a batch the log cannot carry: they take it the usual way).
        They park again at the next batch, as they may then."""
        for channel in list(self._parked):
            self.unpark(channel)
            self._candidates[channel] = None

    def _trim(self) -> None:
        log = self._log
        if not self._parked:
            self._base += len(log)
            log.clear()
            self._limits.clear()
            return
        oldest = next(iter(self._parked.values()))
        for _ in range(oldest - self._base):
            log.popleft()
        self._base = oldest
        if len(self._limits) > 2 * len(self._parked) + 64:  # entries of channels unparked since
            parked = self._parked
            self._limits = [e for e in self._limits if parked.get(e[2]) == e[3]]
            heapq.heapify(self._limits)
