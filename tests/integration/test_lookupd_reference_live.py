"""Go nsqlookupd v1.3.0's recorded answers replayed against a live nsqtw-lookupd.

The HTTP answers were recorded with one nsqd registered (topic ``lk_t``,
channel ``lk_c``); here a live nsqtw node plays that nsqd. Values that differ
from run to run (ports, hostname, the node's remote address and last PING)
are put into the recorded bodies, which must then match byte for byte.
"""

from __future__ import annotations

import json
import socket
import struct
import urllib.error
import urllib.request

from tests.helpers import reference
from tests.integration.test_cluster_live import get, http, post, wait_for
from tests.rawclient import read_lookupd_response

REF = reference("nsqlookupd-1.3.0-responses.json")
CLOSED = "<connection closed>"


def test_http_answers_byte_for_byte(daemon_factory, lookupd_factory) -> None:
    """Every recorded HTTP request gets the recorded status, content type and body."""
    lookupd = lookupd_factory("--broadcast-address=127.0.0.1")
    node = daemon_factory("--broadcast-address=127.0.0.1",
                          f"--lookupd-tcp-address={lookupd.tcp_address}")
    post(node.http_address, "/topic/create?topic=lk_t")
    post(node.http_address, "/channel/create?topic=lk_t&channel=lk_c")
    wait_for("lk_c registered", lambda: get(lookupd.http_address, "/debug").get("channel:lk_t:lk_c"))
    [peer] = get(lookupd.http_address, "/debug")["client::"]
    values = {
        "127.0.0.1:54818": peer["id"],
        '"hostname":"vm"': '"hostname":' + json.dumps(peer["hostname"]),
        "37343": str(node.tcp[1]),
        "37791": str(node.http[1]),
    }
    for case in REF["http"]:
        method, path = case["request"].split(" ", 1)
        for old, new in values.items():
            path = path.replace(old, new)
        code, body, content_type = _request(lookupd.http_address, method, path)
        want = case["body"]
        for old, new in values.items():
            want = want.replace(old, new)
        if path == "/debug":
            # the last PING time is the live node's; the rest must match byte for byte
            last = json.loads(body)["client::"][0]["last_update"]
            want = want.replace("1795341387813844550", str(last))
        assert (code, content_type, body.decode()) == (case["status"], case["content_type"], want), \
            case["request"]


def _request(address: str, method: str, path: str) -> tuple[int, bytes, str | None]:
    req = urllib.request.Request(f"http://{address}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read(), r.headers.get("Content-Type")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("Content-Type")


def test_tcp_answers_byte_for_byte(lookupd_factory) -> None:
    """Every recorded V1 exchange over a real socket gets the recorded bytes, closes included."""
    lookupd = lookupd_factory("--broadcast-address=127.0.0.1")
    hostname = socket.gethostname()
    sock: socket.socket | None = None
    for case in REF["tcp_v1"]:
        if sock is None or case["note"] == "IDENTIFY":
            if sock is not None:
                sock.close()
            sock = socket.create_connection(("127.0.0.1", lookupd.tcp[1]), timeout=10)
            sock.sendall(b"  V1")
        want = case["received"]
        closes = want.endswith(CLOSED)
        want = want.removesuffix(CLOSED)
        if want.startswith("\x00\x00\x00f{"):
            body = want[4:].replace('"hostname":"vm"', f'"hostname":"{hostname}"')
            body = body.replace("39703", str(lookupd.http[1])).replace("38645", str(lookupd.tcp[1]))
            want = struct.pack(">i", len(body)).decode("latin-1") + body
        sock.sendall(case["sent"].encode("latin-1"))
        got = read_lookupd_response(sock)
        assert got == want.encode("latin-1"), case["note"]
        if closes:
            assert sock.recv(1) == b"", case["note"]
            sock.close()
            sock = None
    if sock is not None:
        sock.close()
    code, _ = http(lookupd.http_address, "GET", "/ping")
    assert code == 200
