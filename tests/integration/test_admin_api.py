"""nsqtw-admin's JSON API answers as Go nsqadmin v1.3.0 does, over nsqtw-lookupd and two nsqtw nodes.

The scenario (tests/admin_reference.py) creates topics, channels, messages
and a consumer, then asks every /api/ and /config route, with actions that
change the cluster between the asks, a dead lookupd or node beside live ones
(partial answers), --admin-user, nsqd mode and --base-path. The recorded Go
answers (benchmarks/record_admin_reference.py) are compared with nsqtw-admin's,
status, content type and body, after the same normalisation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.admin_reference import REFERENCE, Cluster, free_port, http, loosen, run, setup, teardown
from tests.daemon import AdminDaemon, Daemon, LookupdDaemon
from tests.helpers import reference


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, list[Daemon]]]:
    """nsqtw-lookupd, two nsqtw nodes and three nsqtw-admin configured as the recording's."""
    root: Path = tmp_path_factory.mktemp("admin-cluster")
    started: list[Daemon] = []

    def start(daemon: Daemon) -> Daemon:
        started.append(daemon)
        return daemon.start()

    def folder(name: str) -> str:
        (root / name).mkdir()
        return str(root / name)

    try:
        lookupd = start(LookupdDaemon(folder("lookupd"), "--broadcast-address=127.0.0.1"))
        nodes = [start(Daemon(folder(n), f"--lookupd-tcp-address={lookupd.tcp_address}",
                              "--broadcast-address=127.0.0.1")) for n in ("a", "b")]
        dead = f"127.0.0.1:{free_port()}"
        admin = start(AdminDaemon(folder("admin"), f"--lookupd-http-address={lookupd.http_address}"))
        acl = start(AdminDaemon(folder("acl"), f"--lookupd-http-address={lookupd.http_address}",
                                f"--lookupd-http-address={dead}", "--admin-user=alice"))
        direct = start(AdminDaemon(folder("direct"), f"--nsqd-http-address={nodes[0].http_address}",
                                   f"--nsqd-http-address={dead}", "--base-path=/adm"))
        c = Cluster(lookupd.http_address, lookupd.tcp_address, nodes[0].http_address,
                    nodes[0].tcp_address, nodes[1].http_address, nodes[1].tcp_address,
                    admin.http_address, acl.http_address, direct.http_address, dead)
        setup(c)
        yield c, started
        teardown(c)
    finally:
        for d in reversed(started):
            d.stop()


@pytest.fixture(scope="module")
def answers(cluster: tuple[Cluster, list[Daemon]]) -> list[dict[str, Any]]:
    return run(cluster[0])


def _recorded() -> list[dict[str, Any]]:
    answers: list[dict[str, Any]] = reference(REFERENCE)["answers"]
    return answers


@pytest.mark.parametrize("recorded", _recorded(), ids=lambda a: a["name"])
def test_answer_matches_go_nsqadmin(recorded: dict[str, Any], answers: list[dict[str, Any]]) -> None:
    """One request of the scenario: same status, content type and (normalised) body as Go nsqadmin."""
    ours = next(a for a in answers if a["name"] == recorded["name"])
    assert (ours["method"], ours["path"]) == (recorded["method"], recorded["path"])
    assert ours["status"] == recorded["status"], ours["body"]
    assert ours["content_type"] == recorded["content_type"]
    want = json.dumps(loosen(recorded["name"], recorded["body"]), indent=1)
    got = json.dumps(loosen(ours["name"], ours["body"]), indent=1)
    assert got == want


def test_every_recorded_step_was_run(answers: list[dict[str, Any]]) -> None:
    """The scenario and the recording list the same requests, in the same order."""
    assert [a["name"] for a in answers] == [a["name"] for a in _recorded()]


def test_start_up_logs_the_bound_address(cluster: tuple[Cluster, list[Daemon]]) -> None:
    """nsqtw-admin logs nsqadmin's banner and ``HTTP: listening on HOST:PORT`` with the real port."""
    c, daemons = cluster
    admin = next(d for d in daemons if isinstance(d, AdminDaemon))
    out = admin.read_output()
    assert "nsqadmin v1.3.0 (built w/nsqtw-" in out
    assert f"HTTP: listening on {c.admin}" in out
    assert http("GET", f"http://{c.admin}/ping")[2] == b"OK"
