"""What a started nsqd has imported while idle: nothing a client or an option has not asked for.

The daemon runs under a probe that writes, when the process exits, which of
the heavy optional libraries were loaded (``docs/performance.md``, Memory):
pyOpenSSL and cryptography only with a TLS option or an auth server,
prometheus_client only after a ``/metrics`` scrape, treq only with an auth
server, cramjam only after a snappy client (or a scrape: prometheus_client
imports snappy), twisted.web's server only once an HTTP request needed
twisted.web's ``Request``, and Klein and werkzeug only once a request needed
routing (a plain ``GET /ping``, a direct route, needs neither);
automat (Twisted's ``ClientService``) only with an nsqlookupd to register with.

A node that has answered one ``GET /ping`` and one TCP client and then idles
holds none of the TLS libraries, and its RSS stays within a generous guard
above what twistd itself takes before any plugin code runs (``benchmarks/idle_rss.py``
measures both, side by side with Go's daemons).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import urllib.request

import pytest

from nsqtw.tools.daemons import rss_bytes, twistd_floor_rss
from tests.certs import CertFiles, make_certs
from tests.daemon import ROOT, TWISTD, Daemon, LookupdDaemon

#: the libraries the probe reports on
WATCHED = ("OpenSSL", "cryptography", "service_identity", "prometheus_client", "treq", "cramjam",
           "twisted.web.server", "klein", "werkzeug", "automat")
#: the TLS stack Twisted loads to offer TLS (about 13 MB of RSS together)
TLS_STACK = {"OpenSSL", "cryptography", "service_identity"}
#: how much more RSS than twistd's own floor a served idle daemon may hold: a guard against a
#: library loaded for nothing (the TLS stack alone would take nsqd past it), not a target; about 10 MB now
OVER_FLOOR = 16_000_000
#: what routing HTTP requests imports (a plain GET /ping needs none of it)
HTTP_STACK = {"twisted.web.server", "klein", "werkzeug"}

PROBE = (
    "import atexit, json, os, sys\n"
    f"atexit.register(lambda: os.write(1, ('IMPORTED ' + json.dumps([m for m in {WATCHED!r}"
    " if sys.modules.get(m) is not None]) + '\\n').encode()))\n"
)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> CertFiles:
    return make_certs(str(tmp_path_factory.mktemp("certs")))


def imported_at_exit(tmp_path, *args: str, scrape: bool = False, ping: bool = False, info: bool = False,
                     magic: bytes = b"", raw: bytes = b"", daemon: type[Daemon] = Daemon,
                     rss: list[int] | None = None, answers: list[bytes] | None = None) -> set[str]:
    """Start nsqd (or ``daemon``) with ``args`` under the probe, stop it; the watched libraries it had loaded.

    ``scrape``, ``ping`` and ``info`` send it a ``GET /metrics``, ``/ping`` and ``/info`` first;
    ``magic`` opens a TCP connection that sends it and closes; ``raw`` is sent on an HTTP connection
    the daemon closes after its answer, appended to ``answers``. With ``rss``, the daemon's RSS a
    second after those is appended to it.
    """
    path = tmp_path / f"data{len(os.listdir(tmp_path))}"
    path.mkdir()
    d = daemon(str(path), *args, code=PROBE + TWISTD).start()
    try:
        if scrape:
            with urllib.request.urlopen(f"http://{d.http_address}/metrics", timeout=10) as r:
                assert r.status == 200 and b"process_resident_memory_bytes" in r.read()
        if ping:
            with urllib.request.urlopen(f"http://{d.http_address}/ping", timeout=10) as r:
                assert (r.status, r.read(), r.headers["Content-Type"]) == (200, b"OK", "text/plain; charset=utf-8")
        if info:
            with urllib.request.urlopen(f"http://{d.http_address}/info", timeout=10) as r:
                assert r.status == 200 and json.loads(r.read())["version"] == "1.3.0"
        if raw:
            with socket.create_connection(d.http, timeout=10) as s:
                s.sendall(raw)
                answer = b""
                while chunk := s.recv(65536):
                    answer += chunk
            assert answers is not None
            answers.append(answer)
        if magic:
            with socket.create_connection(d.tcp, timeout=10) as s:
                s.sendall(magic)
                s.settimeout(0.2)
                with contextlib.suppress(TimeoutError):
                    s.recv(1)  # nothing comes back to a bare magic; this waits for the daemon to read it
        if rss is not None:
            time.sleep(1)
            rss.append(rss_bytes(d.pid))
    finally:
        assert d.stop() == 0
    [line] = [line for line in "".join(d.output).splitlines() if line.startswith("IMPORTED ")]
    return set(json.loads(line.split(" ", 1)[1]))


def test_idle_node_without_tls_loads_none_of_them(tmp_path) -> None:
    assert imported_at_exit(tmp_path) == set()


def test_ping_loads_no_http_server_stack(tmp_path) -> None:
    """The HTTP listener's channel answers a plain /ping itself: twisted.web's server, Klein and
    werkzeug stay unloaded (a direct route)."""
    assert imported_at_exit(tmp_path, ping=True) == set()


def test_unrouted_request_loads_twisted_web_server_only(tmp_path) -> None:
    """A request twisted.web's Request must handle but Klein need not (an unclean path, redirected as
    httprouter does) loads twisted.web's server, and not Klein or werkzeug."""
    answers: list[bytes] = []
    got = imported_at_exit(tmp_path, raw=b"GET //ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                           answers=answers)
    assert answers[0].startswith(b"HTTP/1.1 301 ")
    assert got == {"twisted.web.server"}


def test_routed_request_loads_klein(tmp_path) -> None:
    """A request that needs routing (/info) loads Klein and werkzeug, and nothing else watched."""
    assert imported_at_exit(tmp_path, info=True) == HTTP_STACK


def test_metrics_scrape_loads_prometheus_not_tls(tmp_path) -> None:
    """/metrics works on such a node; prometheus_client (which imports snappy, so cramjam) comes with it."""
    got = imported_at_exit(tmp_path, scrape=True)
    assert "prometheus_client" in got
    assert not got & {"OpenSSL", "cryptography", "treq"}


def test_tls_options_load_openssl(tmp_path, certs) -> None:
    got = imported_at_exit(tmp_path, f"--tls-cert={certs.server_cert}", f"--tls-key={certs.server_key}",
                           "--https-address=127.0.0.1:0")
    assert TLS_STACK <= got


def test_auth_server_loads_openssl_and_treq(tmp_path) -> None:
    """An auth server's 403 can send nsqd to https, so any auth address keeps TLS available."""
    got = imported_at_exit(tmp_path, "--auth-http-address=127.0.0.1:1")
    assert {"OpenSSL", "treq"} <= got


def test_lookupd_address_loads_client_service(tmp_path) -> None:
    """An nsqlookupd address makes nsqd keep a connection with Twisted's ClientService (automat)."""
    assert imported_at_exit(tmp_path, "--lookupd-tcp-address=127.0.0.1:1") == {"automat"}


def test_lookupd_loads_no_openssl(tmp_path) -> None:
    """nsqlookupd has no TLS at all; it too loads the HTTP stack only at its first HTTP connection."""
    assert not imported_at_exit(tmp_path, daemon=LookupdDaemon) & ({"OpenSSL", "cryptography"} | HTTP_STACK)
    assert imported_at_exit(tmp_path, ping=True, daemon=LookupdDaemon) == set()
    assert imported_at_exit(tmp_path, info=True, daemon=LookupdDaemon) == HTTP_STACK


def test_lookupd_scrape_loads_prometheus(tmp_path) -> None:
    """nsqlookupd's /metrics imports prometheus_client at the first scrape, not before."""
    assert "prometheus_client" in imported_at_exit(tmp_path, scrape=True, daemon=LookupdDaemon)


@pytest.mark.parametrize("daemon,magic", [(Daemon, b"  V2"), (LookupdDaemon, b"  V1")], ids=["nsqd", "nsqlookupd"])
def test_served_idle_node_stays_near_twistd_floor(tmp_path, daemon: type[Daemon], magic: bytes) -> None:
    """A daemon with default flags that answered one GET /ping and one TCP client, then idles, holds no
    TLS library, and at most OVER_FLOOR more RSS than twistd itself before any plugin code."""
    rss: list[int] = []
    assert imported_at_exit(tmp_path, ping=True, magic=magic, daemon=daemon, rss=rss) == set()
    floor = twistd_floor_rss(dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert 0 < rss[0] - floor <= OVER_FLOOR, (rss[0], floor)
