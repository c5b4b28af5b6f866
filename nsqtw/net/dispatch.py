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
"""

from __future__ import annotations

import errno
from typing import Any

from twisted.python import log as legacy_log

__all__ = ["direct_dispatch"]


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
        poll = target._poller.poll
        selectables: dict[int, Any] = target._selectables
        do_read_or_write = target._doReadOrWrite
    except AttributeError:
        return False

    def do_poll(timeout: float | None) -> None:
        try:
            events = poll(-1 if timeout is None else timeout, len(selectables))
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
    target._nsqtw_direct_dispatch = True
    return True


def _log_escaped(selectable: Any) -> None:
    """What ``callWithLogger`` does with an exception that escaped: log it, labelled."""
    try:
        prefix = selectable.logPrefix()
    except Exception:
        prefix = "(buggy logPrefix method)"
    legacy_log.err(system=prefix)
