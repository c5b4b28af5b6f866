"""The test harness's own stop (tests/daemon.py): a daemon that hangs on its way out fails its test.

A daemon that does not exit on SIGTERM is a product bug (a node stopped
under log load once hung for ever in its signal handler), so the harness
must not hide one behind its kill: :meth:`Daemon.stop` notes it in
:data:`HUNG` and tests/conftest.py fails the test whose teardown met it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from tests import conftest, daemon
from tests.daemon import Daemon
from tests.unit.test_daemons import sleeper


def _started(tmp_path: object, mode: str) -> Daemon:
    """A :class:`Daemon` over :func:`sleeper` (``ignore``: it ignores SIGTERM, as a hung stop would;
    ``exit``: its handler exits 0)."""
    d = Daemon(str(tmp_path), "--flag=1")
    d.proc = sleeper(mode)  # type: ignore[assignment]
    return d


@pytest.fixture
def hung() -> Iterator[list[str]]:
    """:data:`daemon.HUNG`, emptied after the test (what it notes here is expected, not a failure)."""
    yield daemon.HUNG
    daemon.HUNG.clear()


def test_a_daemon_that_ignores_sigterm_is_killed_and_noted(tmp_path: object, hung: list[str]) -> None:
    d = _started(tmp_path, "ignore")
    pid = d.proc.pid  # type: ignore[union-attr]
    began = time.monotonic()
    assert d.stop(timeout=1) == -signal.SIGKILL
    assert time.monotonic() - began < 10
    assert hung == [f"nsqtw (pid {pid}, --flag=1) still running 1 s after SIGTERM: killed"]


def test_a_frozen_daemon_is_continued_so_it_stops_on_sigterm(tmp_path: object, hung: list[str]) -> None:
    d = _started(tmp_path, "exit")
    d.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
    began = time.monotonic()
    assert d.stop(timeout=15) == 0  # it ran its handler: not killed
    assert time.monotonic() - began < 10
    assert hung == []


def test_a_kill_is_no_hang(tmp_path: object, hung: list[str]) -> None:
    d = _started(tmp_path, "ignore")
    assert d.kill() == -signal.SIGKILL
    assert hung == []


def test_the_teardown_that_met_a_hang_fails_and_the_next_one_does_not() -> None:
    teardown = conftest.pytest_runtest_teardown(item=None, nextitem=None)  # type: ignore[arg-type]
    next(teardown)
    daemon.HUNG.append("nsqtw (pid 1, ) still running 20 s after SIGTERM: killed")
    with pytest.raises(pytest.fail.Exception, match="a daemon did not stop when asked: nsqtw .pid 1"):
        teardown.send(None)
    assert daemon.HUNG == []
    teardown = conftest.pytest_runtest_teardown(item=None, nextitem=None)  # type: ignore[arg-type]
    next(teardown)
    with pytest.raises(StopIteration):
        teardown.send(None)
