"""A channel's messages in flight: put there for one client, taken back by its REQ or a timeout.

A channel keeps each message in flight in its in-flight
:class:`~nsqtw.core.pqueue.TimeoutQueue` by ID, under the deadline its one
timer serves, and remembers what it sent each client in a :class:`Sent`:
the IDs of each delivery, so that a disconnect costs O(that client's
in-flight), and when a TOUCHed message was sent, for the
``--max-msg-timeout`` cap. These functions do that bookkeeping on the live
dicts for :class:`nsqtw.core.channel.Channel`, which keeps the counts, the
queueing and the logging; FIN's is :func:`~nsqtw.core.message.end_flight`.
"""

from __future__ import annotations

import random

from nsqtw.core.message import Message, message_ids, start_flight
from nsqtw.core.pqueue import TimeoutQueue
from nsqtw.interfaces import IConsumer

#: a client's :class:`Sent` looks for deliveries with nothing left in flight once it holds this
#: many IDs more than twice those it kept at its last look
SENT_SLACK = 4096


class Sent:
    """What a channel sent one client: each delivery's IDs, as sent, and when TOUCHed ones were sent.

    Nothing is taken out as a message leaves flight: a FIN, a REQ and a
    timeout cost nothing here (a per-client dict of IDs cost two dict
    operations a message, and the resizes of a dict of thousands: about a
    tenth of the read path). An ID counts only while the channel's ``live``
    dict holds its message with this client as the owner, which every
    reader checks. Once the IDs held pass twice those kept at the last look
    (plus :data:`SENT_SLACK`), the deliveries with nothing in ``live`` any
    more are dropped, a set operation in C each, so memory follows the
    client's in-flight count and a message costs O(1) here.

    When a message was sent (the ``--max-msg-timeout`` cap of TOUCH) is its
    deadline less the client's ``msg_timeout`` until it is first TOUCHed;
    from then on it is kept in ``touched`` until the ID is sent again.
    """

    __slots__ = ("_sent", "_held", "_limit", "_touched")

    _sent: list[list[bytes]]
    _held: int
    _limit: int
    _touched: dict[bytes, float]

    def __init__(self) -> None:
        self.clear()

    def add(self, ids: list[bytes], live: dict[bytes, Message]) -> None:
        """A delivery of ``ids`` (the list is kept: the caller does not change it)."""
        touched = self._touched
        if touched:
            for mid in ids:
                touched.pop(mid, None)  # sent again: the earlier sending no longer counts
        self._sent.append(ids)
        self._held += len(ids)
        if self._held > self._limit:
            keys = live.keys()
            self._sent = [ids for ids in self._sent if not keys.isdisjoint(ids)]
            self._held = sum(map(len, self._sent))
            self._limit = 2 * self._held + SENT_SLACK
            if touched:
                self._touched = {mid: at for mid, at in touched.items() if mid in live}

    def in_flight(self, live: dict[bytes, Message], client: IConsumer) -> list[Message]:
        """Its messages still in flight with ``client``, in the order sent, each once."""
        out: list[Message] = []
        seen: set[bytes] = set()
        for ids in self._sent:
            for mid in ids:
                m = live.get(mid)
                if m is not None and m.client is client and mid not in seen:
                    seen.add(mid)
                    out.append(m)
        return out

    def sent_at(self, msg: Message, client: IConsumer) -> float:
        """When ``msg``, in flight with ``client``, was sent to it; called on TOUCH, before the
        new deadline is set."""
        at = self._touched.get(msg.id)
        if at is None:
            at = self._touched[msg.id] = msg.deadline - client.msg_timeout
        return at

    def clear(self) -> None:
        """Nothing in flight with the client (new, or the channel was emptied or flushed)."""
        self._sent = []
        self._held = 0
        self._limit = SENT_SLACK
        self._touched = {}


