"""nsqd's auth client (treq) against a fake auth server: a Klein app on 127.0.0.1, port 0."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import pytest_twisted
from klein import Klein
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.web.server import NOT_DONE_YET, Site

from nsqtw.protocol.auth import AuthError, HTTPAuthorizer, parse_auth_response

GRANT = {"ttl": 30, "identity": "alice", "identity_url": "http://id/alice",
         "authorizations": [{"topic": "^t", "channels": [".*"], "permissions": ["publish"]}]}


class FakeAuthServer:
    """Answers /auth with ``answer`` (or hangs when it is None) and records every request."""

    app = Klein()

    def __init__(self, answer: Any = GRANT, status: int = 200, tls: Any = None) -> None:
        self.answer = answer
        self.status = status
        self.requests: list[dict[str, Any]] = []
        site = Site(self.app.resource())
        if tls is None:
            self.port = reactor.listenTCP(0, site, interface="127.0.0.1")
        else:
            self.port = reactor.listenSSL(0, site, tls, interface="127.0.0.1")
        self.address = f"127.0.0.1:{self.port.getHost().port}"

    @app.route("/auth", methods=["GET", "POST"])
    def auth(self, request: Any) -> Any:
        self.requests.append({
            "method": request.method.decode(),
            "uri": request.uri.decode(),
            "accept": request.getHeader(b"accept"),
            "content_type": request.getHeader(b"content-type"),
            "body": request.content.read(),
        })
        if self.answer is None:
            return NOT_DONE_YET  # never answers
        request.setResponseCode(self.status)
        return json.dumps(self.answer).encode()


@pytest.fixture
def servers():
    started: list[FakeAuthServer] = []

    def start(*args: Any, **kw: Any) -> FakeAuthServer:
        s = FakeAuthServer(*args, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        pytest_twisted.blockon(s.port.stopListening())


def authorizer(*addresses: str, method: str = "get", timeout: float = 5.0) -> HTTPAuthorizer:
    return HTTPAuthorizer(addresses, method, 2.0, timeout, reactor)


@pytest_twisted.ensureDeferred
async def test_get_request_and_answer(servers) -> None:
    """GET /auth with nsqd's sorted, escaped query and Accept header; the answer becomes an AuthState."""
    server = servers()
    state = await authorizer(server.address).query("127.0.0.1", True, "s e&cret", "cn")
    [req] = server.requests
    assert req["method"] == "GET"
    assert req["uri"] == "/auth?common_name=cn&remote_ip=127.0.0.1&secret=s+e%26cret&tls=true"
    assert req["accept"] == b"application/vnd.nsq; version=1.0"
    assert (state.identity, state.ttl, len(state.authorizations)) == ("alice", 30, 1)
    assert state.is_allowed("topic", "") and not state.is_allowed("topic", "c")
    assert not state.expired(time.time()) and state.expired(time.time() + 31)


@pytest_twisted.ensureDeferred
async def test_post_sends_json_of_lists(servers) -> None:
    """--auth-http-request-method=post sends the values as Go's JSON of url.Values to /auth."""
    server = servers()
    await authorizer(server.address, method="post").query("10.0.0.1", False, "x", "")
    [req] = server.requests
    assert (req["method"], req["uri"], req["content_type"]) == ("POST", "/auth", b"application/json")
    assert json.loads(req["body"]) == {"common_name": [""], "remote_ip": ["10.0.0.1"],
                                       "secret": ["x"], "tls": ["false"]}


@pytest_twisted.ensureDeferred
async def test_url_address_used_as_is(servers) -> None:
    """An address with a scheme is the endpoint itself (nsqd's rule), the query appended."""
    server = servers()
    await authorizer(f"http://{server.address}/auth").query("1.2.3.4", False, "s", "")
    assert server.requests[0]["uri"].startswith("/auth?common_name=")


@pytest_twisted.ensureDeferred
async def test_failover_and_errors(servers) -> None:
    """A failing server is skipped for the next; when all fail the error names each one."""
    bad = servers(answer={"message": "NOPE"}, status=403)
    good = servers()
    for _ in range(4):  # whichever server is tried first, the answer comes from the good one
        state = await authorizer(bad.address, good.address).query("1.2.3.4", False, "s", "")
        assert state.identity == "alice"
    with pytest.raises(AuthError) as e:
        await authorizer(bad.address, "127.0.0.1:1").query("1.2.3.4", False, "s", "")
    assert "got response 403" in str(e.value)
    assert "failed to auth against 127.0.0.1:1" in str(e.value)


@pytest_twisted.ensureDeferred
async def test_403_with_https_port_retries_over_https(servers, tmp_path) -> None:
    """Like nsqd's HTTP client: a 403 naming an https_port is asked again over HTTPS there."""
    from twisted.internet import ssl

    from nsqtw.net.tls import client_trust_root
    from tests.certs import make_certs

    certs = make_certs(str(tmp_path))
    with open(certs.server_key) as k, open(certs.server_cert) as c:
        server_tls = ssl.PrivateCertificate.loadPEM(k.read() + c.read()).options()
    secure = servers(tls=server_tls)
    plain = servers(answer={"message": "TLS_REQUIRED", "https_port": secure.port.getHost().port},
                    status=403)
    auth = HTTPAuthorizer([plain.address], "get", 2.0, 5.0, reactor, client_trust_root(certs.ca))
    state = await auth.query("1.2.3.4", True, "s", "")
    assert state.identity == "alice"
    assert len(plain.requests) == len(secure.requests) == 1
    assert secure.requests[0]["uri"] == plain.requests[0]["uri"]


@pytest_twisted.ensureDeferred
async def test_hanging_server_times_out(servers) -> None:
    """A server that never answers fails after --http-client-request-timeout, not never."""
    server = servers(answer=None)
    started = time.monotonic()
    with pytest.raises(AuthError):
        await authorizer(server.address, timeout=0.5).query("1.2.3.4", False, "s", "")
    assert time.monotonic() - started < 10
    # let the server's half-open request go away with the test
    d: Deferred[None] = Deferred()
    reactor.callLater(0.05, d.callback, None)
    await d


def test_parse_auth_response_rules() -> None:
    """nsqd's checks: TTL > 0, known permissions, compilable patterns, JSON types."""
    ok = parse_auth_response(json.dumps(GRANT).encode(), 100.0)
    assert ok.expires == 130.0
    bad = [
        b"not json",
        b"[]",
        json.dumps({**GRANT, "ttl": 0}).encode(),
        json.dumps({**GRANT, "ttl": "10"}).encode(),
        json.dumps({**GRANT, "authorizations": [{"topic": "(", "channels": [], "permissions": []}]}).encode(),
        json.dumps({**GRANT, "authorizations": [{"topic": "t", "channels": ["["], "permissions": []}]}).encode(),
        json.dumps({**GRANT, "authorizations": [{"topic": "t", "channels": [], "permissions": ["admin"]}]}).encode(),
    ]
    for body in bad:
        with pytest.raises(AuthError):
            parse_auth_response(body, 0.0)
    # Go's decoder matches keys regardless of case
    assert parse_auth_response(b'{"TTL": 5, "Identity": "x"}', 0.0).identity == "x"
