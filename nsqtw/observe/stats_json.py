"""``/stats?format=json`` written straight as Go's JSON text, one channel per step.

It walks the node as :func:`~nsqtw.observe.stats.snapshot_steps` does and
gives exactly the bytes of ``go_json(snapshot(...))``, without the dicts in
between: at 1,900 topics x 5 channels x 2 clients, building the snapshot's
dicts, encoding them and freeing them made ``/stats`` half again as slow as
Go nsqd's. Each topic and channel is filled into a template made once from
the same field functions the snapshot uses (``_topic_fields``,
``_channel_fields``), each client comes as its connection's cached text
(``V2Protocol.stats_json``), and each topic is encoded to bytes in its own
step, so the last step only joins them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator
from typing import Any

from nsqtw._go.json import go_dumps
from nsqtw.observe.quantile import empty_result
from nsqtw.observe.stats import (
    _channel_fields,
    _client_stats,
    _topic_e2e,
    _topic_fields,
    chosen_channels,
    chosen_topics,
    node_stats,
    producer_clients,
)

__all__ = ["stats_json_steps"]

#: a client's JSON past this size ends a step (clients may send megabytes of identity)
_BIG_CLIENT = 64 * 1024
#: clients' texts a step takes (about 1.5 ms of cached ones)
_TEXTS_PER_STEP = 1024
#: stand-ins for a template's slots while it is made (no field holds such a number)
_MARK = 8_000_000_000_000_000_000
#: ``empty_result()`` as JSON: a channel or topic whose latency is not tracked
_EMPTY_E2E = go_dumps(empty_result())
#: names nsqd accepts need no escaping in JSON (``nsqtw/names.py``); others go through go_dumps
_PLAIN_NAME = re.compile(r"[.a-zA-Z0-9_#-]*\Z").match


class _Template:
    """``go_dumps`` of what ``fields`` returns, with each of its arguments a slot for JSON text.

    ``fill(*texts)`` equals ``go_dumps(fields(*values))`` when each text is
    the JSON of the value in its place (ints may be passed as they are).
    """

    def __init__(self, fields: Callable[..., dict[str, Any]], slots: int) -> None:
        marks = [str(_MARK + i) for i in range(slots)]
        text = go_dumps(fields(*(_MARK + i for i in range(slots))))
        text = text.replace("{", "{{").replace("}", "}}")
        for i, mark in enumerate(marks):
            # the dict holds only the marks and its own keys, so each mark is there once, as a value
            if text.count(mark) != 1:
                raise ValueError(f"slot {i} of {fields.__name__} is not one value")
            text = text.replace(mark, f"{{{i}}}")
        self.fill = text.format


_TOPIC = _Template(_topic_fields, 8)
_CHANNEL = _Template(_channel_fields, 12)


def _name(name: str) -> str:
    return f'"{name}"' if _PLAIN_NAME(name) is not None else go_dumps(name)


def _client_json(client: Any, topic_filter: str) -> str:
    """A client as Go's JSON text (a V2 connection caches most of it)."""
    stats_json = getattr(client, "stats_json", None)
    if stats_json is not None:
        text: str = stats_json(topic_filter)
        return text
    return go_dumps(_client_stats(client, topic_filter))


def _clients(clients: list[Any], topic_filter: str) -> Generator[None, None, str]:
    """Clients as a JSON array, a step ending after each big one and every
    :data:`_TEXTS_PER_STEP` (one channel may have 15,000 consumers: one step
    for all of them held the reactor 26 ms)."""
    texts = []
    for i, client in enumerate(clients, 1):
        text = _client_json(client, topic_filter)
        texts.append(text)
        if len(text) > _BIG_CLIENT or not i % _TEXTS_PER_STEP:
            yield None
    return "[" + ",".join(texts) + "]"


def _channel_json(channel: Any, clients: str, now: float) -> str:
    counts = channel.stats_counts()
    e2e = _EMPTY_E2E if channel.e2e is None else go_dumps(channel.e2e.result(now))
    return _CHANNEL.fill(_name(channel.name), counts["depth"], counts["backend_depth"], counts["in_flight_count"],
                         counts["deferred_count"], counts["message_count"], counts["requeue_count"],
                         counts["timeout_count"], len(channel.clients), clients,
                         "true" if channel.paused else "false", e2e)


def _topic_json(topic: Any, channels: str, now: float) -> str:
    # _topic_e2e's empty_result, encoded once, where the node keeps no percentiles
    e2e = go_dumps(_topic_e2e(topic, now)) if topic.options.e2e_processing_latency_percentile else _EMPTY_E2E
    return _TOPIC.fill(_name(topic.name), channels, topic.depth(), topic.backend.depth(), topic.message_count,
                       topic.message_bytes, "true" if topic.paused else "false", e2e)


def stats_json_steps(nsqd: Any, topic: str | None = None, channel: str | None = None,
                     include_clients: bool = True, include_mem: bool = True) -> Generator[None, None, bytes]:
    """``go_json(snapshot(nsqd, ...))``, byte for byte, a channel (or a few thousand clients) per step.

    Run in slices (:func:`~nsqtw.observe.stats.run_in_slices`) it has the
    snapshot's consistency: each channel's figures agree with each other, and
    a topic or channel deleted between two steps is left out.
    """
    topic = topic or ""
    now = nsqd.clock.seconds()
    chunks: list[bytes] = []
    topics = producers = None
    chosen = chosen_topics(nsqd, topic)
    if chosen is not None:
        for t in chosen:
            chans = chosen_channels(t, channel or "")
            if chans is None:
                continue
            texts = []
            for c in chans:
                if t.channels.get(c.name) is not c:
                    continue  # deleted between two steps
                clients = (yield from _clients(list(c.clients.values()), topic)) if include_clients else "null"
                texts.append(_channel_json(c, clients, now))
                yield None
            if nsqd.topics.get(t.name) is not t:
                continue
            if chunks:
                chunks.append(b",")
            chunks.append(_topic_json(t, "[" + ",".join(texts) + "]", now).encode("utf-8"))
        topics = _MARK
        if include_clients:
            chosen_producers = yield from producer_clients(nsqd)
            if chosen_producers:
                producers = (yield from _clients(chosen_producers, topic)).encode("utf-8")
    head = go_dumps(node_stats(nsqd, topics, _MARK + 1 if producers else None, include_mem)).encode("utf-8")
    if topics is None:
        return head
    # '"topics":MARK' cannot be inside a JSON string (its quotes would be escaped there)
    before, _, after = head.partition(b'"topics":%d' % _MARK)
    parts = [before, b'"topics":[', *chunks, b"]"]
    if producers:
        middle, _, tail = after.partition(b'"producers":%d' % (_MARK + 1))
        parts += [middle, b'"producers":', producers, tail]
    else:
        parts.append(after)
    return b"".join(parts)