def put_in_flight(msgs: list[Message], client: IConsumer, in_flight: TimeoutQueue, waiting: dict[bytes, Message],
                  sent: Sent, now: float) -> tuple[list[Message], int]:
    """Put a batch taken from the queue for ``client`` in flight, until its ``msg_timeout``.

    Returns the messages to send it and how many duplicates were left out
    (:func:`drop_duplicates`; ``waiting`` holds the channel's deferred
    messages by ID). Those sampled out (:func:`sample`) are neither.
    """
    # each message's ID is sliced out of its data here, once (see Message)
    ids = message_ids(msgs)
    dropped = 0
    if not all_new(ids, in_flight.live, waiting):
        n = len(msgs)
        msgs, ids = drop_duplicates(msgs, ids, in_flight.live, waiting)
        dropped = n - len(msgs)
    if client.sample_rate:
        msgs, ids = sample(msgs, ids, client.sample_rate)
    deadline = now + client.msg_timeout
    start_flight(msgs, ids, client, deadline)
    in_flight.push_many(msgs, ids, deadline)
    if msgs:
        sent.add(ids, in_flight.live)
    return msgs, dropped


def all_new(ids: list[bytes], live: dict[bytes, Message], waiting: dict[bytes, Message]) -> bool:
    """No ID twice in the batch, none already in flight (``live``) or deferred (``waiting``): the
    usual case, told by set operations in C instead of a Python loop per message. (``isdisjoint``
    of a list looks every ID up even in an empty dict: a channel seldom has deferred messages.)"""
    return (len(set(ids)) == len(ids) and live.keys().isdisjoint(ids)
            and (not waiting or waiting.keys().isdisjoint(ids)))


def drop_duplicates(msgs: list[Message], ids: list[bytes], live: dict[bytes, Message],
                    waiting: dict[bytes, Message]) -> tuple[list[Message], list[bytes]]:
    """Leave out copies of messages whose ID is already in flight (``live``) or deferred (``waiting``).

    At-least-once allows a channel two copies of one ID: after a kill -9
    the topic → channel hand-off not yet committed is replayed. Putting
    the second in flight would replace the first (whose FIN would then
    fail with "ID not in flight"); the copy is dropped instead, the one
    already owned by a client or waiting for its time stands for both.
    """
    out = []
    out_ids = []
    seen: set[bytes] = set()
    for m, mid in zip(msgs, ids, strict=True):
        if mid in live or mid in waiting or mid in seen:
            continue
        seen.add(mid)
        out.append(m)
        out_ids.append(mid)
    return out, out_ids


def sample(msgs: list[Message], ids: list[bytes], rate: int) -> tuple[list[Message], list[bytes]]:
    """The messages (and their IDs) a client with IDENTIFY ``sample_rate`` gets; nsqd drops the others.

    nsqd sends a message when a draw from 0..99 is at most the rate, and the
    rest are gone for this channel (neither in flight nor requeued).
    """
    draw = random.randrange
    kept = [(m, i) for m, i in zip(msgs, ids, strict=True) if draw(100) <= rate]
    return [m for m, _ in kept], [i for _, i in kept]


def take_back(live: dict[bytes, Message], client: IConsumer, reqs: list[tuple[bytes, float]],
              ) -> tuple[list[tuple[bytes, str]], list[Message], list[tuple[Message, float]]]:
    """A run of REQs from ``client``: each message out of ``live``, its client cleared.

    Returns the IDs that could not be taken back, each with nsqd's reason;
    the messages to queue again now; and those to defer, each with its
    delay. The in-flight queue's count is left to the caller, once per run.
    """
    failed: list[tuple[bytes, str]] = []
    again: list[Message] = []
    later: list[tuple[Message, float]] = []
    for msg_id, delay in reqs:
        msg = live.get(msg_id)
        if msg is None or msg.client is not client:
            failed.append((msg_id, "ID not in flight" if msg is None else "client does not own message"))
            continue
        del live[msg_id]
        msg.client = None
        client.message_requeued()
        if delay > 0:
            later.append((msg, delay))
        else:
            again.append(msg)
    return failed, again, later


def time_out(expired: list[Message], clients: dict[int, IConsumer]) -> None:
    """Messages whose deadline passed, already out of the in-flight queue, leave their clients:
    their client cleared, and a client still subscribed (in ``clients``) told."""
    for m in expired:
        client = m.client
        m.client = None
        if client is not None and client.client_id in clients:
            client.message_timed_out()
