"""Fixtures and probes shared by the reliability tests (real daemons, loopback, port 0)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon import Daemon
from tests.integration.conftest import daemon_factory  # noqa: F401 - re-exported fixture
from tests.reliability.cluster import Cluster, LookupdConsumer


def rss_kib(daemon: Daemon) -> int:
    """The daemon's resident set size (VmRSS) in KiB, from /proc."""
    with open(f"/proc/{daemon.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def http_raw(address: str, request: bytes, timeout: float = 10.0, half_close: bool = False) -> bytes:
    """Send raw bytes to the HTTP listener and read until it closes or answers in full.

    ``half_close`` signals the end of input after sending, for input that may
    leave the daemon waiting for more. Twisted drops a connection (and a
    response still being made) when the client half-closes, so whole
    requests are sent without it.
    """
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        try:
            s.sendall(request)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the daemon may answer and hang up before reading it all
        chunks = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
            data = b"".join(chunks)
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep and b"content-length:" in head.lower():
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                if len(body) >= length:
                    break
        return b"".join(chunks)


def status_of(response: bytes) -> int:
    """The status code of a raw HTTP response (0 when there was no answer)."""
    if not response.startswith(b"HTTP/1."):
        return 0
    return int(response.split(b" ", 2)[1])


def ping(daemon: Daemon) -> tuple[int, bytes]:
    """``GET /ping``: (status, body)."""
    response = http_raw(daemon.http_address, b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    return status_of(response), response.partition(b"\r\n\r\n")[2]


def wait_for(predicate, timeout: float, interval: float = 0.05):  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it returns something true; returns it (or the last value) at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def files_under(path: str) -> set[str]:
    """Every file below ``path`` (relative names)."""
    out = set()
    for root, _, names in os.walk(path):
        for name in names:
            out.add(os.path.relpath(os.path.join(root, name), path))
    return out


def assert_no_traceback(daemon: Daemon) -> None:
    out = daemon.read_output()
    assert "Traceback" not in out and "Unhandled" not in out, out[-3000:]


@pytest.fixture
def data_dir(tmp_path) -> Iterator[str]:
    path = tmp_path / "data"
    path.mkdir()
    yield str(path)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A ``--replicas=2`` cluster's lookupd and nodes (:class:`~tests.reliability.cluster.Cluster`), stopped after."""
    c = Cluster(str(tmp_path))
    try:
        yield c
    finally:
        c.started.stop_all()


@pytest.fixture
def consumers() -> Iterator[list[LookupdConsumer]]:
    """Consumers through lookupd a test starts (append them), stopped after."""
    started: list[LookupdConsumer] = []
    try:
        yield started
    finally:
        for c in started:
            c.stop()
