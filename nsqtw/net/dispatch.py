"""The epoll reactor's events dispatched without Twisted's per-event log context.

Twisted's ``EPollReactor.doPoll`` hands every ready descriptor to
``log.callWithLogger``: it asks the selectable for its ``logPrefix()``,
pushes ``{"system": prefix}`` onto the legacy logging context, calls
``_doReadOrWrite`` inside it, and pops it. That context only labels lines
logged through the legacy ``twisted.python.log`` API during the call;
nsqtw's own lines carry their namespace and do not read it. It cost about
a tenth of the Python time of a connect/SUB/close cycle and a few percent
of every read (``docs/performance.md``, "Connection churn").

:func:`direct_dispatch` gives an ``EPollReactor`` a poll step that calls
``_doReadOrWrite`` directly. What ``callWithLogger`` guaranteed is kept: an
exception escaping ``_doReadOrWrite`` (which already catches and logs what
``doRead``/``doWrite`` raise, and disconnects) is logged with the
selectable's prefix as its system, and never reaches the reactor loop. The
difference: Twisted's own legacy lines logged *during* a read or write (an
"Unhandled Error" caught by ``_doReadOrWrite``) are labelled ``-`` instead
of the connection's prefix. Any other reactor, or an ``EPollReactor``
without the attributes this relies on, is left as it is.

The same poll step waits through a :class:`~nsqtw.net.busypoll.BusyPoll`,
which spins briefly before sleeping while traffic is brisk; its limit is 0
(a plain ``epoll_wait``) unless the daemon sets one (``busy_poll``: nsqd's
``--busy-poll``).
"""

from __future__ import annotations

import errno
from typing import Any

from twisted.python import log as legacy_log

from nsqtw.net.busypoll import BusyPoll

__all__ = ["busy_poll", "direct_dispatch"]


def direct_dispatch(reactor: Any) -> bool:
    """Replace ``reactor``'s poll step (see the module's docstring); True if it was replaced."""
    try:
        from twisted.internet.epollreactor import EPollReactor
    except ImportError:  # not on Linux
        return False
    if type(reactor) is not EPollReactor or getattr(reactor, "_nsqtw_direct_dispatch", False):
        return False
    target: Any = reactor  # typed loosely: this reaches into Twisted's private attributes
    try:
        selectables: dict[int, Any] = target._selectables
        do_read_or_write = target._doReadOrWrite
        poll = BusyPoll(target._poller.poll, 0.0)
    except AttributeError:
        return False

    def do_poll(timeout: float | None) -> None:
        try:
            events = poll(timeout, len(selectables))
        except OSError as e:
            if e.errno == errno.EINTR:
                return
            raise
        get = selectables.get
        for fd, event in events:
            selectable = get(fd)
            if selectable is None:
                continue
            try:
                do_read_or_write(selectable, fd, event)
            except KeyboardInterrupt:
                raise
            except BaseException:
                _log_escaped(selectable)

    target.doIteration = do_poll
    target._nsqtw_direct_dispatch = poll
    return True


def busy_poll(reactor: Any, limit: float) -> bool:
    """Let ``reactor``'s poll step spin up to ``limit`` seconds before it sleeps (0: never).

    Installs the direct poll step first if no listener has yet. False when
    the reactor is not one this works on (its waits are left as they are).
    """
    direct_dispatch(reactor)
    poll = getattr(reactor, "_nsqtw_direct_dispatch", None)
    if not isinstance(poll, BusyPoll):
        return False
    poll.limit = limit
    return True


def _log_escaped(selectable: Any) -> None:
    """What ``callWithLogger`` does with an exception that escaped: log it, labelled."""
    try:
        prefix = selectable.logPrefix()
    except Exception:
        prefix = "(buggy logPrefix method)"
    legacy_log.err(system=prefix)
