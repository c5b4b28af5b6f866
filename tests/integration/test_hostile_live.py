"""Hostile input answered as Go nsqd answers it, against a live nsqtw.

Each case of tests/hostile.py is sent byte for byte to a live daemon (TCP,
HTTP and HTTPS on loopback) and its answer compared with Go nsqd v1.3.0's,
recorded by benchmarks/record_hostile_reference.py into
tests/reference/nsqd-1.3.0-hostile.json. Where nsqtw deliberately answers
otherwise, the test says how and docs/compatibility.md says why.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.certs import make_certs
from tests.daemon import WORKERS, Daemon, workers_args
from tests.helpers import reference
from tests.hostile import CASES, Target

RECORDED: dict[str, Any] = reference("nsqd-1.3.0-hostile.json")["cases"]
#: the flags the recording was made with (benchmarks/record_hostile_reference.py)
FLAGS = ("--broadcast-address=127.0.0.1", "--msg-timeout=2s")
#: cases where nsqtw's answer is its own, on purpose (docs/compatibility.md)
DIFFERENT = {"pub_chunked_too_big", "stalled_tls_handshake", "tls_then_garbage_handshake"}


@pytest.fixture(scope="module", params=WORKERS, ids=lambda n: f"workers={n}")
def workers(request) -> int:
    """Every case runs against one process and against ``--workers=2`` (tests/conftest.py)."""
    return int(request.param)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, workers) -> Iterator[tuple[Daemon, Target]]:
    tmp = tmp_path_factory.mktemp("hostile")
    certs = make_certs(str(tmp))
    d = Daemon(str(tmp), *workers_args(workers), "--https-address=127.0.0.1:0", f"--tls-cert={certs.server_cert}",
               f"--tls-key={certs.server_key}", *FLAGS)
    d.start()
    https = d.wait_output(r"HTTPS: listening on (\S+)")
    yield d, Target(d.tcp_address, d.http_address, https.group(1))
    d.stop()


def test_recording_covers_every_case() -> None:
    """The recording and the driver name the same cases (re-record after adding one)."""
    assert set(RECORDED) == set(CASES)


@pytest.mark.parametrize("name", sorted(set(CASES) - DIFFERENT))
def test_answer_matches_go(daemon, name: str) -> None:
    """Frames, status, body and close, exactly as Go nsqd v1.3.0 answered."""
    _, target = daemon
    assert CASES[name](target) == RECORDED[name]


def test_endless_chunked_body_gets_413_and_the_connection_closes(daemon) -> None:
    """Go answers 413 then keeps reading the upload to discard it; nsqtw answers 413 and hangs up."""
    _, target = daemon
    got = CASES["pub_chunked_too_big"](target)
    go = RECORDED["pub_chunked_too_big"]
    assert (got["status"], got["body"]) == (go["status"], go["body"]) == (413, '{"message":"MSG_TOO_BIG"}')
    assert got["closed"] is True


def test_stalled_tls_handshake_gets_gos_timeout_error(daemon) -> None:
    """Silence after tls_v1: the same error frame as Go (addresses differ per run), after 5 s."""
    _, target = daemon
    got = CASES["stalled_tls_handshake"](target)

    def shape(answer: dict[str, Any]) -> Any:
        return re.sub(r"read tcp \S+->\S+:", "read tcp A->B:", repr(answer))

    assert shape(got) == shape(RECORDED["stalled_tls_handshake"])
    assert re.search(r"read tcp 127\.0\.0\.1:\d+->127\.0\.0\.1:\d+: i/o timeout", repr(got))


def test_garbage_client_hello_gets_a_tls_alert_and_the_close(daemon) -> None:
    """A broken ClientHello: Go sends an alert and then a plain-text frame; nsqtw the alert only."""
    _, target = daemon
    got = CASES["tls_then_garbage_handshake"](target)
    assert got["frames"] == [[0, "tls_v1=True"], "<tls alert>", "<closed>"]
    assert RECORDED["tls_then_garbage_handshake"]["frames"][:2] == got["frames"][:2]


def test_no_traceback_in_the_log(daemon) -> None:
    """After every case above, the daemon's log holds no traceback and it still answers."""
    d, target = daemon
    for name in ("identify_nested_field_2000", "identify_nested_field_20000", "put_config_nested_100000",
                 "huge_header", "identify_lone_surrogate"):
        CASES[name](target)
    out = d.read_output()
    assert "Traceback" not in out and "Unhandled" not in out and "MESSAGE LOST" not in out, out[-3000:]
    assert CASES["tls_ok"](target) == RECORDED["tls_ok"]
