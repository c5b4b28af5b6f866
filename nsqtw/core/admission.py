"""Publish admission, defined once: whether a publish is taken now, later, or refused.

Three callers publish for someone else: a V2 connection, the HTTP API and
the core's side of a worker's link. Each answers in its own terms (an OK
frame or a fatal ``E_PUB_FAILED``; ``OK`` or 503 ``EXITING``; an ACK record),
but the rule that decides is the same, so it lives here and they only map
its :data:`Outcome` to their answer:

- :data:`PUBLISHED`: queued in memory, answer now;
- :class:`Written`: some went to disk, answer when its Deferred fires
  (a failure there is the caller's failure answer);
- :class:`WaitForRoom`: past the node's bounds of unwritten bytes, nothing
  was accepted; ask again when its Deferred fires (a failure: refused);
- :class:`Failed`: refused now (the node or topic is exiting, or its backend
  cannot take writes), with the text nsqd puts after ``PUB failed``.

The fast path allocates nothing: a publish to memory returns the one
:data:`PUBLISHED` object, no Deferred and no outcome object made.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Final, Literal, Protocol, TypeAlias

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from nsqtw.errors import BackendError, ExitingError, ReplicaError

__all__ = ["PUBLISHED", "Failed", "Outcome", "Published", "Publisher", "WaitForRoom", "Written",
           "admit", "settled"]


class Publisher(Protocol):
    """What admission needs of a node: :class:`~nsqtw.core.nsqd.NSQD`, or a worker's proxy for it."""

    def wait_for_room(self, topic: str) -> Deferred[None] | None: ...

    def publish(self, topic: str, bodies: list[bytes], defer: float = 0.0,
                client: Any = None) -> Deferred[None] | None: ...


class Published(Enum):
    """Queued in memory: answer the publisher now. One member, :data:`PUBLISHED` (an enum, so
    ``outcome is PUBLISHED`` narrows the outcome's type as well as being the fastest test)."""

    PUBLISHED = "PUBLISHED"


#: the one :class:`Published` (compare with ``is``)
PUBLISHED: Final = Published.PUBLISHED


class Written:
    """Accepted, part of it on its way to disk: answer once ``deferred`` fires (see :func:`settled`)."""

    __slots__ = ("deferred",)

    def __init__(self, deferred: Deferred[None]) -> None:
        self.deferred = deferred


class WaitForRoom:
    """Not accepted: past the node's or topic's bound. Call :func:`admit` again once ``room``
    fires (another publisher may have taken the room meanwhile); a failure there is a refusal."""

    __slots__ = ("room",)

    def __init__(self, room: Deferred[None]) -> None:
        self.room = room


class Failed:
    """Refused: ``why`` is the text nsqd puts after ``PUB failed`` (``exiting``, a backend's error)."""

    __slots__ = ("why", "fatal")

    def __init__(self, why: str, fatal: bool = True) -> None:
        self.why = why
        #: nsqd closes the connection after a failed publish; a refusal for want of a replica
        #: (``--replicas=2``) is not the connection's end: the publisher may retry on it
        self.fatal = fatal

    def __repr__(self) -> str:
        return f"Failed({self.why!r})"


Outcome: TypeAlias = Literal[Published.PUBLISHED] | Written | WaitForRoom | Failed


def admit(node: Publisher, topic: str, bodies: list[bytes], defer: float = 0.0,
          client: Any = None) -> Outcome:
    """Publish ``bodies`` to ``topic`` if the node has room for them now.

    ``client``, when given, is the publishing client: it is passed on to
    ``node.publish`` (a worker's node names it to the core) and, once the
    publish is accepted, its ``pub_counts`` (``/stats``'s per-topic
    ``message_count`` of a producer) counts the messages, answered yet or not,
    as nsqd counts them.
    """
    try:
        room = node.wait_for_room(topic)
        if room is not None:
            return WaitForRoom(room)
        written = node.publish(topic, bodies, defer, client)
    except (ExitingError, BackendError) as e:
        return Failed(str(e))
    if client is not None:
        counts: dict[str, int] = client.pub_counts
        counts[topic] = counts.get(topic, 0) + len(bodies)
    return PUBLISHED if written is None else Written(written)


def settled(result: object) -> Literal[Published.PUBLISHED] | Failed:
    """What the result of a :class:`Written`'s or :class:`WaitForRoom`'s Deferred means:
    :data:`PUBLISHED` (or room: ask again), or a :class:`Failed` saying why."""
    if isinstance(result, Failure):
        if result.check(ReplicaError):
            return Failed("no replica", fatal=False)
        return Failed(result.getErrorMessage())
    return PUBLISHED
