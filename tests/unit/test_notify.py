"""sd_notify readiness: a datagram to ``$NOTIFY_SOCKET`` (a path or ``@abstract``), nothing without it."""

from __future__ import annotations

import os
import socket
import tempfile

from twisted.trial.unittest import SynchronousTestCase

from nsqtw.net.notify import notify


class NotifyTests(SynchronousTestCase):
    def receiver(self, address: str | bytes) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.addCleanup(sock.close)
        sock.bind(address)
        sock.settimeout(5)
        return sock

    def test_path_socket_gets_the_state(self) -> None:
        """``NOTIFY_SOCKET=/path`` gets ``READY=1`` as one datagram."""
        path = os.path.join(tempfile.mkdtemp(), "notify")
        sock = self.receiver(path)
        self.assertTrue(notify("READY=1", {"NOTIFY_SOCKET": path}))
        self.assertEqual(sock.recv(100), b"READY=1")

    def test_abstract_socket_gets_the_state(self) -> None:
        """``NOTIFY_SOCKET=@name`` is the abstract namespace (systemd's own form)."""
        name = f"nsqtw-test-{os.getpid()}-{id(self)}"
        sock = self.receiver(b"\0" + name.encode())
        self.assertTrue(notify("STOPPING=1", {"NOTIFY_SOCKET": "@" + name}))
        self.assertEqual(sock.recv(100), b"STOPPING=1")

    def test_nothing_without_the_variable(self) -> None:
        """Without ``NOTIFY_SOCKET`` (not run by systemd) nothing is sent."""
        self.assertFalse(notify("READY=1", {}))
        self.assertFalse(notify("READY=1", {"NOTIFY_SOCKET": ""}))

    def test_unreachable_manager_is_not_an_error(self) -> None:
        """A socket that is gone is logged and forgotten: the daemon serves on."""
        path = os.path.join(tempfile.mkdtemp(), "gone")
        self.assertFalse(notify("READY=1", {"NOTIFY_SOCKET": path}))
