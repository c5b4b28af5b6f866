"""Fixtures every kind of test may use."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest


@pytest.fixture
def notify_socket(tmp_path) -> Iterator[tuple[str, socket.socket]]:
    """A unix datagram socket standing in for systemd's notify socket: (``NOTIFY_SOCKET``, socket)."""
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    yield path, sock
    sock.close()


@pytest.fixture(scope="module")
def workers() -> int:
    """The ``--workers`` of the nsqd daemons a test starts (1: one process, nsqd's default).

    A module whose tests must hold for a node on several processes too (the
    client suites) overrides it with ``params=WORKERS``, and each of its
    tests runs once per value; module-scoped, so its shared daemons can use it.
    """
    return 1
