"""TLS, compression, AUTH, statsd, sampling and e2e latency on a real nsqtw daemon.

Certificates are made by the test; the auth server is a small HTTP server on
127.0.0.1 port 0 in a thread of the test; statsd is a UDP socket bound by
the test. Clients are pynsq from PyPI and a raw socket that does its own TLS
and decompression.
"""

from __future__ import annotations

import json
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import snappy

from tests.certs import CertFiles, make_certs
from tests.daemon import ROOT, TWISTD, WORKERS
from tests.integration.pynsq_driver import consume, publish
from tests.rawclient import OK, Client, Closed


@pytest.fixture(scope="module", params=WORKERS, ids=lambda n: f"workers={n}")
def workers(request) -> int:
    """Every test here runs against one process and against ``--workers=2`` (conftest.py)."""
    return int(request.param)

ERROR = 1


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> CertFiles:
    return make_certs(str(tmp_path_factory.mktemp("certs")))


def tls_args(certs: CertFiles, *extra: str) -> tuple[str, ...]:
    return (f"--tls-cert={certs.server_cert}", f"--tls-key={certs.server_key}",
            "--https-address=127.0.0.1:0", *extra)


def client_context(certs: CertFiles, cert: str = "", key: str = "") -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=certs.ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


def negotiate(c: Client, **features: Any) -> dict:
    ftype, data = c.identify(feature_negotiation=True, **features)
    assert ftype == 0, data
    return json.loads(data)


def start_tls(c: Client, ctx: ssl.SSLContext) -> None:
    """Switch the raw client's socket to TLS (nothing may be buffered yet)."""
    assert c.buf == b""
    c.sock = ctx.wrap_socket(c.sock, server_hostname="127.0.0.1")


def stats(address: str, scheme: str = "http", ctx: ssl.SSLContext | None = None,
          query: str = "format=json") -> Any:
    with urllib.request.urlopen(f"{scheme}://{address}/stats?{query}", context=ctx, timeout=10) as r:
        data = r.read()
    return json.loads(data) if "json" in query else data.decode()


def https_address(daemon) -> str:
    return daemon.wait_output(r"HTTPS: listening on (\S+)").group(1)


# --- TLS ------------------------------------------------------------------------------


def test_tls_upgrade_after_identify(daemon_factory, certs) -> None:
    """tls_v1: the IDENTIFY answer in clear, then a TLS handshake, then OK and all traffic encrypted."""
    d = daemon_factory(*tls_args(certs))
    c = Client(d.tcp_address)
    assert negotiate(c, tls_v1=True)["tls_v1"] is True
    start_tls(c, client_context(certs))
    assert c.response() == OK
    c.pub("tls_t", b"secret body")
    c.sub("tls_t", "c", rdy=1)
    m = c.message()
    assert m.body == b"secret body"
    [client] = stats(d.http_address)["topics"][0]["channels"][0]["clients"]
    assert client["tls"] is True
    assert client["tls_version"] in ("TLS1.2", "TLS1.3")
    assert client["tls_cipher_suite"]
    c.close()


def test_https_listener_and_tls_required(daemon_factory, certs) -> None:
    """--tls-required=true: TCP commands need TLS, HTTP answers 403 TLS_REQUIRED, HTTPS serves."""
    d = daemon_factory(*tls_args(certs, "--tls-required"))
    https = https_address(d)
    c = Client(d.tcp_address)
    c.cmd("PUB", "t", body=b"x")
    assert c.read() == (ERROR, b"E_INVALID cannot PUB in current state (TLS required)")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://{d.http_address}/ping", timeout=10)
    assert e.value.code == 403
    port = int(https.rsplit(":", 1)[1])
    assert json.loads(e.value.read()) == {"message": "TLS_REQUIRED", "https_port": port}
    with urllib.request.urlopen(f"https://{https}/ping", context=client_context(certs), timeout=10) as r:
        assert r.read() == b"OK"
    # over TLS the same commands work
    c = Client(d.tcp_address)
    negotiate(c, tls_v1=True)
    start_tls(c, client_context(certs))
    assert c.response() == OK
    c.pub("t", b"x")


def test_tls_required_tcp_https_leaves_http_open(daemon_factory, certs) -> None:
    """--tls-required=tcp-https: plain HTTP still answers, TCP still needs TLS."""
    d = daemon_factory(*tls_args(certs, "--tls-required=tcp-https"))
    with urllib.request.urlopen(f"http://{d.http_address}/ping", timeout=10) as r:
        assert r.read() == b"OK"
    c = Client(d.tcp_address)
    c.cmd("SUB", "t", "c")
    assert c.read() == (ERROR, b"E_INVALID cannot SUB in current state (TLS required)")


