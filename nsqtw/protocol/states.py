"""A V2 connection's two states: nsqd's client state and where its input stands."""

from __future__ import annotations

from enum import Enum

#: nsqd's state of a client: defined with the commands that change it, in the core
from nsqtw.core.commands import ClientState

__all__ = ["ClientState", "Input"]


class Input(Enum):
    """Where the connection's input stands: whether the next command may run now.

    ``RUNNING`` to ``WAITING`` when a command waits on a Deferred (a
    publish's disk write or room, the auth server) and back when it fires;
    ``RUNNING`` to ``YIELDED`` when this client's slice of the reactor is
    used up and back on the next turn; any of them to ``CLOSED``, the end.
    Only while ``RUNNING`` is anything read and run.
    """

    RUNNING = 1
    WAITING = 2
    YIELDED = 3
    CLOSED = 4
