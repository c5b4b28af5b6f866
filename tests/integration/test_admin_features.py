"""nsqtw-admin's command line and the features the recorded scenario does not reach.

Notifications of admin actions, graphite (``/api/graphite`` and the
``--proxy-graphite`` /render proxy) against a small fake graphite, the
``/config`` CIDR check, a TOML ``--config`` file, ``/api/history`` and the
start-up errors nsqadmin gives, all against real daemons on loopback.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.admin_reference import get_json, http, wait_for
from tests.daemon import ROOT, TWISTD, AdminDaemon, Daemon, LookupdDaemon


class _Recorder(BaseHTTPRequestHandler):
    """A fake graphite and notification endpoint: records requests, answers a fixed render."""

    seen: list[tuple[str, str, dict[str, str], bytes]] = []

    def _record(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.seen.append((self.command, self.path, dict(self.headers), body))

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._record()
        body = json.dumps([{"target": "x", "datapoints": [[120.0, 1], [None, 2]]}]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        self._record()
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture(scope="module")
def recorder() -> Iterator[tuple[str, list[tuple[str, str, dict[str, str], bytes]]]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}", _Recorder.seen
    server.shutdown()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            recorder: tuple[str, list[Any]]) -> Iterator[dict[str, Daemon]]:
    root = tmp_path_factory.mktemp("admin-features")
    started: list[Daemon] = []

    def start(name: str, daemon: Daemon) -> Daemon:
        started.append(daemon)
        return daemon.start()

    def folder(name: str) -> str:
        (root / name).mkdir()
        return str(root / name)

    graphite, _ = recorder
    config = root / "nsqadmin.cfg"
    try:
        lookupd = start("lookupd", LookupdDaemon(folder("lookupd")))
        node = start("node", Daemon(folder("node"), f"--lookupd-tcp-address={lookupd.tcp_address}",
                                    "--broadcast-address=127.0.0.1"))
        config.write_text(f'nsqlookupd_http_addresses = ["{lookupd.http_address}"]\n'
                          f'notification_http_endpoint = "http://{graphite}/notify"\n'
                          'statsd_interval = "10s"\n'
                          f'graphite_url = "http://user:secret@{graphite}"\n'
                          'proxy_graphite = true\n'
                          'allow_config_from_cidr = "10.0.0.0/8"\n')
        admin = start("admin", AdminDaemon(folder("admin"), f"--config={config}",
                                           "--history-interval=1s", "--history-window=5s"))
        http("POST", f"http://{node.http_address}/topic/create?topic=t")
        http("POST", f"http://{node.http_address}/channel/create?topic=t&channel=c")
        wait_for(lambda: get_json(f"http://{lookupd.http_address}/channels?topic=t")["channels"],
                 what="registration")
        yield {"lookupd": lookupd, "node": node, "admin": admin}
    finally:
        for d in reversed(started):
            d.stop()


def test_actions_are_notified(cluster: dict[str, Daemon], recorder: tuple[str, list[Any]]) -> None:
    """Each action POSTs nsqadmin's AdminAction JSON to --notification-http-endpoint (user from basic auth)."""
    _, seen = recorder
    admin = cluster["admin"].http_address
    status, _, body = http("POST", f"http://{admin}/api/topics/t/c", b'{"action":"pause"}',
                           {"Authorization": "Basic YWxpY2U6cHc=", "User-Agent": "tester/1",
                            "Content-Type": "application/json"})
    answer = json.loads(body)
    assert (status, answer["message"]) == (200, "")
    assert [(r["request"], r["ok"]) for r in answer["results"]] == [("channel/pause", True)]
    posted = wait_for(lambda: [s for s in seen if s[0] == "POST" and s[1] == "/notify"], what="notification")
    event = json.loads(posted[-1][3])
    assert list(event) == ["action", "topic", "channel", "timestamp", "user", "remote_ip",
                           "user_agent", "url", "via"]
    assert (event["action"], event["topic"], event["channel"], event["user"]) == (
        "pause_channel", "t", "c", "alice")
    assert event["url"] == f"http://{admin}/api/topics/t/c"
    assert event["user_agent"] == "tester/1"
    assert get_json(f"http://{cluster['node'].http_address}/stats?format=json")["topics"][0][
        "channels"][0]["paused"] is True


def test_graphite_rate_and_proxy(cluster: dict[str, Daemon], recorder: tuple[str, list[Any]]) -> None:
    """/api/graphite asks graphite's /render for the last statsd interval; /render is proxied with basic auth."""
    _, seen = recorder
    admin = cluster["admin"].http_address
    status, _, body = http("GET", f"http://{admin}/api/graphite?metric=rate&target=foo.bar")
    assert (status, json.loads(body)) == (200, {"rate": "12.00"})  # 120 per 10s interval
    render = [s for s in seen if s[1].startswith("/render?")][-1]
    assert render[1] == "/render?format=json&from=-20sec&target=foo.bar&until=-10sec"
    status, _, body = http("GET", f"http://{admin}/render?target=x&format=json")
    assert status == 200 and json.loads(body)[0]["target"] == "x"
    proxied = [s for s in seen if s[1] == "/render?target=x&format=json"][-1]
    assert proxied[2].get("Authorization") == "Basic dXNlcjpzZWNyZXQ="


def test_config_is_refused_outside_the_cidr(cluster: dict[str, Daemon]) -> None:
    """With --allow-config-from-cidr=10.0.0.0/8, a loopback client gets 403 FORBIDDEN from /config."""
    status, _, body = http("GET", f"http://{cluster['admin'].http_address}/config/log_level")
    assert (status, json.loads(body)) == (403, {"message": "FORBIDDEN"})


