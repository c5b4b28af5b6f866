"""A consumer's commands on its channel, defined once: SUB, RDY, FIN, REQ and TOUCH.

Two callers run them for a client: a V2 connection in one process, and
the core's side of a worker's link for a worker's client (its
``RemoteClient``). The checks of the command line itself (the client's
state, its arguments, AUTH) are the connection's and stay there; what the
command does to the node, and the rules the node applies, are here, and
each caller only maps the outcome to its answer (an error frame, or a
record back to the worker):

- :func:`subscribe` / :func:`subscribed`: the channel, made if new, with
  the client added; :data:`SUBSCRIBED`, :data:`TOO_MANY` past
  ``--max-channel-consumers``, or a :class:`Refused` saying why;
- :func:`ready`: RDY's bound (``--max-rdy-count``) and the channel's wake;
- :func:`finish`, :func:`requeue` (:func:`requeue_delay`: REQ's timeout
  bound), :func:`touch`: the IDs that could not be acknowledged, each with
  why (not in flight, not this client's, the channel exiting).

The client's side of this is :class:`Consumer`: the state, ready count and
counts a channel reads and updates, kept alike for both kinds of client.
FIN and REQ take runs of IDs, as the channel does: one call per run, no
allocation per message beyond the channel's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum, IntEnum
from typing import Any, Final, Literal, Protocol, TypeAlias

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from nsqtw.errors import BackendError, ExitingError, NotInFlightError, fatal
from nsqtw.log import Logger

__all__ = ["SUBSCRIBED", "TOO_MANY", "ClientState", "Consumer", "Failures", "Refused", "SubOutcome", "Subscriber",
           "Subscription", "finish", "ready", "requeue", "requeue_delay", "subscribe", "subscribed",
           "touch"]

log = Logger()


class ClientState(IntEnum):
    """nsqd's state of a client, as ``/stats`` shows it: what the client may ask for next."""

    INIT = 0
    DISCONNECTED = 1
    CONNECTED = 2
    SUBSCRIBED = 3
    CLOSING = 4


_SUBSCRIBED_STATE = ClientState.SUBSCRIBED

#: what failed, per message ID: (ID, why), why's ``str()`` the text after ``FIN <id> failed``
Failures: TypeAlias = Sequence[tuple[bytes, object]]

_NONE: Final[tuple[()]] = ()


class Subscription(Protocol):
    """The channel a client subscribed to, as its commands use it: the core's
    :class:`~nsqtw.core.channel.Channel`, or a worker's proxy for it."""

    def remove_client(self, client: Any) -> None: ...

    def wake(self) -> None: ...

    def finish_many(self, client: Any, msg_ids: list[bytes]) -> Failures:
        """FIN each ID; the ones that failed now, with why (a remote one reports them later)."""

    def requeue_many(self, client: Any, reqs: list[tuple[bytes, float]]) -> Failures: ...

    def touch(self, client: Any, msg_id: bytes, timeout: float) -> None: ...


class Subscriber(Protocol):
    """What :func:`subscribe` needs of a node: :class:`~nsqtw.core.nsqd.NSQD`, or a worker's proxy."""

    def subscribe(self, topic: str, channel: str, client: Any) -> Subscription | Deferred[Subscription]:
        """Add ``client`` to the channel (made if new); raises ValueError past
        ``--max-channel-consumers`` (or fails the Deferred with it)."""


class Consumer:
    """A subscriber's state on the node's side: a V2 connection's, and a worker's client's in its
    core. One definition, so the channel and ``/stats`` find the same fields on both.

    Each class keeps its own ``deliver`` and ``ready_capacity`` (how it sends, when it may);
    the callbacks here only keep the counts.
    """

    state: ClientState
    channel: Subscription | None
    ready_count: int
    in_flight_count: int
    message_count: int
    finish_count: int
    requeue_count: int
    #: messages published by this client, per topic (``/stats``'s producer ``message_count``)
    pub_counts: dict[str, int]
    #: TOUCH's new timeout, seconds
    msg_timeout: float

    def init_consumer(self, state: ClientState, msg_timeout: float) -> None:
        self.state = state
        self.channel = None
        self.ready_count = 0
        self.in_flight_count = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts = {}
        self.msg_timeout = msg_timeout

    def subscribed(self) -> None:
        """Called once the client joined its channel (SUB answered OK)."""

    # -- IConsumer callbacks that only count ---------------------------------

    def count_delivered(self, count: int) -> None:
        self.in_flight_count += count
        self.message_count += count

    def messages_finished(self, count: int) -> None:
        self.in_flight_count -= count
        self.finish_count += count

    def message_requeued(self) -> None:
        self.in_flight_count -= 1
        self.requeue_count += 1

    def message_timed_out(self) -> None:
        self.in_flight_count -= 1
        if self.channel is not None:
            self.channel.wake()

    def in_flight_emptied(self) -> None:
        self.in_flight_count = 0


