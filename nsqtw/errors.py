"""nsqd's client error codes as exceptions.

The V2 protocol turns an :class:`NSQError` into an error frame
(``CODE description``) and closes the connection when it is fatal, as nsqd
does with its ``FatalClientErr``/``ClientErr`` pair.
"""

from __future__ import annotations


class NSQError(Exception):
    """An error a client caused; ``str()`` is the exact error frame body."""

    def __init__(self, code: str, description: str = "", fatal: bool = True) -> None:
        self.code = code
        self.description = description
        self.fatal = fatal
        super().__init__(code, description)

    def __str__(self) -> str:
        if self.description:
            return f"{self.code} {self.description}"
        return self.code

    def frame_body(self) -> bytes:
        return str(self).encode("utf-8", "surrogateescape")


def fatal(code: str, description: str = "") -> NSQError:
    return NSQError(code, description, fatal=True)


def nonfatal(code: str, description: str = "") -> NSQError:
    return NSQError(code, description, fatal=False)


class BackendError(Exception):
    """A backend queue cannot accept writes (closed, disk full, unwritable)."""


class ExitingError(Exception):
    """The topic or channel is being deleted or closed."""

    def __str__(self) -> str:
        return "exiting"


class NotInFlightError(Exception):
    """FIN/REQ/TOUCH for a message that is not in flight (for this client)."""

    def __init__(self, text: str = "ID not in flight") -> None:
        super().__init__(text)


class ReplicaError(Exception):
    """``--replicas=2``: no replica acknowledged a publish within ``--replica-wait``.

    Not the publisher's fault and not the node's end: the publish is refused
    with a non-fatal ``E_PUB_FAILED`` (the message stays queued on this node).
    """
