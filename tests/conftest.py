"""Fixtures every kind of test may use."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests import daemon


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Fail the test whose teardown (its own fixtures', or its module's after its last test) had
    to kill a daemon that did not stop on SIGTERM or SIGINT (:data:`tests.daemon.HUNG`): a
    daemon that hangs on its way out is a bug, and a quiet kill would hide it."""
    result = yield
    if daemon.HUNG:
        hung, daemon.HUNG[:] = list(daemon.HUNG), []
        pytest.fail("a daemon did not stop when asked: " + "; ".join(hung), pytrace=False)
    return result


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