# -- SUB ------------------------------------------------------------------


class Subscribed(Enum):
    """The outcomes of a SUB that need no more than their name (enum members: compare with ``is``)."""

    SUBSCRIBED = "SUBSCRIBED"
    TOO_MANY = "TOO_MANY"


#: the client joined the channel: answer OK
SUBSCRIBED: Final = Subscribed.SUBSCRIBED
#: refused: the channel has ``--max-channel-consumers`` consumers already
TOO_MANY: Final = Subscribed.TOO_MANY


class Refused:
    """The node refused the SUB (its topic or channel is exiting, or could not be made): ``why``
    says so."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why

    def __repr__(self) -> str:
        return f"Refused({self.why!r})"


SubOutcome: TypeAlias = Literal[Subscribed.SUBSCRIBED, Subscribed.TOO_MANY] | Refused


def subscribe(node: Subscriber, topic: str, channel: str,
              client: Consumer) -> SubOutcome | Deferred[Subscription]:
    """``client``'s SUB of ``topic``/``channel`` (names already checked): its outcome, or, where
    the node answers later (a worker's), the Deferred whose result :func:`subscribed` maps."""
    try:
        joined = node.subscribe(topic, channel, client)
    except ValueError:
        return TOO_MANY
    except (ExitingError, BackendError, OSError) as e:  # stopping, or its storage cannot be made
        return Refused(str(e))
    if isinstance(joined, Deferred):
        return joined
    return _join(client, joined)


def subscribed(client: Consumer, result: Subscription | Failure) -> SubOutcome:
    """The outcome of a SUB the node answered later, from its Deferred's result."""
    if isinstance(result, Failure):
        if result.check(ValueError):
            return TOO_MANY
        return Refused(result.getErrorMessage())
    return _join(client, result)


def _join(client: Consumer, channel: Subscription) -> Literal[Subscribed.SUBSCRIBED]:
    client.channel = channel
    client.state = _SUBSCRIBED_STATE
    client.subscribed()
    return SUBSCRIBED


# -- RDY ------------------------------------------------------------------


def ready(client: Consumer, count: int, max_rdy: int) -> None:
    """RDY ``count``: the node's bound (fatal ``E_INVALID`` past ``--max-rdy-count``), then the
    channel learns the client's new capacity."""
    if count > max_rdy:
        raise fatal("E_INVALID", f"RDY count {count} out of range 0-{max_rdy}")
    client.ready_count = count
    channel = client.channel
    if channel is not None:
        channel.wake()


# -- FIN, REQ, TOUCH ----------------------------------------------------------


def finish(client: Consumer, msg_ids: list[bytes]) -> Failures:
    """FIN of a run of IDs: the ones that failed (not in flight, not this client's), with why."""
    channel = client.channel
    if channel is None:
        return _NONE
    return channel.finish_many(client, msg_ids)


def requeue_delay(client: object, ms: int, max_req_timeout: float) -> float:
    """REQ's timeout in seconds: past ``--max-req-timeout`` it is logged and clamped, as nsqd does."""
    delay = ms / 1000.0
    if delay > max_req_timeout:
        log.info("PROTOCOL(V2): [{client}] REQ timeout {timeout} out of range 0-{max}. Setting to {max}",
                 client=client, timeout=ms, max=int(max_req_timeout * 1000))
        return max_req_timeout
    return delay


def requeue(client: Consumer, reqs: list[tuple[bytes, float]]) -> Failures:
    """REQ of a run of (ID, delay in seconds): the ones that failed, with why. A backend that
    cannot take them is the last ID's failure."""
    channel = client.channel
    if channel is None:
        return _NONE
    try:
        return channel.requeue_many(client, reqs)
    except BackendError as e:
        return [(reqs[-1][0], e)]


def touch(client: Consumer, msg_id: bytes) -> Failures:
    """TOUCH: the message's timeout starts again (``client.msg_timeout``); failed if not in flight."""
    channel = client.channel
    if channel is None:
        return _NONE
    try:
        channel.touch(client, msg_id, client.msg_timeout)
    except NotInFlightError as e:
        return [(msg_id, e)]
    return _NONE
