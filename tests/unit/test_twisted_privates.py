"""Every private Twisted name nsqtw uses is listed in nsqtw.net.twisted_privates and still means the same.

A Twisted release that renames or changes one of them fails a test here,
with the name in the message, before it breaks a daemon; and a module of
nsqtw that starts touching a private Twisted name without listing it fails
:class:`ListedTests`.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import os
import re
import signal
import socket
from pathlib import Path
from typing import Any

import pytest
from twisted.application import app
from twisted.internet import abstract, base, tcp
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.protocol import Protocol, ServerFactory
from twisted.internet.testing import MemoryReactor, MemoryReactorClock, StringTransport
from twisted.scripts import twistd
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http import HTTPChannel

from nsqtw.net import twisted_privates as tp
from nsqtw.net.eager import SERVER_CLASS, EagerServer

PACKAGE = Path(tp.__file__).resolve().parents[1]


def resolve(path: str) -> Any:
    """``module.Class`` or ``module`` to the object."""
    try:
        return importlib.import_module(path)
    except ImportError:
        module, _, name = path.rpartition(".")
        return getattr(importlib.import_module(module), name)


@functools.cache
def _set_on_instances(klass: type) -> frozenset[str]:
    """The private names ``klass``'s own source assigns to ``self`` (mangled as Python mangles ``__x``)."""
    try:
        source = inspect.getsource(klass)
    except (OSError, TypeError):
        return frozenset()
    found = set(re.findall(r"self\.(_[A-Za-z]\w*)\s*[:=]", source))
    return frozenset(f"_{klass.__name__}{n}" if n.startswith("__") else n for n in found)


def defined_by(cls: Any, name: str) -> bool:
    """``cls`` (or a base) has ``name`` as a class attribute, or sets it on its instances."""
    if hasattr(cls, name):
        return True
    return inspect.isclass(cls) and any(name in _set_on_instances(klass) for klass in inspect.getmro(cls))


class ListedNamesExistTests(SynchronousTestCase):
    def test_every_name_read_or_written_exists(self) -> None:
        """Each (class, name) the accessors use is still defined by that Twisted class or module."""
        missing = [f"{owner}.{name}" for owner, name in tp.READ_OR_WRITTEN if not defined_by(resolve(owner), name)]
        self.assertEqual(missing, [], "Twisted changed these: see nsqtw/net/twisted_privates.py")

    def test_every_name_overridden_exists_and_is_overridden(self) -> None:
        """Each private method or attribute nsqtw overrides still exists in Twisted, and nsqtw's class overrides it."""
        broken = []
        for owner, name, ours, _why in tp.OVERRIDDEN:
            if not defined_by(resolve(owner), name):
                broken.append(f"{owner}.{name} is gone")
            if name not in vars(resolve(ours)):
                broken.append(f"{ours} no longer overrides {name}: drop it from OVERRIDDEN")
        self.assertEqual(broken, [])


def _twisted_private_names() -> set[str]:
    """Every private attribute or method name Twisted's own modules define."""
    import twisted

    names: set[str] = set()
    for path in Path(twisted.__file__).parent.rglob("*.py"):
        if "test" in path.parts:
            continue
        source = path.read_text(errors="ignore")
        names.update(re.findall(r"self\.(_[A-Za-z]\w*)\s*[:=]", source))
        names.update(re.findall(r"^\s+(?:def )?(_[A-Za-z]\w*)\s*[=(:]", source, re.M))
    return names


def _names_nsqtw_defines(trees: dict[Path, ast.Module]) -> set[str]:
    """Every private name nsqtw itself defines (functions, classes, attributes it assigns)."""
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return names


def _on_self(value: ast.expr) -> bool:
    """``self.x``, ``cls.x`` or ``super().x``: the subclass check below covers those."""
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"


