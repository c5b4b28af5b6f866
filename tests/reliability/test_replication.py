"""``--replicas=2`` on real processes: nsqtw-lookupd and nsqtw nodes on loopback, port 0, kill -9.

What is checked (docs/architecture.md, "Replication (`--replicas=2`): the design"):

- ``--replicas=1`` (the default) adds no route: ``GET /replication`` is a 404.
- A machine lost (kill -9, its data directory deleted) loses no acknowledged,
  unfinished message: the replica takes over after ``--replica-timeout`` and a
  consumer that finds producers through lookupd receives them all, with at most
  the pre-kill consumer's in-flight messages twice.
- With no peer, a publish is refused after ``--replica-wait`` (HTTP non-200,
  ``E_PUB_FAILED`` / ``E_MPUB_FAILED`` on TCP, non-fatal) and counted.
- An owner killed and restarted at once on its disk (within the timeout) is
  not taken over, and publishing to it works again.

The cluster, its probes and the consumer through lookupd (the :mod:`nsqtw.client` Consumer in a
process of its own, like ``nsqtw.tools.chaos_consumer``, writing one line per message it is
handed) are in :mod:`tests.reliability.cluster`.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter

import pytest

from tests.daemon import Daemon, Started
from tests.rawclient import FRAME_ERROR, FRAME_MESSAGE, OK, Client, Msg
from tests.reliability.cluster import (
    CHANNEL,
    CHOSEN_WITHIN,
    TOPIC,
    Cluster,
    LookupdConsumer,
    consume_through_lookupd,
    http,
    in_sync,
    log_tail,
    nodes_registered,
    post,
    replica_of,
    stats,
    wait_for,
)

# -- the tests --------------------------------------------------------------------------------------


def test_replicas_1_has_no_replication_route(tmp_path) -> None:
    """With the default ``--replicas=1`` the route does not exist: 404 like any unknown path."""
    started = Started(str(tmp_path))
    try:
        node = started.start(Daemon(started.folder("node")))
        code, body = http(node.http_address, "GET", "/replication")
        assert code == 404, (code, body)
        code, _ = http(node.http_address, "GET", "/ping")
        assert code == 200
    finally:
        started.stop_all()


PRE_KILL_MAX_IN_FLIGHT = 100
PUBLISHED = 2000
FINISHED_BEFORE_KILL = 700


@pytest.mark.parametrize("workers", [1, 2])
def test_machine_lost_loses_nothing(cluster: Cluster, consumers: list[LookupdConsumer], tmp_path,
                                    workers: int) -> None:
    """Owner A killed -9 and its disk deleted: every message not finished on A reaches a consumer
    through lookupd from the replica, duplicates within the pre-kill consumer's in-flight count.
    Again with every node a core and two workers (clients served by the workers, the copies and
    the takeover by the core)."""
    lookupd = cluster.start_lookupd()
    flags = ("--replicas=2", "--replica-timeout=3s", f"--workers={workers}")
    a, b, c = (cluster.node(*flags) for _ in range(3))
    wait_for("all three nodes in lookupd's /nodes", lambda: nodes_registered(lookupd, a, b, c), 30)

    # each node advertises replication
    for n in (a, b, c):
        code, body = http(n.http_address, "GET", "/replication")
        assert code == 200, (code, body)
        info = json.loads(body)
        assert "version" in info and "incarnation" in info, info

    post(a.http_address, f"/topic/create?topic={TOPIC}")
    post(a.http_address, f"/channel/create?topic={TOPIC}&channel={CHANNEL}")
    replica = wait_for("a replica of t in step on A (/stats replica.state in_sync)",
                       lambda: in_sync(a), CHOSEN_WITHIN)

    bodies = [b"body-%05d" % i for i in range(PUBLISHED)]
    for i in range(0, PUBLISHED, 200):
        code, answer = http(a.http_address, "POST", f"/mpub?topic={TOPIC}", b"\n".join(bodies[i:i + 200]))
        assert (code, answer) == (200, b"OK"), (i, code, answer, log_tail(a, b, c))

    # the pre-kill consumer, straight on A: FIN 700, hold whatever else it was sent, then leave
    pre: list[bytes] = []
    finned: set[bytes] = set()
    sub = Client(a.tcp_address, timeout=30.0)
    sub.sub(TOPIC, CHANNEL, PRE_KILL_MAX_IN_FLIGHT)
    while len(finned) < FINISHED_BEFORE_KILL:
        m = sub.message(30.0)
        pre.append(m.body)
        sub.fin(m)
        finned.add(m.body)
    sub.cmd("RDY", 0)
    try:  # what was already on its way is received, not finished
        while True:
            f = sub.read(1.0)
            assert f[0] == FRAME_MESSAGE, f
            pre.append(Msg(f[1]).body)
    except TimeoutError:
        pass
    held = len(set(pre) - finned)
    assert held <= PRE_KILL_MAX_IN_FLIGHT, held
    sub.close()

    # the FINs reach the replica over the link (the design allows those of "the last few
    # milliseconds" to be lost with the owner): let it settle, then lose the machine
    wait_for("A's replica link has nothing unacked",
             lambda: (replica_of(a) or {}).get("unacked", 1) == 0, 20)
    time.sleep(2.0)
    peer = replica_of(a)
    a.kill()
    killed = time.monotonic()
    shutil.rmtree(a.data_path)

    # consumers find the replica through lookupd (it registered the topic as a producer)
    folder = tmp_path / "consumer"
    folder.mkdir()
    consumer = LookupdConsumer(str(folder), lookupd, max_in_flight=100, poll=0.5)
    consumers.append(consumer)
    expected = set(bodies) - finned
    began = time.monotonic()
    deadline = began + 30.0
    first_seen: float | None = None
    while time.monotonic() < deadline:
        got = consumer.bodies()
        if first_seen is None and got:
            first_seen = time.monotonic()
        if expected <= set(got):
            break
        time.sleep(0.1)
    took, since_kill = time.monotonic() - began, time.monotonic() - killed
    got = consumer.bodies()
    missing = expected - set(got)
    takeovers = {n.http_address: stats(n).get("takeovers") for n in (b, c)}
    standby = {n.http_address: stats(n).get("standby") for n in (b, c)}
    assert not missing, (
        f"{len(missing)} of {len(expected)} unfinished messages never came within 30 s "
        f"(e.g. {sorted(missing)[:5]}); the consumer got {len(got)}, {len(set(got))} distinct; "
        f"A's replica was {peer} (first in_sync {replica}); takeovers {takeovers}; standby {standby}\n"
        f"consumer log:\n{consumer.log()}\n{log_tail(b, c)}")

    time.sleep(2.0)  # late copies count as duplicates too
    got = consumer.bodies()
    assert set(got) <= set(bodies), sorted(set(got) - set(bodies))[:5]
    counts = Counter(pre + got)
    duplicated = {body for body, n in counts.items() if n > 1}
    extra_copies = sum(n - 1 for n in counts.values())
    finished_again = len(finned & set(got))
    print(f"all {len(expected)} unfinished messages came in {took:.1f} s ({since_kill:.1f} s after the kill, "
          f"the first {(first_seen or began) - killed:.1f} s after); "
          f"{len(duplicated)} bodies "
          f"received more than once ({extra_copies} extra copies, {finished_again} finished before the kill, "
          f"{held} held by the pre-kill consumer)")
    assert len(duplicated) <= PRE_KILL_MAX_IN_FLIGHT, (len(duplicated), extra_copies, finished_again, held)
    assert any(isinstance(n, int) and n >= 1 for n in takeovers.values()), takeovers
    # not before --replica-timeout (3 s) of silence: the link broke at the kill (1 s of margin for the
    # time a.kill() took to return and for this loop's polling)
    first = (first_seen or time.monotonic()) - killed
    assert first >= 2.0, f"the first message came {first:.1f} s after the kill, before --replica-timeout=3s"


def test_no_peer_refuses_after_replica_wait(cluster: Cluster) -> None:
    """One node with ``--replicas=2`` and no peer: publishes are refused after ``--replica-wait``
    (HTTP non-200; TCP E_PUB_FAILED / E_MPUB_FAILED, the connection kept), and counted."""
    lookupd = cluster.start_lookupd()
    node = cluster.node("--replicas=2", "--replica-wait=1s")
    wait_for("the node in lookupd's /nodes", lambda: nodes_registered(lookupd, node), 30)

    began = time.monotonic()
    code, answer = http(node.http_address, "POST", f"/pub?topic={TOPIC}", b"hello")
    took = time.monotonic() - began
    assert code != 200, (code, answer)
    assert 0.5 <= took <= 10.0, (took, code, answer)

    c = Client(node.tcp_address, timeout=30.0)
    began = time.monotonic()
    c.cmd("PUB", TOPIC, body=b"hello")
    ftype, data = c.read(30.0)
    took = time.monotonic() - began
    assert ftype == FRAME_ERROR and data.startswith(b"E_PUB_FAILED"), (ftype, data)
    assert 0.5 <= took <= 10.0, took
    # non-fatal: the connection still answers
    c.mpub(TOPIC, [b"one", b"two"])
    ftype, data = c.read(30.0)
    assert ftype == FRAME_ERROR and data.startswith(b"E_MPUB_FAILED"), (ftype, data)
    c.cmd("NOP")
    # an #ephemeral topic is never replicated: published at once
    c.cmd("PUB", "e#ephemeral", body=b"hello")
    assert c.read(10.0) == OK
    assert c.is_open(0.5)
    c.close()

    refused = stats(node).get("replica_refused")
    assert isinstance(refused, int) and refused >= 1, refused
    code, body = http(node.http_address, "GET", "/ping")
    assert (code, body) == (200, b"OK"), (code, body)
    assert node.proc is not None and node.proc.poll() is None


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "memory"])
def test_owner_quick_restart_keeps_copies(cluster: Cluster, consumers: list[LookupdConsumer], tmp_path,
                                          durable: bool) -> None:
    """The owner killed -9 and started again at once on its disk and ports (within
    ``--replica-timeout``): publishing to it works again once a replica is in step, and nothing
    acknowledged is lost. With ``--durable-delivery`` the owner still has every message, so the
    replica does not take over; without it, what the owner held in memory is gone, and the
    replica may deliver its copies (duplicates, never a loss)."""
    lookupd = cluster.start_lookupd()
    flags = ("--replicas=2", "--replica-timeout=10s", *(("--durable-delivery",) if durable else ()))
    a, b = cluster.node(*flags), cluster.node(*flags)
    wait_for("both nodes in lookupd's /nodes", lambda: nodes_registered(lookupd, a, b), 30)
    post(a.http_address, f"/topic/create?topic={TOPIC}")
    post(a.http_address, f"/channel/create?topic={TOPIC}&channel={CHANNEL}")
    wait_for("a replica of t in step on A", lambda: in_sync(a), CHOSEN_WITHIN)
    before = [b"before-%03d" % i for i in range(100)]
    code, answer = http(a.http_address, "POST", f"/mpub?topic={TOPIC}", b"\n".join(before))
    assert (code, answer) == (200, b"OK"), (code, answer)
    wait_for("B holds a standby of A's t",
             lambda: any(s.get("topic") == TOPIC for s in stats(b).get("standby") or []), 20)

    killed = time.monotonic()
    a.kill()
    a.start(tcp=a.tcp_address, http=a.http_address, timeout=40)

    # publishing works again once the replica is in step
    after: list[bytes] = []

    def published() -> bool:
        body = b"after-%03d" % len(after)
        code, _ = http(a.http_address, "POST", f"/pub?topic={TOPIC}", body)
        if code == 200:
            after.append(body)
        return code == 200 and in_sync(a) is not None

    wait_for("a publish to the restarted A answered 200 with its replica in_sync", published, 40)
    if durable:  # past the replica timeout (and its /ping probe) since the kill: still no takeover on B
        while time.monotonic() < killed + 10.0 + 5.0:
            s = stats(b)
            assert s.get("takeovers") == 0, (s.get("takeovers"), s.get("standby"), log_tail(a, b))
            time.sleep(0.5)
        s = stats(b)
        assert s.get("takeovers") == 0, (s.get("takeovers"), s.get("standby"))
        assert not any(x.get("taken_over") for x in s.get("standby") or []), s.get("standby")
    code, answer = http(a.http_address, "POST", f"/pub?topic={TOPIC}", b"last")
    assert (code, answer) == (200, b"OK"), (code, answer)
    after.append(b"last")

    expected = set(before) | set(after)
    consumer = consume_through_lookupd(tmp_path, consumers, lookupd, "consumer",
                                       lambda got: expected <= set(got), 30)
    got = consumer.bodies()
    assert expected <= set(got), (
        f"lost {sorted(expected - set(got))[:5]} ({len(expected - set(got))} of {len(expected)}); "
        f"B's takeovers {stats(b).get('takeovers')}\n{log_tail(a, b)}")
    if durable:
        time.sleep(1.0)
        extra = Counter(consumer.bodies())
        assert not [body for body, n in extra.items() if n > 1], "no takeover, so no message twice"


def test_replica_lost_then_owner_lost_loses_nothing(cluster: Cluster, consumers: list[LookupdConsumer],
                                                    tmp_path) -> None:
    """The replica is lost (kill -9, disk deleted): the owner places its copies on the third node,
    backlog included (the design's SNAP), before it says in_sync again; then the owner is lost too,
    and every acknowledged, unfinished message still reaches a consumer through lookupd."""
    lookupd = cluster.start_lookupd()
    flags = ("--replicas=2", "--replica-timeout=6s")
    a, b, c = (cluster.node(*flags) for _ in range(3))
    wait_for("all three nodes in lookupd's /nodes", lambda: nodes_registered(lookupd, a, b, c), 30)
    post(a.http_address, f"/topic/create?topic={TOPIC}")
    post(a.http_address, f"/channel/create?topic={TOPIC}&channel={CHANNEL}")
    first = wait_for("a replica of t in step on A", lambda: in_sync(a), CHOSEN_WITHIN)
    by_address = {n.http_address: n for n in (b, c)}
    assert first["peer"] in by_address, (first, list(by_address))
    replica = by_address[first["peer"]]
    third = b if replica is c else c

    early = [b"early-%04d" % i for i in range(500)]
    code, answer = http(a.http_address, "POST", f"/mpub?topic={TOPIC}", b"\n".join(early))
    assert (code, answer) == (200, b"OK"), (code, answer)

    replica.kill()
    shutil.rmtree(replica.data_path)
    # a publish finds the replica gone and is placed on the third node (within --replica-wait)
    late = [b"late-%04d" % i for i in range(500)]
    code, answer = http(a.http_address, "POST", f"/mpub?topic={TOPIC}", b"\n".join(late))
    if code != 200:  # refused while the loss was being noticed: once more
        code, answer = http(a.http_address, "POST", f"/mpub?topic={TOPIC}", b"\n".join(late))
    assert (code, answer) == (200, b"OK"), (code, answer, log_tail(a, third))
    second = wait_for("t in step again on A, on the third node",
                      lambda: (r := in_sync(a)) is not None and r["peer"] == third.http_address and r, 30)
    print(f"replica {first['peer']} lost; now {second}; standby on the third node "
          f"{stats(third).get('standby')}")

    a.kill()
    shutil.rmtree(a.data_path)
    expected = set(early) | set(late)
    consumer = consume_through_lookupd(tmp_path, consumers, lookupd, "consumer",
                                       lambda got: expected <= set(got), 40)
    got = set(consumer.bodies())
    missing = expected - got
    assert not missing, (
        f"lost {len(missing)} of {len(expected)}: {len(set(early) - got)} published before the replica was "
        f"lost, {len(set(late) - got)} after; the third node's takeovers {stats(third).get('takeovers')}, "
        f"standby {stats(third).get('standby')}\n{log_tail(third)}")
