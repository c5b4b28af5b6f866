"""Readiness for service managers: systemd's ``sd_notify`` protocol, without a dependency.

When ``NOTIFY_SOCKET`` names a unix datagram socket (a path, or ``@name``
for the abstract namespace), a daemon sends ``READY=1`` there once every
listener is bound and ``STOPPING=1`` when it begins to drain. Without the
variable nothing is sent. A manager that cannot be reached is no reason to
stop serving: a failed send is logged and forgotten.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from nsqtw.log import Logger

__all__ = ["notify"]

log = Logger(namespace="nsqtw.net.notify")


def _socket_address(name: str) -> str | bytes:
    """``@name`` is the abstract namespace (a leading NUL byte); anything else a path."""
    if name.startswith("@"):
        return b"\0" + name[1:].encode()
    return name


def notify(state: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (``READY=1``, ``STOPPING=1``) to ``$NOTIFY_SOCKET``; False when not sent."""
    name = (os.environ if environ is None else environ).get("NOTIFY_SOCKET", "")
    if not name:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(_socket_address(name))
            sock.sendall(state.encode())
    except OSError as e:
        log.warn("NOTIFY: could not tell the service manager {state} - {error}", state=state, error=e)
        return False
    return True
