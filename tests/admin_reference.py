"""One scenario against an NSQ cluster and nsqadmin, shared by the recorder and the tests.

``benchmarks/record_admin_reference.py`` runs it against Go nsqlookupd, two Go
nsqd and Go nsqadmin v1.3.0 and stores the answers in
``tests/reference/admin/responses.json``; ``tests/integration/test_admin_api.py``
runs it against nsqtw-lookupd, two nsqtw nodes and nsqtw-admin and compares.
Both sides are normalised the same way: addresses become their role
(``NSQD_A_HTTP``...), client ports, timestamps and durations placeholders,
and lists whose order Go leaves to chance (nodes answering concurrently,
hosts that sort equal) are sorted.
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.rawclient import Client, pub

REFERENCE = "admin/responses.json"


@dataclass
class Cluster:
    """Addresses of one running cluster (``host:port``) and the admins in front of it."""

    lookupd_http: str
    lookupd_tcp: str
    a_http: str
    a_tcp: str
    b_http: str
    b_tcp: str
    #: nsqadmin over the lookupd
    admin: str
    #: nsqadmin over the lookupd and a dead lookupd, with --admin-user=alice
    admin_acl: str
    #: nsqadmin over nsqd A and a dead nsqd, with --base-path=/adm
    admin_nsqd: str
    #: an address where nothing listens
    dead: str
    clients: list[Client] = field(default_factory=list)

    def roles(self) -> dict[str, str]:
        return {self.lookupd_http: "LOOKUPD_HTTP", self.lookupd_tcp: "LOOKUPD_TCP",
                self.a_http: "NSQD_A_HTTP", self.a_tcp: "NSQD_A_TCP",
                self.b_http: "NSQD_B_HTTP", self.b_tcp: "NSQD_B_TCP",
                self.admin: "ADMIN", self.admin_acl: "ADMIN_ACL", self.admin_nsqd: "ADMIN_NSQD",
                self.dead: "DEAD"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(method: str, url: str, body: bytes | None = None,
         headers: dict[str, str] | None = None, timeout: float = 20) -> tuple[int, str, bytes]:
    """One request without following redirects: (status, content type, body)."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


def get_json(url: str) -> Any:
    return json.loads(http("GET", url)[2])


