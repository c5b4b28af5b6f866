"""A channel's messages in flight: put there for one client, taken back by its REQ or a timeout.

A channel keeps each message in flight twice: in its in-flight
:class:`~nsqtw.core.pqueue.TimeoutQueue` by ID, under the deadline its one
timer serves, and in the client's ``owned`` dict (each ID and when it was
sent), so that a disconnect costs O(that client's in-flight) and TOUCH knows
the ``--max-msg-timeout`` cap. These functions do that bookkeeping on the
live dicts for :class:`nsqtw.core.channel.Channel`, which keeps the counts,
the queueing and the logging; FIN's is
:func:`~nsqtw.core.message.end_flight`.
"""

from __future__ import annotations

import random

from nsqtw.core.message import Message, message_ids, start_flight
from nsqtw.core.pqueue import TimeoutQueue
from nsqtw.interfaces import IConsumer


def put_in_flight(msgs: list[Message], client: IConsumer, in_flight: TimeoutQueue, waiting: dict[bytes, Message],
                  owned: dict[bytes, float], now: float) -> tuple[list[Message], int]:
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
    owned.update(dict.fromkeys(ids, now))
    in_flight.push_many(msgs, ids, deadline)
    return msgs, dropped


def all_new(ids: list[bytes], live: dict[bytes, Message], waiting: dict[bytes, Message]) -> bool:
    """No ID twice in the batch, none already in flight (``live``) or deferred (``waiting``): the
    usual case, told by set operations in C instead of a Python loop per message."""
    return len(set(ids)) == len(ids) and live.keys().isdisjoint(ids) and waiting.keys().isdisjoint(ids)


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


def take_back(live: dict[bytes, Message], owned: dict[bytes, float], client: IConsumer,
              reqs: list[tuple[bytes, float]],
              ) -> tuple[list[tuple[bytes, str]], list[Message], list[tuple[Message, float]]]:
    """A run of REQs from ``client``: each message out of ``live`` and ``owned``, its client cleared.

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
        owned.pop(msg_id, None)
        msg.client = None
        client.message_requeued()
        if delay > 0:
            later.append((msg, delay))
        else:
            again.append(msg)
    return failed, again, later


def time_out(expired: list[Message], owned: dict[int, dict[bytes, float]], clients: dict[int, IConsumer]) -> None:
    """Messages whose deadline passed, already out of the in-flight queue, leave their clients:
    out of the client's dict in ``owned``, their client cleared, and a client still subscribed
    (in ``clients``) told."""
    for m in expired:
        client = m.client
        if client is not None:
            mine = owned.get(client.client_id)
            if mine is not None:
                mine.pop(m.id, None)
        m.client = None
        if client is not None and client.client_id in clients:
            client.message_timed_out()
