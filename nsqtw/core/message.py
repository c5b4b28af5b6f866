"""One NSQ message, its wire frame and nsqd's disk encoding."""

from __future__ import annotations

import struct
from typing import Any

MSG_ID_LENGTH = 16
#: timestamp (8) + attempts (2) + id (16): the smallest valid encoded message.
MIN_VALID_MSG_LENGTH = 8 + 2 + MSG_ID_LENGTH

FRAME_TYPE_RESPONSE = 0
FRAME_TYPE_ERROR = 1
FRAME_TYPE_MESSAGE = 2

_HEADER = struct.Struct(">qH")
_FRAME_HEADER = struct.Struct(">ii")
_MSG_FRAME_HEADER = struct.Struct(">iiqH")


class Message:
    """A message as a channel holds it.

    Only atoms hang off a queued message (ints and bytes), and the delivery
    fields are reset when it leaves flight, so queues hold no reference
    cycles for the garbage collector to chase.
    """

    __slots__ = ("id", "body", "timestamp", "attempts", "deferred",
                 "client", "deadline", "delivered_at")

    def __init__(self, id: bytes, body: bytes, timestamp: int, attempts: int = 0,
                 deferred: float = 0.0) -> None:
        self.id = id
        self.body = body
        #: nanoseconds since the Unix epoch when it was published
        self.timestamp = timestamp
        self.attempts = attempts
        #: seconds to wait before first delivery (DPUB), 0 for none
        self.deferred = deferred
        #: while in flight: the consumer it was sent to, its timeout and send time
        self.client: Any = None
        self.deadline = 0.0
        self.delivered_at = 0.0

    def copy(self) -> Message:
        """A copy for another channel: same id, body and timestamp."""
        return Message(self.id, self.body, self.timestamp, self.attempts, self.deferred)

    def encode(self) -> bytes:
        """nsqd's encoding, used on disk and inside a MESSAGE frame."""
        return _HEADER.pack(self.timestamp, self.attempts) + self.id + self.body

    def frame(self) -> bytes:
        """The complete MESSAGE frame (size, type, encoded message)."""
        body = self.body
        return (_MSG_FRAME_HEADER.pack(30 + len(body), FRAME_TYPE_MESSAGE,
                                       self.timestamp, self.attempts)
                + self.id + body)

    def __repr__(self) -> str:
        return f"<Message {self.id.decode('ascii', 'replace')} attempts={self.attempts}>"


def decode_message(data: bytes) -> Message:
    """Parse nsqd's encoding; raises ValueError when it is too short."""
    if len(data) < MIN_VALID_MSG_LENGTH:
        raise ValueError(f"invalid message buffer size ({len(data)})")
    timestamp, attempts = _HEADER.unpack_from(data)
    return Message(bytes(data[10:26]), bytes(data[26:]), timestamp, attempts)


def frame(frame_type: int, data: bytes) -> bytes:
    """A response or error frame."""
    return _FRAME_HEADER.pack(len(data) + 4, frame_type) + data
