"""A message as a consumer receives it, with the commands that answer it."""

from __future__ import annotations

from typing import Protocol

__all__ = ["Message", "MessageOwner"]


class MessageOwner(Protocol):
    """What a message needs of the connection that delivered it (the consumer's side of it)."""

    address: str

    def finish(self, msg: Message) -> None: ...

    def requeue(self, msg: Message, delay: float | None, backoff: bool) -> None: ...

    def touch(self, msg: Message) -> None: ...


class Message:
    """One delivered message: ``id``, ``body``, ``timestamp`` (ns), ``attempts``.

    The consumer FINs it when the handler returns (or its Deferred fires) and
    REQs it when the handler raises (or its Deferred fails), unless the
    handler answered it itself or called :meth:`disable_auto_response`.
    Answering twice does nothing; answering after the connection closed does
    nothing either (nsqd redelivers it after its timeout).
    """

    __slots__ = ("id", "body", "timestamp", "attempts", "_conn", "_responded", "_auto")

    def __init__(self, id: bytes, body: bytes, timestamp: int, attempts: int,
                 conn: MessageOwner) -> None:
        self.id = id
        self.body = body
        self.timestamp = timestamp
        self.attempts = attempts
        self._conn = conn
        self._responded = False
        self._auto = True

    @property
    def nsqd_address(self) -> str:
        """The ``host:port`` of the nsqd this message came from."""
        return self._conn.address

    def disable_auto_response(self) -> None:
        """The handler will FIN or REQ this message itself, later (go-nsq's ``DisableAutoResponse``)."""
        self._auto = False

    def is_auto_response_disabled(self) -> bool:
        return not self._auto

    def has_responded(self) -> bool:
        return self._responded

    def finish(self) -> None:
        """FIN: processed, nsqd forgets it."""
        if self._responded:
            return
        self._responded = True
        self._conn.finish(self)

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """REQ: give it back for redelivery after ``delay`` seconds.

        ``delay=None`` is go-nsq's default: ``default_requeue_delay`` times
        the attempts so far, at most ``max_requeue_delay``. With ``backoff``
        the consumer slows down (see :class:`~nsqtw.client.Consumer`).
        """
        if self._responded:
            return
        self._responded = True
        self._conn.requeue(self, delay, backoff)

    def touch(self) -> None:
        """TOUCH: reset nsqd's timeout for this message (it keeps waiting for FIN/REQ)."""
        if not self._responded:
            self._conn.touch(self)

    def __repr__(self) -> str:
        return f"<Message {self.id.decode('ascii', 'replace')} attempts={self.attempts}>"
