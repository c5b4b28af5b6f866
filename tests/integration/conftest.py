from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.daemon import Daemon, LookupdDaemon, workers_args


@pytest.fixture
def daemon_factory(tmp_path, workers) -> Iterator:
    """Start nsqtw daemons on loopback port 0 (with the module's ``--workers``); all are stopped at
    the end."""
    started: list[Daemon] = []

    def start(*args: str, data_path: str | None = None, env: dict[str, str] | None = None,
              **kw: object) -> Daemon:
        path = data_path or str(tmp_path / f"data{len(started)}")
        import os
        os.makedirs(path, exist_ok=True)
        d = Daemon(path, *workers_args(workers), *args, env=env)
        started.append(d)
        return d.start(**kw)  # type: ignore[arg-type]

    yield start
    for d in started:
        d.stop()


@pytest.fixture
def nsqd(daemon_factory) -> Daemon:
    """One nsqtw daemon with default flags (plus a short msg timeout)."""
    return daemon_factory()


@pytest.fixture
def lookupd_factory(tmp_path) -> Iterator:
    """Start nsqtw-lookupd daemons on loopback port 0; all are stopped at the end."""
    started: list[LookupdDaemon] = []

    def start(*args: str, **kw: object) -> LookupdDaemon:
        path = tmp_path / f"lookupd{len(started)}"
        path.mkdir(exist_ok=True)
        d = LookupdDaemon(str(path), *args)
        started.append(d)
        return d.start(**kw)  # type: ignore[arg-type]

    yield start
    for d in started:
        d.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for a module's page tests (its console kept for ``get_log``); skips
    where chromium is missing (:mod:`tests.integration.browser`)."""
    from tests.integration.browser import ARTIFACTS, open_chromium

    driver = open_chromium(console=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    yield driver
    driver.quit()
