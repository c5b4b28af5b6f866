"""``/stats?format=json`` written straight as Go's JSON text, one channel per step.

It walks the node as :func:`~nsqtw.observe.stats.snapshot_steps` does and
gives exactly the bytes of ``go_json(snapshot(...))``, without the dicts in
between: at 1,900 topics x 5 channels x 2 clients, building the snapshot's
dicts, encoding them and freeing them made ``/stats`` half again as slow as
Go nsqd's. Each topic and channel is filled into a template made once from
the same field functions the snapshot uses (``_topic_fields``,
``_channel_fields``), each client comes as its connection's cached text
(``V2Protocol.stats_json``), and the text is encoded in pieces of about
32 KiB as it is written (:class:`_Body`), so the last step only joins them
and no level (clients, channel, topic) is copied whole.
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
#: a piece of the answer is encoded once its texts reach this many characters: a block the C
#: library serves from its heap, below the 128 KiB past which the daemons have it map pages of
#: its own for each block (``nsqtw/heap.py``), fault them in and unmap them when freed
_PIECE_CHARS = 32 * 1024
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
    ``head(*texts)`` and ``tail(*texts)`` are that text before and after the
    slot ``around`` (its own text is not used): a channel's clients and a
    topic's channels are written between them, never copied into one string.
    """

    def __init__(self, fields: Callable[..., dict[str, Any]], slots: int, around: int = 0) -> None:
        marks = [str(_MARK + i) for i in range(slots)]
        text = go_dumps(fields(*(_MARK + i for i in range(slots))))
        text = text.replace("{", "{{").replace("}", "}}")
        for i, mark in enumerate(marks):
            # the dict holds only the marks and its own keys, so each mark is there once, as a value
            if text.count(mark) != 1:
                raise ValueError(f"slot {i} of {fields.__name__} is not one value")
            text = text.replace(mark, f"{{{i}}}")
        self.fill = text.format
        # '{i}' is only the slot: the text's own braces are doubled
        head, _, tail = text.partition(f"{{{around}}}")
        self.head = head.format
        self.tail = tail.format


_TOPIC = _Template(_topic_fields, 8, around=1)
_CHANNEL = _Template(_channel_fields, 12, around=9)


def _name(name: str) -> str:
    return f'"{name}"' if _PLAIN_NAME(name) is not None else go_dumps(name)


class _Body:
    """The answer as it is written: texts gathered, then encoded a piece of about
    :data:`_PIECE_CHARS` at a time, the pieces joined once at the end.

    At 15,000 consumers the answer is 6 MB. Made as the clients' array, then
    the channel's text, the topic's, its bytes and the whole answer, each a
    6 MB block of fresh pages, that copying took a third of a daemon's
    ``/stats`` and left it slower than Go nsqd's.
    """

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self._texts: list[str] = []
        self._chars = 0

    def write(self, texts: list[str]) -> None:
        chars = sum(map(len, texts))
        if self._chars + chars < _PIECE_CHARS:  # a topic of a few channels: the texts as they are
            self._texts += texts
            self._chars += chars
            return
        for text in texts:
            self._texts.append(text)
            self._chars += len(text)
            if self._chars >= _PIECE_CHARS:
                self._encode()

    def _encode(self) -> None:
        self.pieces.append("".join(self._texts).encode("utf-8"))
        self._texts = []
        self._chars = 0

    def end(self) -> list[bytes]:
        """The pieces, the last texts encoded too."""
        self._encode()
        return self.pieces


def _client_json(client: Any, topic_filter: str) -> str:
    """A client as Go's JSON text (a V2 connection, or a worker's client in the core, caches it)."""
    stats_json = getattr(client, "stats_json", None)
    if stats_json is not None:
        text: str = stats_json(topic_filter)
        return text
    return go_dumps(_client_stats(client, topic_filter))


def _clients(clients: list[Any], topic_filter: str) -> Generator[None, None, list[str]]:
    """Clients as the inside of a JSON array (their texts and commas), in pieces of about
    :data:`_PIECE_CHARS`; a step ends after each big one and every :data:`_TEXTS_PER_STEP` (one
    channel may have 15,000 consumers: one step for all of them held the reactor 26 ms)."""
    pieces: list[str] = []
    texts: list[str] = []
    chars = 0
    for i, client in enumerate(clients, 1):
        text = _client_json(client, topic_filter)
        texts.append(text)
        chars += len(text)
        if chars >= _PIECE_CHARS:
            pieces.append(",".join(texts))
            texts = [""]  # the next piece starts with the comma before its first text
            chars = 0
        if len(text) > _BIG_CLIENT or not i % _TEXTS_PER_STEP:
            yield None
    if len(texts) > 1 or not pieces:
        pieces.append(",".join(texts))
    return pieces