def test_client_certificate_policy(daemon_factory, certs) -> None:
    """require-verify: a certificate from the root CA is let in, a stranger's or none is refused."""
    d = daemon_factory(*tls_args(certs, "--tls-client-auth-policy=require-verify",
                                 f"--tls-root-ca-file={certs.ca}"))
    c = Client(d.tcp_address)
    negotiate(c, tls_v1=True)
    start_tls(c, client_context(certs, certs.client_cert, certs.client_key))
    assert c.response() == OK
    for cert, key in ((certs.stranger_cert, certs.stranger_key), ("", "")):
        c = Client(d.tcp_address)
        negotiate(c, tls_v1=True)
        with pytest.raises((ssl.SSLError, Closed, ConnectionError, TimeoutError)):
            start_tls(c, client_context(certs, cert, key))
            c.response()  # TLS 1.3 reports the refusal on the first read
        c.close()


def test_tls_min_version(daemon_factory, certs) -> None:
    """--tls-min-version=tls1.3 refuses a client that speaks at most TLS 1.2."""
    d = daemon_factory(*tls_args(certs, "--tls-min-version=tls1.3"))
    old = client_context(certs)
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    c = Client(d.tcp_address)
    negotiate(c, tls_v1=True)
    with pytest.raises((ssl.SSLError, Closed, ConnectionError)):
        start_tls(c, old)
        c.response()
    c = Client(d.tcp_address)
    negotiate(c, tls_v1=True)
    start_tls(c, client_context(certs))
    assert c.response() == OK
    assert c.sock.version() == "TLSv1.3"


def test_bad_certificate_stops_the_daemon(tmp_path) -> None:
    """A certificate file that cannot be read ends nsqtw at once with Go nsqd's one FATAL line, status 1."""
    import os

    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", TWISTD, "--pidfile=", "-n", "nsqtw",
                        "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                        f"--data-path={tmp_path}", f"--tls-cert={tmp_path}/missing.pem",
                        f"--tls-key={tmp_path}/missing.key"],
                       cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("FATAL: failed to instantiate nsqd - failed to build TLS config - "), lines


# --- compression, raw ------------------------------------------------------------------


def test_tls_then_snappy_raw(daemon_factory, certs) -> None:
    """TLS first, then snappy inside it: both OKs arrive, the second one snappy-framed."""
    d = daemon_factory(*tls_args(certs))
    c = Client(d.tcp_address)
    answer = negotiate(c, tls_v1=True, snappy=True)
    assert (answer["tls_v1"], answer["snappy"]) == (True, True)
    start_tls(c, client_context(certs))
    # the first OK is plain inside TLS; read exactly its 10 bytes before switching
    raw = b""
    while len(raw) < 10:
        raw += c.sock.recv(10 - len(raw))
    assert raw == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    c.start_decoding(snappy.StreamDecompressor().decompress)
    compressor = snappy.StreamCompressor()
    c.encode = compressor.compress
    assert c.response() == OK
    c.pub("snap", b"s" * 5000)
    c.sub("snap", "c", rdy=1)
    assert c.message().body == b"s" * 5000


def test_deflate_raw(daemon_factory) -> None:
    """deflate: OK and messages decode as raw deflate at the asked level; our deflated commands work."""
    d = daemon_factory("--max-deflate-level=9")
    c = Client(d.tcp_address)
    answer = negotiate(c, deflate=True, deflate_level=9)
    assert (answer["deflate"], answer["deflate_level"]) == (True, 9)
    c.start_decoding(zlib.decompressobj(-zlib.MAX_WBITS).decompress)
    out = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    c.encode = lambda data: out.compress(data) + out.flush(zlib.Z_SYNC_FLUSH)
    assert c.response() == OK
    c.mpub("defl", [b"a" * 1000, b"b"])
    assert c.response() == OK
    c.sub("defl", "c", rdy=5)
    assert sorted(m.body for m in c.messages(2, fin=True)) == [b"a" * 1000, b"b"]