def test_history_keeps_a_bounded_window(cluster: dict[str, Daemon]) -> None:
    """/api/history gives the channel's points, at most window/interval + 1 of them, with rates."""
    from tests.rawclient import pub

    node = cluster["node"]
    admin = cluster["admin"].http_address
    wait_for(lambda: len(get_json(f"http://{admin}/api/history?topic=t&channel=c")["points"]) >= 2,
             what="two points")
    pub(node.tcp_address, "t", *[b"x"] * 50)
    got = wait_for(lambda: [p for p in get_json(f"http://{admin}/api/history?topic=t&channel=c")["points"]
                            if p["messages"] == 50 and p["rate"]], what="a rate")
    assert got[0]["depth"] == 50
    wait_for(lambda: len(get_json(f"http://{admin}/api/history")["points"]) == 6, timeout=15,
             what="a full window")
    assert len(get_json(f"http://{admin}/api/history")["points"]) == 6


def _twistd(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", TWISTD, "--pidfile=", "-n", "nsqtw-admin", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("args", "message"), [
    ((), "--nsqd-http-address or --lookupd-http-address required"),
    (("--nsqd-http-address=127.0.0.1:1", "--lookupd-http-address=127.0.0.1:2"),
     "use --nsqd-http-address or --lookupd-http-address not both"),
    (("--nsqd-http-address=127.0.0.1:1", "--http-client-tls-cert=x"),
     "--http-client-tls-key must be specified with --http-client-tls-cert"),
    (("--nsqd-http-address=127.0.0.1:1", "--allow-config-from-cidr=zz"),
     "failed to parse --allow-config-from-cidr (zz) - invalid CIDR address: zz"),
    (("--nsqd-http-address=nosuchhost.invalid:1",),
     "failed to resolve --nsqd-http-address (nosuchhost.invalid:1)"),
    (("--lookupd-http-address=127.0.0.1:1", "--bogus"), "flag provided but not defined: -bogus"),
])
def test_start_up_errors(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    """nsqadmin's start-up checks: exit status 1 and its message, before anything listens."""
    done = _twistd(*args, "--http-address=127.0.0.1:0", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert message in done.stderr + done.stdout


def test_help_and_version(tmp_path: Path) -> None:
    """--help lists nsqadmin's flags with their defaults; --version prints Go's banner shape."""
    done = _twistd("--help", cwd=tmp_path)
    assert done.returncode == 0
    assert done.stdout.splitlines()[0] == "Usage: twistd nsqtw-admin [flags]"
    for flag in ("--http-address string", "(default \"0.0.0.0:4171\")", "--lookupd-http-address value",
                 "--acl-http-header", "(default \"X-Forwarded-User\")", "--statsd-interval duration"):
        assert flag in done.stdout
    done = _twistd("--version", "--lookupd-http-address=127.0.0.1:1", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("nsqadmin v1.3.0 (built w/nsqtw-")


def test_dev_static_dir(tmp_path: Path) -> None:
    """--dev-static-dir serves the page and assets from a folder; names outside it are 404 NOT_FOUND."""
    static = tmp_path / "static"
    static.mkdir()
    (static / "admin.js").write_text("// edited\n")
    (static / "index.html").write_text("<p>{{STATIC}}</p>")
    admin = AdminDaemon(str(tmp_path), "--nsqd-http-address=127.0.0.1:1", f"--dev-static-dir={static}",
                        "--history-interval=0")
    admin.start()
    try:
        base = f"http://{admin.http_address}"
        assert http("GET", f"{base}/static/admin.js")[::2] == (200, b"// edited\n")
        assert http("GET", f"{base}/topics")[2] == b"<p>/static</p>"
        assert http("GET", f"{base}/static/..%2Findex.html")[0] == 404
        assert http("GET", f"{base}/static/index.html")[::2] == (404, b"NOT_FOUND")
        assert http("GET", f"{base}/static/nope.css")[::2] == (404, b"NOT_FOUND")
    finally:
        admin.stop()


def test_https_nodes(tmp_path: Path) -> None:
    """A node that requires TLS answers 403 with its https_port; the admin asks again over https,
    verifying it against --http-client-tls-root-ca-file and offering --http-client-tls-cert; without
    the CA the node's certificate is refused, with --http-client-tls-insecure-skip-verify it is not."""
    from tests.certs import make_certs

    certs = make_certs(str(tmp_path))
    (tmp_path / "node").mkdir()
    node = Daemon(str(tmp_path / "node"), f"--tls-cert={certs.server_cert}", f"--tls-key={certs.server_key}",
                  "--https-address=127.0.0.1:0", "--tls-required=true",
                  "--tls-client-auth-policy=require-verify", f"--tls-root-ca-file={certs.ca}")
    node.start()
    admins = []
    try:
        client_cert = (f"--http-client-tls-cert={certs.client_cert}",
                       f"--http-client-tls-key={certs.client_key}")
        for name, flags in (("verified", (f"--http-client-tls-root-ca-file={certs.ca}", *client_cert)),
                            ("unknown-ca", client_cert),
                            ("skip-verify", ("--http-client-tls-insecure-skip-verify", *client_cert))):
            (tmp_path / name).mkdir()
            admins.append(AdminDaemon(str(tmp_path / name), f"--nsqd-http-address={node.http_address}",
                                      "--history-interval=0", *flags).start())
        verified, unknown, skip = (f"http://{a.http_address}/api/nodes" for a in admins)
        status, _, body = http("GET", verified)
        assert status == 200, body
        assert json.loads(body)["nodes"][0]["tcp_port"] == node.tcp[1]
        status, _, body = http("GET", unknown)
        assert status == 502 and b"https://127.0.0.1:" in body, body
        assert http("GET", skip)[0] == 200
    finally:
        for a in admins:
            a.stop()
        node.stop()