class ListedTests(SynchronousTestCase):
    """No module but twisted_privates touches a private Twisted name that is not listed there."""

    trees: dict[Path, ast.Module] = {}

    @classmethod
    def setUpClass(cls) -> None:
        cls.trees = {path: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))
                     if path.name != "twisted_privates.py"}

    def test_no_private_twisted_name_is_imported(self) -> None:
        imported = [f"{path.relative_to(PACKAGE.parent)}: {node.module}.{alias.name}"
                    for path, tree in self.trees.items() for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("twisted")
                    for alias in node.names if alias.name.startswith("_")]
        self.assertEqual(imported, [])

    def test_no_private_twisted_attribute_is_read_on_another_object(self) -> None:
        """``obj._name`` where Twisted defines ``_name`` and nsqtw does not: it must go through an accessor."""
        twisted_names = _twisted_private_names() - _names_nsqtw_defines(self.trees)
        found = []
        for path, tree in self.trees.items():
            for node in ast.walk(tree):
                if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                        and node.attr in twisted_names and not _on_self(node.value)):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}")
        self.assertEqual(found, [], "read these through nsqtw.net.twisted_privates")

    def test_subclasses_of_twisted_classes_touch_only_listed_privates(self) -> None:
        """A class of nsqtw's that subclasses Twisted's spells no private name of its bases but those it overrides
        (listed in OVERRIDDEN); what it reads goes through an accessor."""
        found = []
        for path in self.trees:
            module_name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
            if module_name.startswith("nsqtw.spark"):
                continue  # imports pyspark
            module = importlib.import_module(module_name)
            for cls in vars(module).values():
                if not inspect.isclass(cls) or cls.__module__ != module_name:
                    continue
                bases = [b for b in cls.__mro__[1:] if b.__module__.startswith("twisted.")]
                if not bases:
                    continue
                own = set(re.findall(r"\b_[A-Za-z]\w*", inspect.getsource(cls)))
                overridden = {name for _, name, ours, _ in tp.OVERRIDDEN if ours == f"{module_name}.{cls.__qualname__}"}
                for name in sorted(own - overridden):
                    if any(defined_by(b, name) for b in bases):
                        found.append(f"{cls.__module__}.{cls.__qualname__}: {name}")
        self.assertEqual(found, [], "read these through nsqtw.net.twisted_privates's accessors (a method"
                                    " overridden: list it in OVERRIDDEN)")


epollreactor = pytest.importorskip("twisted.internet.epollreactor")


class EPollReactorTests(SynchronousTestCase):
    """What nsqtw.net.epollreactor reads of Twisted's epoll reactor."""

    def test_selectables_poller_and_dispatch(self) -> None:
        """``_selectables`` maps a registered descriptor to its reader, ``_poller`` is the epoll, and
        ``_doReadOrWrite`` runs the reader's ``doRead`` for a read event."""
        reactor = epollreactor.EPollReactor()
        poller = tp.epoll_poller(reactor)
        self.addCleanup(poller.close)
        selectables = tp.epoll_selectables(reactor)
        a, b = socket.socketpair()
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        read: list[bool] = []

        class Reader(abstract.FileDescriptor):
            def fileno(self) -> int:
                return a.fileno()

            def doRead(self) -> None:
                read.append(True)

        reader = Reader(reactor)
        reactor.addReader(reader)
        self.assertIs(tp.epoll_selectables(reactor), selectables, "one dict for the reactor's life")
        self.assertIs(selectables[a.fileno()], reader)
        b.sendall(b"x")
        events = poller.poll(1, len(selectables))
        self.assertEqual([fd for fd, _ in events], [a.fileno()])
        tp.epoll_ready_dispatcher(reactor)(reader, a.fileno(), events[0][1])
        self.assertEqual(read, [True])
        reactor.removeReader(reader)
        self.assertNotIn(a.fileno(), selectables)


class InheritedReactorTests(SynchronousTestCase):
    """What a process forked from the core (``--workers``) closes of the reactor it inherited."""

    def test_close_reactor_descriptors_closes_the_epoll_and_the_waker_once(self) -> None:
        """The epoll object and both ends of the waker's pipe are closed through their objects, so
        the descriptor numbers are not closed again later (they may be reused by then)."""
        reactor = epollreactor.EPollReactor()
        poller = tp.epoll_poller(reactor)
        waker = reactor.waker
        fds = [poller.fileno(), waker.i, waker.o]
        tp.close_reactor_descriptors(reactor)
        self.assertTrue(poller.closed)
        for fd in fds:
            self.assertRaises(OSError, os.fstat, fd)
        self.assertFalse(hasattr(waker, "i"))
        tp.close_reactor_descriptors(reactor)  # a second time closes nothing


class ExitSignalTests(SynchronousTestCase):
    """What nsqtw.net.exit relies on in Twisted: the signal twistd re-raises, and no exit status of its own."""

    def test_reactor_records_the_signal_that_stopped_it(self) -> None:
        """Reactors keep ``_exitSignal`` (None until a signal stops them), set by their signal handlers."""
        self.assertIn("_exitSignal", vars(base.ReactorBase))
        self.assertIsNone(base.ReactorBase._exitSignal)
        self.assertIn("self._exitSignal = number", inspect.getsource(base.ReactorBase))

    def test_twistd_re_raises_that_signal_and_otherwise_exits_0(self) -> None:
        """twistd reads the reactor's ``_exitSignal`` after ``run()`` and re-raises it; no exit status."""
        self.assertIn("reactor._exitSignal", inspect.getsource(app.ApplicationRunner.startReactor))
        run_app = inspect.getsource(twistd.runApp)
        self.assertIn("runner._exitSignal", run_app)
        self.assertNotIn("exit(", run_app.replace("_exitWithSignal(", ""))

    def test_accessors(self) -> None:
        reactor = MemoryReactorClock()
        self.assertIsNone(tp.exit_signal(reactor))
        reactor._exitSignal = signal.SIGTERM  # type: ignore[attr-defined]
        self.assertEqual(tp.exit_signal(reactor), signal.SIGTERM)
        tp.clear_exit_signal(reactor)
        self.assertIsNone(tp.exit_signal(reactor))


