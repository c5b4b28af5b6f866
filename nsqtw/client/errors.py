"""What the client library raises or errbacks with."""

from __future__ import annotations

__all__ = ["ConnectionClosed", "NSQClientError", "NSQErrorResponse", "NoConnection"]


class NSQClientError(Exception):
    """Base of the client's errors."""


class NSQErrorResponse(NSQClientError):
    """nsqd answered a command with an error frame (``E_BAD_TOPIC ...``); ``code`` is its first word."""

    def __init__(self, data: bytes) -> None:
        text = data.decode("utf-8", "replace")
        super().__init__(text)
        self.code = text.split(" ", 1)[0]
        self.text = text


class ConnectionClosed(NSQClientError):
    """The connection ended before nsqd answered (the command may or may not have taken effect)."""


class NoConnection(NSQClientError):
    """No connection to any nsqd was ready in time."""
