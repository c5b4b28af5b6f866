"""Work gathered during one reactor turn, done once at the turn's end.

A side that writes what several events of one turn gathered (the replica
link's records, from every publisher read in that turn) wants a single call
once they have all been read, and no more. ``callLater(0, flush)`` gives
that on any reactor, but it is a timed call: a ``DelayedCall`` on the
reactor's heap, then a whole extra reactor iteration (an ``epoll_wait`` with
a zero timeout, the timed calls run) before the flush. On a replicated
one-message publish that extra iteration was a fifth of the owner's Python.

:class:`ITurnEnd` is the seam: a reactor that provides it runs the calls
given to :meth:`~ITurnEnd.callAtTurnEnd` right after it dispatched the
events of the turn, in the same iteration (nsqtw's reactor,
:class:`~nsqtw.net.epollreactor.NSQTWReactor`). :func:`turn_end_caller`
picks it where the clock provides it and falls back to ``callLater(0)``
everywhere else (other reactors, ``task.Clock`` in tests): the same order of
events, one iteration later.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.interfaces import IReactorTime
from zope.interface import Interface

__all__ = ["ITurnEnd", "turn_end_caller"]


class ITurnEnd(Interface):
    """A reactor that runs calls at the end of the turn they were asked in."""

    def callAtTurnEnd(f: Callable[[], object]) -> None:
        """Call ``f()`` once the events of this turn are dispatched, before the reactor waits
        again (asked outside a dispatch, by a timed call: before the next wait; asked by such a
        call itself: after it, in the same pass). An exception ``f`` raises is logged; the other
        calls still run."""


def turn_end_caller(clock: IReactorTime) -> Callable[[Callable[[], object]], None]:
    """How to run a call at the end of this turn on ``clock``: its :meth:`ITurnEnd.callAtTurnEnd`,
    else ``callLater(0, f)``."""
    if ITurnEnd.providedBy(clock):
        at_end: Callable[[Callable[[], object]], None] = clock.callAtTurnEnd
        return at_end

    def later(f: Callable[[], object]) -> None:
        clock.callLater(0, f)

    return later