class WriteBufferTests(SynchronousTestCase):
    """FileDescriptor's write buffers, as nsqtw.net.eager and nsqtw.client read them."""

    def test_installed_twisted_is_understood(self) -> None:
        """The installed Twisted keeps FileDescriptor's buffers as :func:`write_buffer_empty` reads them.

        If this fails, a Twisted release renamed or changed ``_tempDataLen``,
        ``offset``, ``dataBuffer`` or ``_writeDisconnected``: nsqtw still works
        (it falls back to Twisted's write path) but loses the eager send.
        """
        self.assertTrue(tp.write_buffers_understood(),
                        f"Twisted changed {tp.WRITE_BUFFER_ATTRIBUTES}: see nsqtw/net/twisted_privates.py")
        self.assertIs(SERVER_CLASS, EagerServer)

    def test_missing_attribute_is_detected(self) -> None:
        """A FileDescriptor without one of the attributes is not trusted."""

        class Renamed(abstract.FileDescriptor):
            def __init__(self, reactor: object = None) -> None:
                super().__init__(reactor)  # type: ignore[arg-type]
                del self._tempDataLen

        self.assertFalse(tp.write_buffers_understood(Renamed))

    def test_changed_meaning_is_detected(self) -> None:
        """A FileDescriptor whose buffered write does not show in ``_tempDataLen`` is not trusted."""

        class Different(abstract.FileDescriptor):
            def write(self, data: bytes) -> None:
                self.dataBuffer = data  # flushes differently: the counters mean something else

        self.assertFalse(tp.write_buffers_understood(Different))

    def test_accessors_follow_a_write_a_flush_and_a_half_close(self) -> None:
        reactor = MemoryReactor()
        fd = abstract.FileDescriptor(reactor)  # type: ignore[no-untyped-call]
        fd.connected = 1
        self.assertTrue(tp.write_buffer_empty(fd))
        self.assertTrue(tp.may_send_now(fd))
        fd.write(b"abc")  # type: ignore[no-untyped-call]
        self.assertFalse(tp.write_buffer_empty(fd))
        self.assertFalse(tp.may_send_now(fd))
        self.assertFalse(tp.write_side_closed(fd))
        self.assertFalse(tp.is_aborting(tcp.Connection))  # the class default an unaborted connection reads
        empty = abstract.FileDescriptor(reactor)  # type: ignore[no-untyped-call]
        empty.connected = 1
        empty._writeDisconnected = True  # what loseWriteConnection's doWrite leaves
        self.assertTrue(tp.write_buffer_empty(empty))
        self.assertTrue(tp.write_side_closed(empty))
        self.assertFalse(tp.may_send_now(empty))


class PortLoggerTests(SynchronousTestCase):
    def test_the_port_logger_is_a_descriptor_and_the_cache_shadows_it(self) -> None:
        """``tcp.Port._logger`` builds a Logger per read; the cached one is the same Logger, made once."""
        port = tcp.Port(0, ServerFactory.forProtocol(Protocol), interface="127.0.0.1", reactor=MemoryReactor())
        self.assertIsNot(port._logger, port._logger)
        tp.cache_port_logger(port)
        self.assertIs(port._logger, port._logger)
        self.assertEqual(port._logger.namespace, tcp.Port._logger.__get__(port, tcp.Port).namespace)


class LogObserverTests(SynchronousTestCase):
    def test_log_observers_lists_what_was_added_and_removal_takes_effect(self) -> None:
        """A worker drops the observers it inherited: the list is the publisher's, in order, and
        removing each of them leaves events reaching only what is added afterwards."""
        from twisted.logger import LogPublisher

        seen: list[str] = []
        first, second = (lambda e: seen.append("first")), (lambda e: seen.append("second"))
        publisher = LogPublisher(first)
        publisher.addObserver(second)
        self.assertEqual(tp.log_observers(publisher), [first, second])
        for observer in tp.log_observers(publisher):
            publisher.removeObserver(observer)
        publisher.addObserver(lambda e: seen.append("relay"))
        publisher({"log_format": "x"})
        self.assertEqual(seen, ["relay"])


