"""Every private Twisted name nsqtw reads, writes or overrides, each with the reason it is needed.

Twisted promises nothing about a name that starts with an underscore (nor
about ``FileDescriptor``'s undocumented buffers). nsqtw uses a few, each
for a measured gain or a behaviour Go's NSQ has and Twisted offers no
public way to get; all of them are here, so a maintainer sees the whole
list, and ``tests/unit/test_twisted_privates.py`` checks each one against
the installed Twisted (that it exists, has the shape relied on, and means
the same), and that no other module of nsqtw touches a private Twisted
name that is not listed. A Twisted release that changes one fails that
test; ``setup.cfg`` bounds Twisted above for the same reason.

Reads and writes are the functions below; other modules call them and
never spell the private name. A method nsqtw *overrides* must be spelled
in the subclass itself; those are listed in :data:`OVERRIDDEN`.

Nothing here imports ``twisted.web`` or the reactor: the functions take
the objects they read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "OVERRIDDEN", "READ_OR_WRITTEN", "WRITE_BUFFER_ATTRIBUTES", "cache_port_logger", "clear_exit_signal",
    "close_reactor_descriptors",
    "drop_transfer_decoder", "epoll_poller", "epoll_ready_dispatcher", "epoll_selectables", "exit_signal",
    "handling_request", "is_aborting", "log_observers", "on_request_line", "quiet_pool", "received_header_size",
    "request_target", "transfer_decoder", "waiting_for_transport", "write_buffer_empty",
    "write_buffers_understood", "write_side_closed",
]

#: (Twisted class, attribute) pairs the functions below read or write, for the guard test
READ_OR_WRITTEN: tuple[tuple[str, str], ...] = (
    ("twisted.internet.epollreactor.EPollReactor", "_selectables"),
    ("twisted.internet.epollreactor.EPollReactor", "_poller"),
    ("twisted.internet.epollreactor.EPollReactor", "_doReadOrWrite"),
    ("twisted.internet.base.ReactorBase", "_exitSignal"),
    ("twisted.internet.abstract.FileDescriptor", "_tempDataLen"),
    ("twisted.internet.abstract.FileDescriptor", "dataBuffer"),
    ("twisted.internet.abstract.FileDescriptor", "offset"),
    ("twisted.internet.abstract.FileDescriptor", "_writeDisconnected"),
    ("twisted.internet.tcp.Connection", "_aborting"),
    ("twisted.internet.tcp.Port", "_logger"),
    ("twisted.web.client.HTTPConnectionPool", "_factory"),
    ("twisted.web.client", "_HTTP11ClientFactory"),
    ("twisted.web.http.HTTPChannel", "_waitingForTransport"),
    ("twisted.web.http.HTTPChannel", "_receivedHeaderSize"),
    ("twisted.web.http.HTTPChannel", "_HTTPChannel__first_line"),
    ("twisted.web.http.HTTPChannel", "_handlingRequest"),
    ("twisted.web.http.HTTPChannel", "_transferDecoder"),
    ("twisted.web.http.HTTPChannel", "_path"),
    ("twisted.logger._observer.LogPublisher", "_observers"),
)

#: (Twisted class, attribute, the nsqtw class that overrides or subclasses it, why)
OVERRIDDEN: tuple[tuple[str, str, str, str], ...] = (
    ("twisted.internet.tcp.Connection", "_shouldShutdown", "nsqtw.net.eager.EagerServer",
     "False: close() alone ends a connection the process alone holds; shutdown(2) first is one system"
     " call more per connection"),
    ("twisted.internet.endpoints.HostnameEndpoint", "_hostAsBytesAndText", "nsqtw.admin.client._NameAsIsEndpoint",
     "nsqadmin reaches a node registered under a name IDNA 2008 refuses (``my_host``), as Go's resolver does"),
    ("twisted.web.http.HTTPChannel", "_respondToBadRequestAndDisconnect", "nsqtw.http.channel.GoHTTPChannel",
     "a malformed request gets Go's 400 text instead of twisted.web's"),
)


# --- the epoll reactor (nsqtw.net.epoll.NSQTWReactor) ------------------------------------------


def epoll_selectables(reactor: Any) -> dict[int, Any]:
    """``EPollReactor._selectables``: descriptor number -> the reader or writer registered for it.

    The poll step looks up each ready descriptor here, as Twisted's own
    ``doPoll`` does. The dict is made once, in ``__init__``, and only
    mutated after: a reference taken once stays current.
    """
    selectables: dict[int, Any] = reactor._selectables
    return selectables


def epoll_poller(reactor: Any) -> Any:
    """``EPollReactor._poller``: the ``select.epoll`` object, which the busy-polling wait polls."""
    return reactor._poller


def epoll_ready_dispatcher(reactor: Any) -> Callable[[Any, int, int], None]:
    """``PosixReactorBase._doReadOrWrite``: run one ready descriptor's ``doRead``/``doWrite``.

    Twisted's poll step calls it inside ``log.callWithLogger``; nsqtw's
    calls it directly (``nsqtw.net.epoll``). It catches what
    ``doRead``/``doWrite`` raise, and disconnects the descriptor.
    """
    dispatch: Callable[[Any, int, int], None] = reactor._doReadOrWrite
    return dispatch


def close_reactor_descriptors(reactor: Any) -> None:
    """Close the descriptors an inherited (forked) epoll reactor holds: its ``_poller`` and its waker.

    A process forked from the core (``--workers``: the fork server, hence
    each worker) shares the core's epoll instance: an ``epoll_ctl`` on it
    would change what the core waits for. The child runs a reactor of its
    own, and closes these through their objects (``epoll.close()``, the
    waker's ``connectionLost``), so nothing closes the same numbers again
    once they are reused; the caller keeps ``reactor`` referenced.
    """
    poller = getattr(reactor, "_poller", None)
    if poller is not None and hasattr(poller, "close"):
        poller.close()
    waker = getattr(reactor, "waker", None)
    if waker is not None:
        waker.connectionLost(None)


# --- how twistd ends (nsqtw.net.exit) ---------------------------------------------------------


def exit_signal(reactor: Any) -> int | None:
    """``ReactorBase._exitSignal``: the signal that stopped the reactor, which twistd re-raises at exit.

    twistd gives no public way to choose the exit status (Twisted's issue
    11335); clearing this is how a stop after SIGTERM exits 0, and how a
    failed start exits with the status nsqtw recorded.
    """
    signal: int | None = getattr(reactor, "_exitSignal", None)
    return signal


def clear_exit_signal(reactor: Any) -> None:
    """Tell twistd the stop was handled: no signal is re-raised at exit (see :func:`exit_signal`)."""
    if getattr(reactor, "_exitSignal", None) is not None:
        reactor._exitSignal = None


# --- a connection's write buffers (nsqtw.net.eager.EagerServer) ------------------------------


def write_buffer_empty(fd: Any) -> bool:
    """Nothing written to ``fd`` waits in Twisted's buffers (``_tempDataLen``, ``offset``, ``dataBuffer``).

    ``FileDescriptor.write`` appends to ``_tempData`` (counted in
    ``_tempDataLen``); ``doWrite`` moves that to ``dataBuffer`` and sends
    from ``offset``. Only with both empty may a write go straight to the
    socket without overtaking bytes already queued.
    """
    return not fd._tempDataLen and fd.offset == len(fd.dataBuffer)


#: the FileDescriptor attributes :func:`write_buffer_empty` and :func:`write_side_closed` read
WRITE_BUFFER_ATTRIBUTES = ("_tempDataLen", "offset", "dataBuffer", "_writeDisconnected")


def write_buffers_understood(fd_class: type | None = None) -> bool:
    """Whether ``fd_class`` (``FileDescriptor``) keeps its write buffers as :func:`write_buffer_empty` assumes.

    A buffered write must show up in ``_tempDataLen`` while ``offset`` and
    ``dataBuffer`` say nothing was flushed yet, and ``_writeDisconnected``
    must be a bool. Checked on a scratch instance with a do-nothing
    reactor; ``nsqtw.net.eager`` falls back to Twisted's own write path
    where this is False.
    """
    from twisted.internet.abstract import FileDescriptor

    made: Any = FileDescriptor if fd_class is None else fd_class

    class _Reactor:
        def addWriter(self, _: object) -> None:
            pass

        def removeWriter(self, _: object) -> None:
            pass

    try:
        fd = made(reactor=_Reactor())
        fd.connected = 1
        if any(not hasattr(fd, name) for name in WRITE_BUFFER_ATTRIBUTES):
            return False
        fd.write(b"abc")
        return (fd._tempDataLen == 3 and fd.offset == 0
                and fd.dataBuffer == b"" and fd._writeDisconnected is False)
    except Exception:
        return False


def may_send_now(fd: Any) -> bool:
    """Both at once, for the write path: nothing waits in ``fd``'s buffers
    (:func:`write_buffer_empty`) and its write side is open (not :func:`write_side_closed`)."""
    return not fd._tempDataLen and fd.offset == len(fd.dataBuffer) and not fd._writeDisconnected


def write_side_closed(fd: Any) -> bool:
    """``FileDescriptor._writeDisconnected``: ``loseWriteConnection`` took effect; nothing more may be sent."""
    closed: bool = fd._writeDisconnected
    return closed


def is_aborting(connection: Any) -> bool:
    """``_AbortingMixin._aborting``: ``abortConnection`` was called (its ``connectionLost`` is on its way)."""
    aborting: bool = connection._aborting
    return aborting


# --- a listening port (nsqtw.net.eager.EagerPort) -------------------------------------------------


def cache_port_logger(port: Any) -> None:
    """Give ``port`` its own ``tcp.Port._logger``, made once.

    ``tcp.Port._logger`` is a ``twisted.logger.Logger`` used as a
    descriptor: each read builds a new Logger, and ``doRead`` reads it twice
    per accepting turn. An instance attribute holding the one it would
    build shadows the descriptor.
    """
    port._logger = type(port)._logger.__get__(port, type(port))


# --- the log (nsqtw.log) --------------------------------------------------------------------------


def log_observers(publisher: Any) -> list[Any]:
    """The observers of ``publisher`` (a ``LogPublisher``), a copy.

    A ``--workers`` worker inherits twistd's observers of the global
    publisher (the core's log file) and must drop them, so that only the
    core writes its log (``nsqtw.log.relay_to_core``); ``LogPublisher``
    offers ``removeObserver`` but no way to list them.
    """
    return list(publisher._observers)


# --- nsqadmin's HTTP client (nsqtw.admin.client) ------------------------------------------------


def quiet_pool(pool: Any) -> None:
    """Make ``pool`` (an ``HTTPConnectionPool``) log nothing per connection it opens.

    The pool builds each connection's protocol with ``_factory``, a
    ``_HTTP11ClientFactory`` that is ``noisy``: one "Starting factory" line
    per connection to a node. nsqadmin's pool uses the same class, quiet.
    """
    pool._factory = _quiet_client_factory()


def _quiet_client_factory() -> type:
    global _QUIET_FACTORY
    if _QUIET_FACTORY is None:
        from twisted.web.client import _HTTP11ClientFactory

        _QUIET_FACTORY = type("QuietHTTP11ClientFactory", (_HTTP11ClientFactory,), {"noisy": False})
    return _QUIET_FACTORY


_QUIET_FACTORY: type | None = None


# --- twisted.web's HTTP/1.1 parser (nsqtw.http) ---------------------------------------------------


def waiting_for_transport(channel: Any) -> bool:
    """``HTTPChannel._waitingForTransport``: the transport paused the channel (the client reads no answers)."""
    waiting: bool = channel._waitingForTransport
    return waiting


def received_header_size(channel: Any) -> int:
    """``HTTPChannel._receivedHeaderSize``: bytes of the current request's line and headers so far.

    Go limits the request line plus headers together; twisted.web counts
    them here (and checks its own, smaller limit after the line is added).
    """
    size: int = channel._receivedHeaderSize
    return size


def on_request_line(channel: Any) -> bool:
    """``HTTPChannel.__first_line``: the next line is a request line (not a header).

    Go takes a request target with non-ASCII bytes (escaping them);
    twisted.web refuses it. Only the request line is escaped.
    """
    return bool(getattr(channel, "_HTTPChannel__first_line", 0))


def handling_request(channel: Any) -> bool:
    """``HTTPChannel._handlingRequest``: a request is being answered (no refusal may be written over it)."""
    handling: bool = channel._handlingRequest
    return handling


def transfer_decoder(channel: Any) -> Any:
    """``HTTPChannel._transferDecoder``: the body decoder while a request body is being read, else None."""
    return channel._transferDecoder


def drop_transfer_decoder(channel: Any) -> None:
    """Stop decoding the current request's body (Go's "413 and close" for a body far past its limit)."""
    channel._transferDecoder = None


def request_target(channel: Any) -> bytes | None:
    """``HTTPChannel._path``: the request target, kept there until the body is in (None outside a request).

    A request's body limit depends on its route, which must be known
    before the body arrives (``BoundedRequest.gotLength``); twisted.web sets
    ``Request.path`` only once the whole body is in.
    """
    target = getattr(channel, "_path", None)
    return target if isinstance(target, bytes) else None
