"""``--replica-secret-file`` on real processes: nsqtw-lookupd and nsqtw nodes on loopback, port 0.

- Nodes that share the secret replicate as without it; nodes whose secrets
  differ refuse each other's links, each logs why, and a publish is refused
  after ``--replica-wait`` as with no peer at all.
- Whoever reaches a node's HTTP port can open a link and send it a ``TAKEN``
  notice naming its messages, which the node then leaves out: without a
  secret, such a message is never delivered again; with one, the link is
  refused and the message comes back.

The proof itself (roles, nonces, replays): tests/unit/test_replica_proof.py.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from nsqtw.replica.link import upgrade_request
from nsqtw.replica.proof import new_nonce
from nsqtw.replica.records import Kind, encode_json, encode_taken, split_records
from tests.rawclient import FRAME_ERROR, FRAME_MESSAGE, Client, Msg
from tests.reliability.cluster import (
    CHANNEL,
    Cluster,
    address_of,
    http,
    log_tail,
    make_topic,
    mpub,
    nodes_registered,
    replication_log,
    start_nodes,
    wait_for,
)

REFUSED = "did not prove it knows the replica secret"


def secret_file(tmp_path: Path, name: str, secret: str) -> str:
    path = tmp_path / name
    path.write_text(secret + "\n")
    return str(path)


def test_nodes_that_share_the_secret_replicate_and_others_are_refused(cluster: Cluster, tmp_path: Path) -> None:
    """Two nodes with one secret: a publish is held by both (200 OK, the replica in sync). Two with
    different secrets: neither takes the other's link, each says why, and the publish is refused
    after --replica-wait (the message still queued on the node, as with no peer)."""
    lookupd = cluster.start_lookupd()
    ours = secret_file(tmp_path, "ours", "correct horse battery staple")
    theirs = secret_file(tmp_path, "theirs", "another secret")
    a, b = start_nodes(cluster, ("--replicas=2", f"--replica-secret-file={ours}"),
                       ("--replicas=2", f"--replica-secret-file={ours}"))
    topic = make_topic(a, b, "shared")
    assert mpub(a, topic, [b"one", b"two"]) == (200, b"OK"), log_tail(a, b)
    assert REFUSED not in a.read_output() + b.read_output()

    for node in (a, b):  # (the second pair registers with the same lookupd: the first one goes)
        node.stop()
    c, d = cluster.nodes(("--replicas=2", f"--replica-secret-file={ours}", "--replica-wait=2s"),
                         ("--replicas=2", f"--replica-secret-file={theirs}"))
    wait_for("both in lookupd", lambda: nodes_registered(lookupd, c, d), 30)
    http(c.http_address, "POST", "/topic/create?topic=refused")
    wait_for("c's link to d refused", lambda: REFUSED in c.read_output(), 30)
    wait_for("d's side refused too", lambda: REFUSED in d.read_output(), 30)
    began = time.monotonic()
    code, answer = mpub(c, "refused", [b"three"])
    assert code != 200 and b"NO_REPLICA" in answer, (code, answer, replication_log(c, d))
    assert time.monotonic() - began >= 1.5
    assert "link with 127.0.0.1:" in c.read_output(), address_of(d)


def notice(node_http: str, incarnation: str, topic: str, ids: list[bytes]) -> bool:
    """Open a link to ``node_http`` as whoever reaches the port can, and send a TAKEN notice for its
    messages ``ids`` of ``topic``'s channel; True if the node acknowledged it (ACK), False if it
    closed the link first."""
    host, port = node_http.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(upgrade_request(node_http, new_nonce()))
        head = b""
        while b"\r\n\r\n" not in head:
            got = s.recv(4096)
            assert got, head
            head += got
        assert head.startswith(b"HTTP/1.1 101 "), head
        hello = {"node": "10.9.9.9:4151", "incarnation": "f" * 16, "http_port": 4151, "version": 2,
                 "role": "notice", "owner_incarnation": incarnation}
        s.sendall(encode_json(Kind.HELLO, hello) + encode_taken(topic, CHANNEL, ids))
        buf = head.split(b"\r\n\r\n", 1)[1]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            records, _ = split_records(buf)
            if any(kind == Kind.ACK for kind, _ in records):
                return True
            try:
                got = s.recv(4096)
            except ConnectionResetError:
                return False
            if not got:
                return False
            buf += got
    raise AssertionError("neither an ACK nor the link closed in 10 s")


@pytest.mark.parametrize("with_secret", [False, True], ids=["no-secret", "secret"])
def test_a_notice_from_whoever_reaches_the_port_is_taken_only_without_a_secret(
        cluster: Cluster, tmp_path: Path, with_secret: bool) -> None:
    """A message requeued for 2 s, then a TAKEN notice for it from a stranger: without a secret the
    node takes it and never delivers the message again (what the secret is for); with one it
    refuses the link, logs why, and the message is delivered when its 2 s are up."""
    cluster.start_lookupd()
    args = ("--replicas=2",) + ((f"--replica-secret-file={secret_file(tmp_path, 's', 'sesame')}",)
                                if with_secret else ())
    a, b = start_nodes(cluster, args, args)
    topic = make_topic(a, b, "victim")
    assert mpub(a, topic, [b"precious"]) == (200, b"OK"), log_tail(a, b)
    consumer = Client(a.tcp_address, timeout=10)
    consumer.sub(topic, CHANNEL, rdy=1)
    first = consumer.message(10)
    assert first.body == b"precious"
    consumer.send(b"REQ " + first.id + b" 2000\n")  # deferred 2 s: it leaves the queue again then
    code, body = http(a.http_address, "GET", "/replication")
    assert code == 200, body
    acked = notice(a.http_address, json.loads(body)["incarnation"], topic, [first.id])
    assert acked is not with_secret, a.read_output()[-3000:]
    again: list[Msg] = []
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline and not again:
        try:
            ftype, data = consumer.read(max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            break
        if ftype == FRAME_MESSAGE:
            again.append(Msg(data))
        assert ftype != FRAME_ERROR, data
    consumer.close()
    if with_secret:
        assert [m.body for m in again] == [b"precious"] and again[0].id == first.id
        assert REFUSED in a.read_output(), a.read_output()[-3000:]
    else:
        assert again == [], again
        assert "it delivered 1 message(s) of" in a.read_output()
