"""The replica's side: the copies it holds for each owner's topic, and the takeover.

A :class:`Standby` holds one owner's one topic: every message copied and
not yet finished on all of the owner's channels, in arrival order, and per
channel which it finished. A message goes once every channel that owes it
finished it; a channel owes the messages that arrived after it was made
(and, when the owner said its topic had a backlog then, those before too).
So a standby holds what the owner has not finished: a long-running pair
keeps no growing copy.

At the takeover each message is handed, with its ID, timestamp and body,
into every local channel of that name that owes it (to the local topic when
the owner had no channel), a slice per reactor turn.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Final

from twisted.internet.defer import Deferred

from nsqtw.core.message import Message
from nsqtw.log import Logger
from nsqtw.replica.records import PubMessage

__all__ = ["Standby", "TAKEOVER_SLICE"]

#: messages handed in per reactor turn at a takeover
TAKEOVER_SLICE: Final = 4096


class _Debt:
    """One of the owner's channels: from which arrival on it owes messages, and what it finished."""

    __slots__ = ("start", "finished")

    def __init__(self, start: int) -> None:
        self.start = start
        self.finished: set[bytes] = set()


class Standby:
    """One owner's topic, held in this process until the owner finishes it or is lost."""

    log = Logger()

    def __init__(self, owner: str, topic: str) -> None:
        self.owner = owner
        self.topic = topic
        #: ID -> (arrival number, message), in arrival order
        self.messages: dict[bytes, tuple[int, PubMessage]] = {}
        self.channels: dict[str, _Debt] = {}
        self.arrivals = 0
        self.bytes = 0
        self.taken_over = False

    def add(self, messages: list[PubMessage]) -> None:
        held = self.messages
        for m in messages:
            self.arrivals += 1
            held[m.id] = (self.arrivals, m)
            self.bytes += len(m.body)

    def channel(self, name: str, backlog: bool) -> None:
        if name not in self.channels:
            self.channels[name] = _Debt(0 if backlog else self.arrivals + 1)

    def channel_gone(self, name: str) -> None:
        if self.channels.pop(name, None) is not None:
            self._sweep(list(self.messages))

    def finish(self, channel: str, ids: list[bytes]) -> None:
        debt = self.channels.get(channel)
        if debt is None:  # its CHANNEL record went with a link that failed: it owes everything
            debt = self.channels[channel] = _Debt(0)
        held = self.messages
        finished = debt.finished
        for i in ids:
            if i in held:
                finished.add(i)
        self._sweep(ids)

    def empty(self, channel: str | None) -> None:
        """The owner emptied a channel: every message so far is done there. (A topic's empty
        drops only what no channel was given yet, which the standby cannot tell: kept.)"""
        if channel is None:
            return
        debt = self.channels.get(channel)
        if debt is not None:
            debt.start = self.arrivals + 1
            debt.finished.clear()
            self._sweep(list(self.messages))

    def _owed_by(self, mid: bytes, arrival: int) -> list[str]:
        return [name for name, d in self.channels.items() if d.start <= arrival and mid not in d.finished]

    def _sweep(self, ids: list[bytes]) -> None:
        held = self.messages
        if not self.channels:
            return
        for i in ids:
            entry = held.get(i)
            if entry is not None and not self._owed_by(i, entry[0]):
                del held[i]
                self.bytes -= len(entry[1].body)
                for d in self.channels.values():
                    d.finished.discard(i)

    def __len__(self) -> int:
        return len(self.messages)

    # -- the takeover ------------------------------------------------------------------------------

    def take_over(self, nsqd: Any) -> Deferred[int]:
        """Hand every message still owed into this node's own topic and channels; fires with
        how many messages were handed in."""
        self.taken_over = True
        done: Deferred[int] = Deferred()
        steps = self._hand_in(nsqd)

        def turn() -> None:
            try:
                for _ in range(TAKEOVER_SLICE):
                    next(steps)
            except StopIteration as stop:
                done.callback(stop.value)
                return
            except Exception:  # noqa: BLE001 - the node closing: what was handed in stays
                self.log.failure("REPLICATION({owner}): takeover of {topic} failed", owner=self.owner,
                                 topic=self.topic)
                done.errback()
                return
            nsqd.clock.callLater(0, turn)

        turn()
        return done

    def _hand_in(self, nsqd: Any) -> Generator[None, None, int]:
        topic = nsqd.get_topic(self.topic)
        count = 0
        items = list(self.messages.values())
        self.messages.clear()
        for arrival, m in items:
            if self.channels:
                for name in self._owed_by(m.id, arrival):
                    topic.get_channel(name).put_many([Message(m.id + m.body, m.timestamp)])
            else:
                topic.publish([int(m.id, 16)], [m.body], m.timestamp, 0.0)
            count += 1
            self.bytes -= len(m.body)
            yield None
        return count