def test_both_compressions_refused(daemon_factory) -> None:
    """Asking for snappy and deflate together is E_IDENTIFY_FAILED, as nsqd."""
    d = daemon_factory()
    c = Client(d.tcp_address)
    c.cmd("IDENTIFY", body=b'{"feature_negotiation":true,"snappy":true,"deflate":true}')
    assert c.read() == (ERROR, b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression")


# --- pynsq ----------------------------------------------------------------------------------


@pytest.mark.parametrize("features", [
    {"snappy": True},
    {"deflate": True, "deflate_level": 3},
    {"tls_v1": True},
    {"tls_v1": True, "snappy": True},
    {"tls_v1": True, "deflate": True},
], ids=["snappy", "deflate", "tls", "tls+snappy", "tls+deflate"])
def test_pynsq_with_features(daemon_factory, certs, features) -> None:
    """pynsq's Writer and Reader negotiate each feature and move every message."""
    d = daemon_factory(*tls_args(certs))
    kw = dict(features)
    if kw.get("tls_v1"):
        kw["tls_options"] = {"ca_certs": certs.ca, "cert_reqs": ssl.CERT_REQUIRED}
    bodies = [b"m%d" % i + b"x" * (i * 100) for i in range(20)]
    assert publish(d.tcp_address, "feat", bodies[:10], **kw) == [b"OK"] * 10
    assert publish(d.tcp_address, "feat", bodies[10:], mpub=True, **kw) == [b"OK"]
    got = consume(d.tcp_address, "feat", "c", 20, max_in_flight=20, **kw)
    assert sorted(m.body for m in got) == sorted(bodies)
    log = d.read_output()
    upgrades = {"tls_v1": "upgrading connection to TLS", "snappy": "upgrading connection to snappy",
                "deflate": "upgrading connection to deflate (level "}
    for name, line in upgrades.items():
        # every connection (two writers, one reader) negotiated exactly what it asked for
        assert log.count(line) == (3 if name in features else 0), (name, log)


def test_pynsq_sample_rate(daemon_factory) -> None:
    """A Reader with sample_rate=25 gets about a quarter of the messages (nsqd drops the rest)."""
    d = daemon_factory()
    publish(d.tcp_address, "sample", [b"%d" % i for i in range(400)], mpub=True)
    got = consume(d.tcp_address, "sample", "c", 400, max_in_flight=100, sample_rate=25, timeout=4)
    assert 40 < len(got) < 200, len(got)
    # sampled-out messages are gone, not waiting to be sent again
    channel = stats(d.http_address)["topics"][0]["channels"][0]
    assert channel["depth"] + channel["in_flight_count"] + len(got) < 400


# --- AUTH ----------------------------------------------------------------------------------


class AuthServer:
    """A fake nsq auth server: answers /auth from ``grants[secret]`` and records each query."""

    def __init__(self, grants: dict[str, Any], hang: bool = False) -> None:
        self.grants = grants
        self.queries: list[dict[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query,
                                                       keep_blank_values=True).items()}
                outer.queries.append(query)
                if hang:
                    time.sleep(3)
                    return
                grant = outer.grants.get(query.get("secret", ""))
                code, body = (200, grant) if grant is not None else (403, {"message": "NOPE"})
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def auth_server() -> Iterator[AuthServer]:
    server = AuthServer({
        "writer": {"ttl": 60, "identity": "w", "identity_url": "http://id/w",
                   "authorizations": [{"topic": "^allowed", "channels": [".*"],
                                       "permissions": ["publish", "subscribe"]}]},
        "short": {"ttl": 1, "identity": "s", "authorizations": [
            {"topic": ".*", "channels": [".*"], "permissions": ["publish"]}]},
    })
    yield server
    server.close()


def test_auth_with_pynsq(daemon_factory, auth_server) -> None:
    """pynsq sends auth_secret after IDENTIFY; publishing and consuming an allowed topic work."""
    d = daemon_factory(f"--auth-http-address={auth_server.address}")
    assert publish(d.tcp_address, "allowed_t", [b"a", b"b"], auth_secret="writer") == [b"OK", b"OK"]
    got = consume(d.tcp_address, "allowed_t", "c", 2, auth_secret="writer")
    assert sorted(m.body for m in got) == [b"a", b"b"]
    assert {q["secret"] for q in auth_server.queries} == {"writer"}
    q = auth_server.queries[0]
    assert (q["remote_ip"], q["tls"], q["common_name"]) == ("127.0.0.1", "false", "")


def test_auth_raw_errors(daemon_factory, auth_server) -> None:
    """E_AUTH_FIRST, the AUTH answer, E_UNAUTHORIZED, E_AUTH_FAILED, and re-auth after the TTL."""
    d = daemon_factory(f"--auth-http-address={auth_server.address}")
    c = Client(d.tcp_address)
    assert negotiate(c)["auth_required"] is True
    c.cmd("PUB", "allowed", body=b"x")
    assert c.read() == (ERROR, b"E_AUTH_FIRST AUTH required before PUB")

    c = Client(d.tcp_address)
    c.cmd("AUTH", body=b"writer")
    assert c.read() == (0, b'{"identity":"w","identity_url":"http://id/w","permission_count":1}')
    c.pub("allowed_x", b"x")
    c.cmd("PUB", "other", body=b"x")
    assert c.read() == (ERROR, b'E_UNAUTHORIZED AUTH failed for PUB on "other" ""')

    c = Client(d.tcp_address)
    c.cmd("AUTH", body=b"unknown secret")
    assert c.read() == (ERROR, b"E_AUTH_FAILED AUTH failed")

    c = Client(d.tcp_address)
    c.cmd("AUTH", body=b"short")
    assert c.read()[0] == 0
    c.pub("any", b"1")
    time.sleep(1.2)  # past the 1s TTL: the next PUB asks the auth server again
    c.pub("any", b"2")
    assert [q["secret"] for q in auth_server.queries].count("short") == 2


def test_auth_server_down_or_hanging(daemon_factory, auth_server) -> None:
    """An auth server that refuses connections or never answers gives E_AUTH_FAILED, in bounded time."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead = f"127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    hanging = AuthServer({}, hang=True)
    try:
        for address in (dead, hanging.address):
            d = daemon_factory(f"--auth-http-address={address}", "--http-client-request-timeout=1s")
            c = Client(d.tcp_address, timeout=15)
            started = time.monotonic()
            c.cmd("AUTH", body=b"writer")
            assert c.read() == (ERROR, b"E_AUTH_FAILED AUTH failed")
            assert time.monotonic() - started < 10
            d.wait_output("AUTH failed")
    finally:
        hanging.close()


def test_auth_over_tls_with_client_certificate(daemon_factory, certs, auth_server) -> None:
    """Over TLS with a client certificate the auth server is told tls=true and the certificate's CN."""
    d = daemon_factory(*tls_args(certs, "--tls-client-auth-policy=require",
                                 f"--auth-http-address={auth_server.address}"))
    c = Client(d.tcp_address)
    negotiate(c, tls_v1=True)
    start_tls(c, client_context(certs, certs.client_cert, certs.client_key))
    assert c.response() == OK
    c.cmd("AUTH", body=b"writer")
    assert c.read()[0] == 0
    q = auth_server.queries[-1]
    assert (q["tls"], q["common_name"]) == ("true", "test-client")
    c.pub("allowed_tls", b"x")
    [producer] = stats(d.http_address)["producers"]
    assert (producer["tls"], producer["authed"], producer["auth_identity"]) == (True, True, "w")


# --- statsd and e2e --------------------------------------------------------------------------


def test_statsd_push(daemon_factory) -> None:
    """Every second nsqd's metrics arrive on a UDP socket, prefixed with the host key."""
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(1.0)
    try:
        d = daemon_factory(f"--statsd-address=127.0.0.1:{udp.getsockname()[1]}",
                           "--statsd-interval=1s", "--broadcast-address=127.0.0.1",
                           "--statsd-prefix=nsq.%s")
        publish(d.tcp_address, "st", [b"a", b"b", b"c"], mpub=True)
        Client(d.tcp_address).sub("st", "ch")
        prefix = f"nsq.127_0_0_1_{d.http[1]}."
        seen: dict[str, str] = {}
        deadline = time.monotonic() + 15
        # a push spans several datagrams: wait for every line asserted below
        while time.monotonic() < deadline and not (
                f"{prefix}topic.st.channel.ch.depth" in seen and f"{prefix}mem.gc_runs" in seen
                and f"{prefix}topic.st.channel.ch.clients" in seen
                and seen.get(f"{prefix}topic.st.message_count") == "3|c"):
            try:
                data = udp.recv(65536)
            except TimeoutError:
                continue
            assert len(data) <= 508
            for line in data.decode().splitlines():
                name, _, value = line.partition(":")
                if name == f"{prefix}topic.st.message_count" and value == "0|c":
                    continue  # a later push: nothing new
                seen[name] = value
        assert seen.get(f"{prefix}topic.st.message_count") == "3|c", seen
        assert re.fullmatch(r"\d+\|g", seen[f"{prefix}topic.st.channel.ch.depth"])
        assert seen[f"{prefix}topic.st.channel.ch.clients"].endswith("|g")
        assert seen[f"{prefix}mem.gc_runs"].endswith("|c")
        d.wait_output("STATSD: pushing stats to")
    finally:
        udp.close()


def test_e2e_latency_in_stats(daemon_factory) -> None:
    """With percentiles configured, /stats reports each channel's and topic's latency of finished messages."""
    d = daemon_factory("--e2e-processing-latency-percentile=1.0,0.5")
    publish(d.tcp_address, "lat", [b"%d" % i for i in range(10)], mpub=True)
    assert len(consume(d.tcp_address, "lat", "c", 10, max_in_flight=10)) == 10
    topic = stats(d.http_address)["topics"][0]
    for e2e in (topic["e2e_processing_latency"], topic["channels"][0]["e2e_processing_latency"]):
        assert e2e["count"] == 10
        assert [p["quantile"] for p in e2e["percentiles"]] == [1, 0.5]
        assert all(0 < p["value"] < 60e9 for p in e2e["percentiles"])
    text = stats(d.http_address, query="format=text")
    assert re.search(r"\[lat\s*\].*e2e%: [\d.]+(ns|us|ms|s), [\d.]+(ns|us|ms|s)", text), text
