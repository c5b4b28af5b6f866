"""nsqtw's reactor: Twisted's epoll reactor with a leaner poll step that can spin before it sleeps.

:class:`NSQTWReactor` is an ``EPollReactor`` that overrides the poll step
(``doIteration``), the method a reactor implementation provides. It is
installed the way Twisted installs any reactor, before anything imports
``twisted.internet.reactor``: by each daemon's tap when no reactor is
installed yet (:func:`nsqtw.net.reactor.install_for_daemon`), or by name,
``twistd --reactor=nsqtw`` (the plugin in ``twisted/plugins/nsqtw_reactor.py``
calls :func:`install`). Linux only, as epoll is.

Two changes from ``EPollReactor.doPoll``:

- **No legacy log context per event.** Twisted hands every ready
  descriptor to ``log.callWithLogger``: it asks the selectable for its
  ``logPrefix()``, pushes ``{"system": prefix}`` onto the legacy logging
  context, dispatches inside it, and pops it. That context only labels
  lines logged through the legacy ``twisted.python.log`` API during the
  call; nsqtw's own lines carry their namespace and do not read it. It cost
  about a tenth of the Python time of a connect/SUB/close cycle and a few
  percent of every read. What ``callWithLogger`` guaranteed is kept: an
  exception escaping the dispatch (which already catches and logs what
  ``doRead``/``doWrite`` raise, and disconnects) is logged with the
  selectable's prefix as its system, and never reaches the reactor loop.
  The difference: Twisted's own legacy lines logged *during* a read or
  write (an "Unhandled Error" it caught) are labelled ``-`` instead of the
  connection's prefix.
- **The wait goes through** :class:`~nsqtw.net.busypoll.BusyPoll`
  (``busy_poll``), whose limit is 0, a plain ``epoll_wait``, unless the
  daemon sets one (nsqd's ``--busy-poll``, off by default).

And one addition: it provides :class:`~nsqtw.net.turn.ITurnEnd`, calls run
right after a turn's events are dispatched (the writes a turn gathered),
without the timed call and the extra iteration of a ``callLater(0)``; a
call those calls ask for runs in the same pass too (a few rounds at most),
not in an iteration of its own.

The reactor's private state it reads (the descriptor table, the epoll
object, the per-descriptor dispatch) is read once, at construction,
through :mod:`nsqtw.net.twisted_privates`.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any

from twisted.internet.epollreactor import EPollReactor
from twisted.python import log as legacy_log
from zope.interface import implementer

from nsqtw.log import Logger
from nsqtw.net.busypoll import BusyPoll
from nsqtw.net.turn import ITurnEnd
from nsqtw.net.twisted_privates import epoll_poller, epoll_ready_dispatcher, epoll_selectables

__all__ = ["NSQTWReactor", "TURN_END_ROUNDS", "install"]

#: rounds of calls at a turn's end run in one pass (calls asked by the calls of the round before);
#: what is asked after the last waits for the next iteration, as a call asked before the wait does
TURN_END_ROUNDS = 4


@implementer(ITurnEnd)
class NSQTWReactor(EPollReactor):
    """An epoll reactor whose poll step dispatches directly and waits through :class:`BusyPoll`,
    and runs calls at the end of a turn (:class:`~nsqtw.net.turn.ITurnEnd`)."""

    _turn_log = Logger()

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        #: the wait; nsqd sets its ``limit`` from ``--busy-poll`` (0: a plain ``epoll_wait``)
        self.busy_poll = BusyPoll(epoll_poller(self).poll, 0.0)
        self._nsqtw_selectables = epoll_selectables(self)
        self._nsqtw_dispatch = epoll_ready_dispatcher(self)
        self._turn_end: list[Callable[[], object]] = []

    def callAtTurnEnd(self, f: Callable[[], object]) -> None:
        self._turn_end.append(f)

    def _run_turn_end(self) -> None:
        """The calls asked this turn; then those they asked for, in the same pass (the owner's
        closing of a turn's records asks for its links' flushes), for at most
        :data:`TURN_END_ROUNDS` rounds: a call that keeps asking again waits for the next turn."""
        for _ in range(TURN_END_ROUNDS):
            calls, self._turn_end = self._turn_end, []
            for f in calls:
                try:
                    f()
                except Exception:
                    self._turn_log.failure("call at the end of a reactor turn failed")
            if not self._turn_end:
                return

    def doPoll(self, timeout: float | None) -> None:
        """Wait for events (at most ``timeout`` seconds; None: until one comes), dispatch them, then
        run the calls they asked for at the turn's end.

        Calls asked before the wait (by a timed call) run instead of it: the reactor then works
        out its timeout again, as they may have asked for timed calls of their own.
        """
        if self._turn_end:
            self._run_turn_end()
            return
        selectables = self._nsqtw_selectables
        try:
            events = self.busy_poll(timeout, len(selectables))
        except OSError as e:
            if e.errno == errno.EINTR:
                return
            raise
        dispatch = self._nsqtw_dispatch
        get = selectables.get
        for fd, event in events:
            selectable = get(fd)
            if selectable is None:
                continue
            try:
                dispatch(selectable, fd, event)
            except KeyboardInterrupt:
                raise
            except BaseException:
                _log_escaped(selectable)
        if self._turn_end:
            self._run_turn_end()

    doIteration = doPoll


def _log_escaped(selectable: Any) -> None:
    """What ``callWithLogger`` does with an exception that escaped: log it, labelled."""
    try:
        prefix = selectable.logPrefix()
    except Exception:
        prefix = "(buggy logPrefix method)"
    legacy_log.err(system=prefix)


def install() -> None:
    """Install :class:`NSQTWReactor` as the reactor (``twistd --reactor=nsqtw``, the taps)."""
    from twisted.internet.main import installReactor

    installReactor(NSQTWReactor())