def _channel_figures(channel: Any, clients: str, now: float) -> tuple[Any, ...]:
    """A channel's fields as the :data:`_CHANNEL` template's texts."""
    counts = channel.stats_counts()
    e2e = _EMPTY_E2E if channel.e2e is None else go_dumps(channel.e2e.result(now))
    return (_name(channel.name), counts["depth"], counts["backend_depth"], counts["in_flight_count"],
            counts["deferred_count"], counts["message_count"], counts["requeue_count"],
            counts["timeout_count"], len(channel.clients), clients, "true" if channel.paused else "false", e2e)


def _topic_figures(topic: Any, now: float) -> tuple[Any, ...]:
    """A topic's fields as the :data:`_TOPIC` template's texts (its channels' slot left empty)."""
    # _topic_e2e's empty_result, encoded once, where the node keeps no percentiles
    e2e = go_dumps(_topic_e2e(topic, now)) if topic.options.e2e_processing_latency_percentile else _EMPTY_E2E
    return (_name(topic.name), "", topic.depth(), topic.backend.depth(), topic.message_count,
            topic.message_bytes, "true" if topic.paused else "false", e2e)


def stats_json_steps(nsqd: Any, topic: str | None = None, channel: str | None = None,
                     include_clients: bool = True, include_mem: bool = True) -> Generator[None, None, bytes]:
    """``go_json(snapshot(nsqd, ...))``, byte for byte, a channel (or a few thousand clients) per step.

    Run in slices (:func:`~nsqtw.observe.stats.run_in_slices`) it has the
    snapshot's consistency: each channel's figures agree with each other, and
    a topic or channel deleted between two steps is left out. A channel's
    figures are read after its clients' texts and a topic's after its
    channels' (as the snapshot reads them), so a topic's texts are kept
    aside until its end, then written to the answer (:class:`_Body`).
    """
    topic = topic or ""
    now = nsqd.clock.seconds()
    body = _Body()
    replication = getattr(nsqd, "replication", None)
    topics = producers = None
    chosen = chosen_topics(nsqd, topic)
    if chosen is not None:
        topics = _MARK
        comma = ""
        for t in chosen:
            chans = chosen_channels(t, channel or "")
            if chans is None:
                continue
            # the topic's text: its head (only its name), its channels', then its tail
            texts = [comma, _TOPIC.head(_name(t.name)), "["]
            first = len(texts)
            for c in chans:
                if t.channels.get(c.name) is not c:
                    continue  # deleted between two steps
                if len(texts) > first:
                    texts.append(",")
                clients = (yield from _clients(list(c.clients.values()), topic)) if include_clients else None
                if clients is None:
                    texts.append(_CHANNEL.fill(*_channel_figures(c, "null", now)))
                elif len(clients) == 1:
                    texts.append(_CHANNEL.fill(*_channel_figures(c, f"[{clients[0]}]", now)))
                else:  # thousands of clients: their pieces are not copied into the channel's text
                    figures = _channel_figures(c, "", now)
                    texts += (_CHANNEL.head(*figures), "[", *clients, "]", _CHANNEL.tail(*figures))
                yield None
            if nsqd.topics.get(t.name) is not t:
                continue
            tail = _TOPIC.tail(*_topic_figures(t, now))
            if replication is not None and not t.ephemeral:  # --replicas=2: where its copies are
                tail = f'{tail[:-1]},"replica":{go_dumps(replication.topic_stats(t.name))}}}'
            texts += ("]", tail)
            body.write(texts)
            comma = ","
        if include_clients:
            chosen_producers = yield from producer_clients(nsqd)
            if chosen_producers:
                producers = "".join((yield from _clients(chosen_producers, topic)))
    node = node_stats(nsqd, topics, None if producers is None else _MARK + 1, include_mem)
    if replication is not None:
        node.update(replication.node_stats())
    head = go_dumps(node)
    if topics is None:
        return head.encode("utf-8")
    # '"topics":MARK' cannot be inside a JSON string (its quotes would be escaped there)
    before, _, after = head.partition(f'"topics":{_MARK}')
    if producers is not None:
        middle, _, end = after.partition(f'"producers":{_MARK + 1}')
        after = f'{middle}"producers":[{producers}]{end}'
    return b"".join([f'{before}"topics":['.encode(), *body.end(), f"]{after}".encode()])