class HTTPClientTests(SynchronousTestCase):
    def test_quiet_pool(self) -> None:
        """``HTTPConnectionPool._factory`` is the per-connection factory class; the quiet one is a quiet kind of it."""
        from twisted.web.client import HTTPConnectionPool, _HTTP11ClientFactory

        pool = HTTPConnectionPool(MemoryReactor())
        self.assertIs(pool._factory, _HTTP11ClientFactory)
        tp.quiet_pool(pool)
        self.assertTrue(issubclass(pool._factory, _HTTP11ClientFactory))
        self.assertIs(pool._factory.noisy, False)
        self.assertIs(_HTTP11ClientFactory.noisy, True, "the pool's own is noisy: quieting still needed")

    def test_host_as_bytes_and_text(self) -> None:
        """``HostnameEndpoint._hostAsBytesAndText(host)`` gives (bad, bytes, text); the constructor calls it."""
        method = inspect.getattr_static(HostnameEndpoint, "_hostAsBytesAndText")
        self.assertIsInstance(method, staticmethod)
        self.assertEqual(HostnameEndpoint._hostAsBytesAndText("example.com"), (False, b"example.com", "example.com"))
        self.assertIn("self._hostAsBytesAndText(", inspect.getsource(HostnameEndpoint.__init__))
        from nsqtw.admin.client import _NameAsIsEndpoint

        endpoint = _NameAsIsEndpoint(MemoryReactor(), "my_host", 4151)
        self.assertIn("my_host", repr(endpoint))


class HTTPChannelTests(SynchronousTestCase):
    """The private twisted.web HTTPChannel state nsqtw.http reads, driven over a StringTransport."""

    def _channel(self, request_factory: Any = None) -> HTTPChannel:
        from twisted.web.resource import Resource
        from twisted.web.server import Request, Site

        channel = HTTPChannel()
        channel.site = Site(Resource())  # type: ignore[attr-defined]
        channel.requestFactory = request_factory or Request
        channel.makeConnection(StringTransport())
        self.addCleanup(channel.connectionLost, None)
        return channel

    def test_request_target_is_kept_before_the_body(self) -> None:
        """HTTPChannel stores the request target in ``_path`` before the body arrives."""
        from twisted.web.server import Request

        seen: list[object] = []

        class Probe(Request):
            def gotLength(self, length: int | None) -> None:
                seen.append(tp.request_target(self.channel))
                super().gotLength(length)  # type: ignore[no-untyped-call]

        channel = self._channel(Probe)
        self.assertIsNone(tp.request_target(channel))
        channel.dataReceived(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n")
        self.assertEqual(seen, [b"/pub?topic=t"],
                         "twisted.web.http.HTTPChannel no longer keeps _path: update BoundedRequest._limit")
        self.assertIsNotNone(tp.transfer_decoder(channel), "a body is being read")
        tp.drop_transfer_decoder(channel)
        self.assertIsNone(tp.transfer_decoder(channel))

    def test_waiting_for_transport(self) -> None:
        """HTTPChannel sets ``_waitingForTransport`` while paused as a producer: GoHTTPChannel._direct_next
        reads it to hold pipelined answers for a client that does not read them."""
        channel = self._channel()
        self.assertIs(tp.waiting_for_transport(channel), False)
        channel.pauseProducing()
        self.assertIs(tp.waiting_for_transport(channel), True)
        channel.resumeProducing()
        self.assertIs(tp.waiting_for_transport(channel), False)

    def test_header_bytes_first_line_and_handling(self) -> None:
        """``_receivedHeaderSize`` counts the head's bytes, ``__first_line`` is set before a request line
        only, and ``_handlingRequest`` is set while a request is answered."""
        handling: list[bool] = []
        from twisted.web.server import Request

        class Probe(Request):
            def process(self) -> None:
                handling.append(tp.handling_request(self.channel))
                self.finish()  # type: ignore[no-untyped-call]

        channel = self._channel(Probe)
        self.assertTrue(tp.on_request_line(channel))
        self.assertFalse(tp.handling_request(channel))
        channel.dataReceived(b"GET / HTTP/1.1\r\n")
        self.assertFalse(tp.on_request_line(channel))
        self.assertEqual(tp.received_header_size(channel), len(b"GET / HTTP/1.1"))
        channel.dataReceived(b"Host: x\r\n")
        self.assertEqual(tp.received_header_size(channel), len(b"GET / HTTP/1.1") + len(b"Host: x"))
        channel.dataReceived(b"\r\n")
        self.assertEqual(handling, [True])
        self.assertTrue(tp.on_request_line(channel), "ready for the next request")
        self.assertEqual(tp.received_header_size(channel), 0)