def wait_for(check: Callable[[], Any], timeout: float = 20, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except (OSError, ValueError, KeyError, IndexError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _channel(stats: Any, topic: str, channel: str) -> dict[str, Any]:
    for t in stats["topics"]:
        if t["topic_name"] == topic:
            for c in t["channels"]:
                if c["channel_name"] == channel:
                    return dict(c)
    raise KeyError(channel)


def setup(c: Cluster) -> None:
    """Topics, channels, messages and one consumer, identical on any cluster; waits until settled."""
    for node in (c.a_http, c.b_http):
        http("POST", f"http://{node}/topic/create?topic=orders")
        http("POST", f"http://{node}/channel/create?topic=orders&channel=billing")
    http("POST", f"http://{c.b_http}/channel/create?topic=orders&channel=audit")
    http("POST", f"http://{c.a_http}/topic/create?topic=events")
    http("POST", f"http://{c.a_http}/channel/create?topic=events&channel=web")
    pub(c.a_tcp, "orders", b"a1", b"a2", b"a3")
    pub(c.b_tcp, "orders", b"b1", b"b2")
    pub(c.a_tcp, "events", b"e1")
    # one consumer on A's orders/billing that holds one message in flight
    client = Client(c.a_tcp)
    client.identify(client_id="ref-client", hostname="ref-host", user_agent="ref-agent/1.0",
                    feature_negotiation=True)
    client.sub("orders", "billing", rdy=1)
    client.message(timeout=10)
    c.clients.append(client)
    wait_for(lambda: _channel(get_json(f"http://{c.a_http}/stats?format=json"),
                              "orders", "billing")["in_flight_count"] == 1, what="in flight")
    wait_for(lambda: _channel(get_json(f"http://{c.b_http}/stats?format=json"),
                              "orders", "audit")["depth"] == 2, what="B's audit depth")
    wait_for(lambda: len(get_json(f"http://{c.lookupd_http}/lookup?topic=orders")["producers"]) == 2
             and "audit" in get_json(f"http://{c.lookupd_http}/channels?topic=orders")["channels"]
             and get_json(f"http://{c.lookupd_http}/lookup?topic=events")["producers"],
             what="lookupd registrations")


def teardown(c: Cluster) -> None:
    for client in c.clients:
        client.close()
    c.clients.clear()


#: (name, admin, method, path, body, headers); ``admin`` names a Cluster field
Step = tuple[str, str, str, str, bytes | None, dict[str, str]]

_J = {"Content-Type": "application/json"}


def steps(c: Cluster) -> list[Step]:
    """Every request of the scenario, in order (actions change the cluster for later steps)."""
    a, b, dead = c.a_http, c.b_http, c.dead
    alice = {"X-Forwarded-User": "alice", **_J}
    return [
        ("ping", "admin", "GET", "/ping", None, {}),
        ("create ghost topic and channel", "admin", "POST", "/api/topics",
         b'{"topic":"ghost","channel":"ch"}', _J),
        ("topics", "admin", "GET", "/api/topics", None, {}),
        ("inactive topics", "admin", "GET", "/api/topics?inactive=true", None, {}),
        ("topic on two nodes", "admin", "GET", "/api/topics/orders", None, {}),
        ("topic on one node", "admin", "GET", "/api/topics/events", None, {}),
        ("channel on two nodes", "admin", "GET", "/api/topics/orders/billing", None, {}),
        ("channel on one node", "admin", "GET", "/api/topics/orders/audit", None, {}),
        ("unknown channel", "admin", "GET", "/api/topics/orders/nope", None, {}),
        ("unknown topic", "admin", "GET", "/api/topics/nope", None, {}),
        ("topic without producers", "admin", "GET", "/api/topics/ghost", None, {}),
        ("nodes", "admin", "GET", "/api/nodes", None, {}),
        ("node", "admin", "GET", f"/api/nodes/{a}", None, {}),
        ("unknown node", "admin", "GET", f"/api/nodes/{dead}", None, {}),
        ("counter", "admin", "GET", "/api/counter", None, {}),
        ("config lookupds", "admin", "GET", "/config/nsqlookupd_http_addresses", None, {}),
        ("config nsqds", "admin", "GET", "/config/nsqd_http_addresses", None, {}),
        ("config log level", "admin", "GET", "/config/log_level", None, {}),
        ("config statsd interval", "admin", "GET", "/config/statsd_interval", None, {}),
        ("config statsd prefix", "admin", "GET", "/config/statsd_prefix", None, {}),
        ("config acl header", "admin", "GET", "/config/acl_http_header", None, {}),
        ("config admin users", "admin", "GET", "/config/admin_users", None, {}),
        ("config proxy graphite", "admin", "GET", "/config/proxy_graphite", None, {}),
        ("config unknown", "admin", "GET", "/config/nope", None, {}),
        ("config put log level", "admin", "PUT", "/config/log_level", b"warn", {}),
        ("config put bad log level", "admin", "PUT", "/config/log_level", b"loud", {}),
        ("config put log level back", "admin", "PUT", "/config/log_level", b"info", {}),
        ("config put read-only", "admin", "PUT", "/config/http_address", b"x", {}),
        ("config put empty", "admin", "PUT", "/config/log_level", b"", {}),
        ("config put lookupds", "admin", "PUT", "/config/nsqlookupd_http_addresses",
         json.dumps([c.lookupd_http]).encode(), {}),
        ("pause channel", "admin", "POST", "/api/topics/orders/billing", b'{"action":"pause"}', _J),
        ("paused channel", "admin", "GET", "/api/topics/orders/billing", None, {}),
        ("pause channel missing on a node", "admin", "POST", "/api/topics/orders/audit",
         b'{"action":"pause"}', _J),
        ("unpause channel", "admin", "POST", "/api/topics/orders/billing",
         b'{"action":"unpause"}', _J),
        ("pause topic", "admin", "POST", "/api/topics/events", b'{"action":"pause"}', _J),
        ("paused topic", "admin", "GET", "/api/topics/events", None, {}),
        ("unpause topic", "admin", "POST", "/api/topics/events", b'{"action":"unpause"}', _J),
        ("empty channel", "admin", "POST", "/api/topics/orders/audit", b'{"action":"empty"}', _J),
        ("emptied channel", "admin", "GET", "/api/topics/orders/audit", None, {}),
        ("empty topic", "admin", "POST", "/api/topics/events", b'{"action":"empty"}', _J),
        ("action on unknown topic", "admin", "POST", "/api/topics/nope", b'{"action":"pause"}', _J),
        ("unknown action", "admin", "POST", "/api/topics/orders", b'{"action":"explode"}', _J),
        ("action without body", "admin", "POST", "/api/topics/orders", b"", _J),
        ("action with cut body", "admin", "POST", "/api/topics/orders", b'{"action":', _J),
        ("create bad topic", "admin", "POST", "/api/topics", b'{"topic":"bad!"}', _J),
        ("create bad channel", "admin", "POST", "/api/topics",
         b'{"topic":"fine","channel":"bad!"}', _J),
        ("delete channel", "admin", "DELETE", "/api/topics/orders/audit", None, _J),
        ("deleted channel", "admin", "GET", "/api/topics/orders/audit", None, {}),
        ("tombstone bad body", "admin", "DELETE", f"/api/nodes/{b}", b"nope", _J),
        ("tombstone bad topic", "admin", "DELETE", f"/api/nodes/{b}", b'{"topic":"bad!"}', _J),
        ("tombstone", "admin", "DELETE", f"/api/nodes/{b}", b'{"topic":"orders"}', _J),
        ("nodes after tombstone", "admin", "GET", "/api/nodes", None, {}),
        ("delete topic", "admin", "DELETE", "/api/topics/events", None, _J),
        ("delete unknown topic", "admin", "DELETE", "/api/topics/nope", None, _J),
        ("graphite without metric", "admin", "GET", "/api/graphite", None, {}),
        ("graphite without target", "admin", "GET", "/api/graphite?metric=rate", None, {}),
        ("unknown path", "admin", "GET", "/nope", None, {}),
        ("unknown api path", "admin", "GET", "/api/nope", None, {}),
        ("wrong method", "admin", "PUT", "/api/topics", b"", {}),
        ("trailing slash", "admin", "GET", "/api/topics/", None, {}),
        ("unknown asset", "admin", "GET", "/static/nope.js", None, {}),
        # a dead lookupd next to the live one, and only alice may act
        ("partial topics", "admin_acl", "GET", "/api/topics", None, {}),
        ("partial nodes", "admin_acl", "GET", "/api/nodes", None, {}),
        ("partial topic", "admin_acl", "GET", "/api/topics/orders", None, {}),
        ("forbidden action", "admin_acl", "POST", "/api/topics/orders", b'{"action":"pause"}', _J),
        ("forbidden delete", "admin_acl", "DELETE", "/api/topics/orders", None, _J),
        ("forbidden create", "admin_acl", "POST", "/api/topics", b'{"topic":"x"}', _J),
        ("admin action with partial result", "admin_acl", "POST", "/api/topics/orders",
         b'{"action":"unpause"}', alice),
        # nsqd mode under /adm: node A and a dead node
        ("base path ping", "admin_nsqd", "GET", "/adm/ping", None, {}),
        ("no route outside the base path", "admin_nsqd", "GET", "/api/topics", None, {}),
        ("base path slash", "admin_nsqd", "GET", "/adm/", None, {}),
        ("nsqd mode topics", "admin_nsqd", "GET", "/adm/api/topics", None, {}),
        ("nsqd mode nodes", "admin_nsqd", "GET", "/adm/api/nodes", None, {}),
        ("nsqd mode topic", "admin_nsqd", "GET", "/adm/api/topics/orders", None, {}),
        ("nsqd mode channel", "admin_nsqd", "GET", "/adm/api/topics/orders/billing", None, {}),
        ("nsqd mode node", "admin_nsqd", "GET", f"/adm/api/nodes/{a}", None, {}),
        ("nsqd mode action", "admin_nsqd", "POST", "/adm/api/topics/orders",
         b'{"action":"unpause"}', _J),
        ("nsqd mode counter", "admin_nsqd", "GET", "/adm/api/counter", None, {}),
    ]


def run(c: Cluster, pause: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Every step's normalised answer: name, request, status, content type, body."""
    out = []
    roles = c.roles()
    for name, which, method, path, body, headers in steps(c):
        base = getattr(c, which)
        status, ctype, raw = http(method, f"http://{base}{path}", body, headers)
        if pause is not None:
            pause(name)
        out.append({
            "name": name, "admin": which, "method": method, "path": normalise(path, roles),
            "status": status, "content_type": ctype, "body": normalise(decode(raw), roles),
        })
    return out


def decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return {"text": raw.decode("utf-8", "replace")}


_VOLATILE_INTS = {"connect_ts": "TS", "connected": "DURATION"}
_PORT_KEYS = ("tcp_port", "http_port")


def normalise(value: Any, roles: dict[str, str], key: str = "") -> Any:
    """Roles for addresses, placeholders for what changes run to run, chance-ordered lists sorted."""
    host = socket.gethostname()
    if isinstance(value, str):
        for address, role in sorted(roles.items(), key=lambda kv: -len(kv[0])):
            value = value.replace(address, role)
        value = re.sub(r"127\.0\.0\.1:\d{4,5}", "REMOTE", value)
        if value == host:
            value = "HOSTNAME"
        return value
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if key in _VOLATILE_INTS:
            return _VOLATILE_INTS[key]
        if key in _PORT_KEYS:
            for address, role in roles.items():
                if address.endswith(f":{value}"):
                    return role
        return value
    if isinstance(value, list):
        items = [normalise(v, roles, key) for v in value]
        if key in ("nodes", "clients", "channels", "remote_addresses", "topics"):
            items.sort(key=lambda v: json.dumps(_sort_key(v), sort_keys=True))
        return items
    if isinstance(value, dict):
        # a key may hold an address too (/api/counter's topic:channel:node); keys sort as Go's map
        out = {normalise(k, roles): normalise(v, roles, k) for k, v in value.items()}
        return dict(sorted(out.items())) if key == "stats" else out
    return value


def _sort_key(v: Any) -> Any:
    if isinstance(v, dict):
        return [v.get(k) for k in ("node", "channel_name", "topic_name", "http_port", "topic",
                                   "remote_address") if k in v]
    return v


def loosen(step_name: str, body: Any) -> Any:
    """What of an answer is compared: all of it, except where Go's answer depends on chance.

    Go's topic answer reuses the first answering node's channel entry as the
    cluster total (aggregate.py says more), so in topic answers each node's
    channel list is compared by names and the totals without their ``nodes``.
    An action's ``results`` (what each request did) are nsqtw's addition, left
    out here and checked by tests/integration/test_admin_trust.py.
    """
    if isinstance(body, dict) and "results" in body:
        body = {k: v for k, v in body.items() if k != "results"}
    if not isinstance(body, dict) or "channels" not in body or "channel_name" in body \
            or not isinstance(body.get("nodes"), list):
        return body
    body = dict(body)
    body["nodes"] = [dict(n, channels=sorted(ch["channel_name"] for ch in n["channels"] or ()))
                     for n in body["nodes"]]
    body["channels"] = [{k: v for k, v in ch.items() if k != "nodes"}
                        for ch in body["channels"] or ()]
    return body
