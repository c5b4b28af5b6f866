"""``--replicas=2`` when the scheme itself is hit: real processes on loopback (port 0), kill -9, SIGSTOP.

What is checked (docs/replication.md, "When a node is lost"), beyond the single losses of
``test_replication.py``:

- **lookupd down during a loss**: lookupd killed, then the owner's machine lost; the replica takes
  over without lookupd (it asks the owner's ``/ping``, never lookupd), and once lookupd is back,
  empty, a consumer through it receives every acknowledged, unfinished message, whether lookupd
  came back before the takeover or only after it.
- **a slow replica** (SIGSTOP): the owner's publishes of its topics wait at most ``--replica-wait``
  and the owner places them on another node after a third of ``--replica-timeout``; its memory
  stays bounded while publishers push on; a bystander topic whose replica is another node is
  answered at once throughout; after SIGCONT nothing acknowledged is lost, and the thawed replica
  lets go of the copies it no longer holds (no takeover, no duplicate).
- **a network split between the owner and its replica, both alive** (a relay in front of the owner's
  and the replica's HTTP ports, which ``--broadcast-http-port`` names to lookupd, blackholes the
  connections of one's process to the other): the owner places the topic on the third node and
  publishes go on; cut one way (the replica still reaches the owner's ``/ping``), the replica closes
  its silent link and lets go, and a later loss of the owner is delivered once, by the third node;
  cut both ways, the replica takes over while the owner delivers too: duplicates, no more than the
  replica held, never a loss.
- **both nodes of a pair lost**: their unfinished messages are gone (``--replicas=2`` covers one
  machine), but the node left keeps serving: ``/ping`` OK, its own topics lose nothing, its
  publishes are refused after ``--replica-wait`` (queued all the same) while it has no peer, and
  answered again as soon as a new node joins.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from tests.daemon import Daemon
from tests.reliability.cluster import (
    CHANNEL,
    KNOWN_WITHIN,
    TOPIC,
    Cluster,
    LookupdConsumer,
    address_of,
    consume_through_lookupd,
    covers,
    depth,
    held_for,
    http,
    in_sync,
    log_tail,
    lose,
    make_topic,
    mpub,
    ping,
    post,
    publish_all,
    publish_and_finish,
    replica_of,
    replication_log,
    standby_topics,
    start_nodes,
    stats,
    wait_for,
    wait_known,
)
from tests.reliability.conftest import rss_kib
from tests.reliability.conftest import wait_for as poll

#: how much the owner's resident memory may grow while its replica is frozen: the catch-up of the new
#: replica sends a 16 MiB segment of the owner's log at a time, and that segment is in memory a few
#: times over meanwhile (read, cut into records, in the socket's buffer): 35 to 60 MiB seen here, while
#: the same load without a freeze grows it by 10 MiB, and 120 MiB and more are published during it
BOUND_KIB = 96 * 1024
# -- lookupd down during a loss ------------------------------------------------------------------------


@pytest.mark.parametrize("back", ["before", "after"], ids=["lookupd-back-before-takeover",
                                                           "lookupd-back-after-takeover"])
def test_lookupd_down_during_a_loss(cluster: Cluster, consumers: list[LookupdConsumer], tmp_path: Path,
                                    back: str) -> None:
    """lookupd is killed, then the owner's machine is lost. The replica needs no lookupd to take over
    (silence, then the owner's ``/ping`` fails); lookupd comes back empty, on its ports, the nodes
    register again, and a consumer through it receives every acknowledged, unfinished message, each
    once. With lookupd back only after the takeover, the copies are already in the replica's channel
    by then."""
    lookupd = cluster.start_lookupd()
    flags = ("--replicas=2", "--replica-timeout=3s")
    a, b, c = start_nodes(cluster, flags, flags, flags)
    post(a.http_address, f"/topic/create?topic={TOPIC}")
    post(a.http_address, f"/channel/create?topic={TOPIC}&channel={CHANNEL}")
    peer = wait_for("a replica of t in step on A", lambda: in_sync(a), 20)["peer"]
    replica = b if peer == address_of(b) else c
    assert peer == address_of(replica), (peer, address_of(b), address_of(c))

    unfinished = publish_and_finish(a, replica, TOPIC, [b"lost-%04d" % i for i in range(600)], 200)

    lookupd.kill()
    lose(a)
    lost = time.monotonic()
    if back == "after":
        wait_for("the replica's takeover, lookupd down: every copy in its channel",
                 lambda: depth(replica, TOPIC) == len(unfinished), 30)
        took = time.monotonic() - lost
        assert lookupd.proc is None, "lookupd stayed down"
        assert stats(replica)["takeovers"] >= 1
        replica.wait_output(rf"took over {TOPIC}: {len(unfinished)} messages", 5)
        print(f"taken over {took:.1f} s after the loss, lookupd down")
    cluster.restart_lookupd()

    consumer = consume_through_lookupd(tmp_path, consumers, lookupd, "consumer",
                                       lambda got: unfinished <= set(got), 40)
    took = time.monotonic() - lost
    got = consumer.bodies()
    missing = unfinished - set(got)
    assert not missing, (
        f"{len(missing)} of {len(unfinished)} unfinished messages never came (e.g. {sorted(missing)[:3]}); "
        f"the replica's takeovers {stats(replica).get('takeovers')}, depth {depth(replica, TOPIC)}\n"
        f"consumer log:\n{consumer.log()}\n{log_tail(replica, lookupd)}")
    time.sleep(1.0)  # a late second copy would show now
    counts = Counter(consumer.bodies())
    assert set(counts) <= unfinished, sorted(set(counts) - unfinished)[:5]
    assert max(counts.values()) == 1, [b for b, n in counts.items() if n > 1][:5]
    print(f"all {len(unfinished)} unfinished messages came through the restarted lookupd, "
          f"{took:.1f} s after the loss")


# -- both nodes of a pair lost -------------------------------------------------------------------------


def test_both_nodes_of_a_pair_lost(cluster: Cluster, consumers: list[LookupdConsumer], tmp_path: Path) -> None:
    """A and B, the owner of a topic and its replica, are lost at once: that topic's unfinished
    messages are gone (documented: ``--replicas=2`` covers one machine), and nothing else is. The
    node left, C, whose own topic had its copies on A or B, answers ``/ping``, refuses its
    publishes after ``--replica-wait`` (non-fatal, the message queued all the same) while it has no
    peer, delivers every message of its topic, and places its copies on a new node D as soon as D
    registers: publishes are answered OK again, without a restart."""
    cluster.start_lookupd()
    assert cluster.lookupd is not None
    lookupd = cluster.lookupd
    flags = ("--replicas=2", "--replica-timeout=3s", "--replica-wait=1s")
    a, b, c = start_nodes(cluster, flags, flags, flags)
    pair = make_topic(a, b, "pair")
    own = make_topic(c, a, "own")  # C's topic, its copies on A (lost with the pair)

    gone = [b"gone-%04d" % i for i in range(300)]
    publish_all(a, pair, gone)
    kept = [b"kept-%04d" % i for i in range(300)]
    publish_all(c, own, kept)
    wait_for("B holds A's messages", lambda: held_for(b, a, pair) == len(gone), 20)

    a.kill()
    b.kill()
    lost = time.monotonic()
    shutil.rmtree(a.data_path)
    shutil.rmtree(b.data_path)

    # C alone: each publish answered within --replica-wait, refused once C knows it has no peer
    # left (the message queued all the same), /ping OK throughout: not wedged, and honest
    alone: list[bytes] = []
    code, answer = 0, b""
    deadline = time.monotonic() + 15.0
    while code != 503:
        assert time.monotonic() < deadline, f"C never refused a publish: {code} {answer!r}\n{replication_log(c)}"
        alone.append(b"alone-%03d" % len(alone))
        began = time.monotonic()
        code, answer = http(c.http_address, "POST", f"/pub?topic={own}", alone[-1])
        took = time.monotonic() - began
        assert (code, answer) in ((200, b"OK"), (503, b'{"message":"NO_REPLICA"}')), (code, answer)
        assert took <= 1.0 + 2.0, f"a publish answered after {took:.1f} s, --replica-wait=1s"
        assert ping(c) == (200, b"OK")
    r = stats(c)
    took_over = re.findall(r"took over (\S+): (\d+) messages", c.read_output())
    assert all(n == "0" for _, n in took_over), (took_over, log_tail(c))
    assert (replica_of(c, own) or {}).get("state") == "none", replica_of(c, own)
    assert r["replica_refused"] >= 1 and r["unreplicated"] >= 1, r

    # a new node: C places its copies there (it reads lookupd every second while it knows no peer)
    (d,) = cluster.nodes(flags)
    wait_for("C's topic in step on the new node D",
             lambda: (in_sync(c, own) or {}).get("peer") == address_of(d), KNOWN_WITHIN)
    recovered = time.monotonic() - lost
    after = [b"after-%04d" % i for i in range(100)]
    publish_all(c, own, after)
    assert ping(c) == (200, b"OK")
    assert held_for(d, c, own) >= len(after)  # D holds C's unfinished messages: the old ones too
    expected = set(kept) | set(alone) | set(after)
    wait_for("D holds every unfinished message of C's topic", lambda: held_for(d, c, own) == len(expected), 20)

    consumer = consume_through_lookupd(tmp_path, consumers, lookupd, "consumer",
                                       lambda got: expected <= set(got), 30, topic=own)
    got = Counter(consumer.bodies())
    missing = expected - set(got)
    assert not missing, (f"C lost {len(missing)} of its {len(expected)} messages: {sorted(missing)[:3]}\n"
                         f"{consumer.log()}\n{log_tail(c)}")
    assert set(got) <= expected and max(got.values()) == 1, got.most_common(3)
    assert stats(d)["takeovers"] == 0
    took_over = re.findall(r"took over (\S+): (\d+) messages", c.read_output())
    assert all(n == "0" for _, n in took_over), took_over
    print(f"C refused while alone and was in step on D {recovered:.1f} s after the pair was lost; "
          f"the pair's {len(gone)} unfinished messages are gone; C took over {took_over}")


# -- a slow replica ------------------------------------------------------------------------------------


class Publisher(threading.Thread):
    """Publishes batches of ``size`` bodies to ``topic`` on ``node`` over HTTP, one after another, until
    stopped; ``answers`` holds (when sent, seconds to the answer, status, bodies) per publish."""

    def __init__(self, node: Daemon, topic: str, tag: str, size: int, body_bytes: int, pause: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.node = node
        self.topic = topic
        self.tag = tag
        self.size = size
        self.pad = b"x" * max(0, body_bytes - 24)
        self.pause = pause
        self.answers: list[tuple[float, float, int, list[bytes]]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stopping.is_set():
            bodies = [b"%s-%07d-%s" % (self.tag.encode(), n + i, self.pad) for i in range(self.size)]
            n += self.size
            began = time.monotonic()
            try:
                code, _ = mpub(self.node, self.topic, bodies, timeout=30.0)
            except OSError:
                code = 0
            self.answers.append((began, time.monotonic() - began, code, bodies))
            if self.pause:
                self.stopping.wait(self.pause)

    def stop(self) -> None:
        self.stopping.set()
        self.join(60)

    def acknowledged(self) -> set[bytes]:
        return {body for _, _, code, bodies in self.answers if code == 200 for body in bodies}

    def offered(self) -> set[bytes]:
        return {body for _, _, _, bodies in self.answers for body in bodies}


@pytest.fixture
def publishers() -> Iterator[list[Publisher]]:
    started: list[Publisher] = []
    try:
        yield started
    finally:
        for p in started:
            p.stop()


def test_slow_replica(cluster: Cluster, consumers: list[LookupdConsumer], publishers: list[Publisher],
                      tmp_path: Path) -> None:
    """The replica of one of A's topics is frozen (SIGSTOP) for longer than ``--replica-timeout``
    while publishers push on. That topic's publishes are each answered within ``--replica-wait``
    (refused while nothing acks them), and A places the topic on C a third of the timeout into the
    silence; A's memory stays bounded (its queues spill to disk: ``--mem-queue-size=100``, so what
    grows is what replication holds); a bystander topic whose copies go to C is answered OK and
    promptly throughout. After SIGCONT the replica finds A alive and lets go of the copies placed
    elsewhere (no takeover), and every acknowledged message of both topics is delivered, once."""
    lookupd = cluster.start_lookupd()
    timeout, wait = 6.0, 1.0
    flags = ("--replicas=2", f"--replica-timeout={timeout:g}s", f"--replica-wait={wait:g}s", "--mem-queue-size=100")
    a, b, c = start_nodes(cluster, flags, flags, flags)
    slow = make_topic(a, b, "slow")
    other = make_topic(a, c, "other")

    heavy = [Publisher(a, slow, f"s{i}", 32, 4096) for i in range(3)]
    bystander = Publisher(a, other, "o", 1, 100, pause=0.05)
    publishers.extend([*heavy, bystander])
    for p in publishers:
        p.start()
    time.sleep(1.0)  # the load's own footprint, before the freeze
    baseline = rss_kib(a)

    frozen_at = time.monotonic()
    os.kill(b.pid, signal.SIGSTOP)
    rss: list[int] = []
    unacked: list[int] = []
    moved_at: float | None = None
    try:
        while time.monotonic() < frozen_at + timeout + 1.0:
            rss.append(rss_kib(a))
            r = replica_of(a, slow) or {}
            unacked.append(int(r.get("unacked", 0)))
            if moved_at is None and r.get("peer") == address_of(c):
                moved_at = time.monotonic()
            time.sleep(0.2)
    finally:
        os.kill(b.pid, signal.SIGCONT)
    thawed_at = time.monotonic()
    time.sleep(1.0)
    for p in publishers:
        p.stop()

    during = [x for p in heavy for x in p.answers if frozen_at <= x[0] <= thawed_at]
    offered_mib = sum(len(body) for x in during for body in x[3]) / 2**20
    print(f"A's RSS {baseline / 1024:.0f} MiB before the freeze, at most {max(rss) / 1024:.0f} MiB during it; "
          f"{offered_mib:.0f} MiB offered to {slow} meanwhile in {len(during)} publishes "
          f"({sum(1 for x in during if x[2] == 200)} OK, {sum(1 for x in during if x[2] == 503)} refused, "
          f"slowest {max(x[1] for x in during):.2f} s); {slow} on C "
          f"{(moved_at or 0) - frozen_at:.1f} s into the freeze; bystander: {len(bystander.answers)} publishes, "
          f"slowest {max(x[1] for x in bystander.answers):.2f} s; unacked at most {max(unacked)}")

    # the slow replica's topic: each publish answered within --replica-wait (refused while nothing
    # acks it), and on C a third of the timeout into the silence, where publishes are answered OK
    slowest = max(x[1] for x in during)
    assert slowest <= wait + 1.5, f"a publish to {slow} waited {slowest:.1f} s, --replica-wait={wait:g}s"
    assert moved_at is not None and moved_at - frozen_at <= timeout / 3 + 2.0, (
        f"{slow} was not placed on C within a third of --replica-timeout: {replica_of(a, slow)}\n{replication_log(a)}")
    assert any(x[2] == 200 and x[0] >= moved_at for x in during), (
        f"no publish answered OK once on C\n{replication_log(a)}")
    # the bystander: every publish OK, none waited on the frozen node
    late = [(round(x[0] - frozen_at, 1), round(x[1], 2), x[2]) for x in bystander.answers
            if x[2] != 200 or x[1] >= wait]
    assert not late, (f"bystander publishes refused or slow (sent s into the freeze, took s, status): {late}\n"
                      f"{replication_log(a)}")
    # A's memory: what replication holds is bounded (a segment of catch-up in flight, the publishes
    # waiting for their answer), not by what was offered meanwhile
    assert max(rss) - baseline <= BOUND_KIB, (max(rss), baseline, offered_mib)
    assert max(unacked) <= 4 * len(heavy), unacked

    # thawed: B finds A alive and lets go of the copies now on C; nothing taken over, nothing lost
    wait_for(f"B lets go of A's {slow}", lambda: slow not in standby_topics(b, a), timeout + 10)
    assert ping(a) == ping(b) == (200, b"OK")
    took_over = re.findall(r"took over (\S+): (\d+) messages", b.read_output())
    assert all(n == "0" for _, n in took_over), took_over
    for topic, sent in ((slow, heavy), (other, [bystander])):
        expected = set().union(*(p.acknowledged() for p in sent))
        offered = set().union(*(p.offered() for p in sent))
        consumer = consume_through_lookupd(tmp_path, consumers, lookupd, topic,
                                           partial(covers, expected), 40, topic=topic)
        got = Counter(consumer.bodies())
        missing = expected - set(got)
        assert not missing, (f"{len(missing)} of {len(expected)} acknowledged messages of {topic} lost: "
                             f"{sorted(missing)[:3]}\n{consumer.log()}\n{replication_log(a, b, c)}")
        assert set(got) <= offered, sorted(set(got) - offered)[:3]
        twice = [body[:20] for body, n in got.items() if n > 1]
        assert not twice, f"{len(twice)} messages of {topic} delivered twice: {twice[:3]}"
        print(f"{topic}: all {len(expected)} acknowledged messages delivered once")


# -- a network split between the owner and its replica, both alive --------------------------------------


def socket_owner(local_port: int, remote_port: int, pids: list[int]) -> int | None:
    """Which of ``pids`` holds the TCP socket from 127.0.0.1:``local_port`` to 127.0.0.1:``remote_port``
    (/proc/net/tcp gives the socket's inode, /proc/PID/fd who holds it); None when none does."""
    want = (f"0100007F:{local_port:04X}", f"0100007F:{remote_port:04X}")
    inode = None
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if (fields[1], fields[2]) == want:
                inode = fields[9]
                break
    if inode is None:
        return None
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    return None


class SplitRelay:
    """A TCP relay in front of one node's HTTP port, where its peers connect: the node names the
    relay's port to lookupd (``--broadcast-http-port``), so every replication link and probe to it
    comes through here. Each connection is forwarded both ways, except while the process it came
    from is cut off (:meth:`cut_off`): then nothing goes either way and nothing is closed, as when the
    network between two machines drops their packets. (Clients and consumers reach the node's own
    ports.)"""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.port: int = self.listener.getsockname()[1]
        #: the node's HTTP port (connections wait until it is known)
        self.target: tuple[str, int] | None = None
        #: the processes whose connections are told apart, and those cut off
        self.pids: list[int] = []
        self.cut: set[int] = set()
        self.closing = False
        self.cut_connections = 0
        self._connections: list[tuple[int | None, threading.Lock]] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closing:
            try:
                conn, (_, port) = self.listener.accept()
            except OSError:
                return
            pid = socket_owner(port, self.port, self.pids)
            threading.Thread(target=self._relay, args=(conn, pid), daemon=True).start()

    def _relay(self, client: socket.socket, pid: int | None) -> None:
        upstream: socket.socket | None = None
        forwarding = threading.Lock()  # held while bytes may be on their way through
        self._connections.append((pid, forwarding))
        counted = False
        try:
            while not self.closing:
                with forwarding:
                    blocked = pid in self.cut or self.target is None
                    if not blocked:
                        if upstream is None:
                            assert self.target is not None
                            upstream = socket.create_connection(self.target)
                        ready, _, _ = select.select([client, upstream], [], [], 0.05)
                        for sock in ready:
                            data = sock.recv(65536)
                            if not data:
                                return
                            (upstream if sock is client else client).sendall(data)
                if blocked:
                    if pid in self.cut and not counted:
                        self.cut_connections += 1
                        counted = True
                    time.sleep(0.05)
        except OSError:
            return
        finally:
            client.close()
            if upstream is not None:
                upstream.close()

    def cut_off(self, pid: int) -> None:
        """Nothing of ``pid``'s connections goes through from now on (what was on its way when
        called has arrived when it returns); new ones from it are held, never connected."""
        self.cut.add(pid)
        for owner, forwarding in list(self._connections):
            if owner == pid:
                with forwarding:
                    pass

    def close(self) -> None:
        self.closing = True
        self.listener.close()


@pytest.fixture
def relays() -> Iterator[list[SplitRelay]]:
    made: list[SplitRelay] = []
    try:
        yield made
    finally:
        for r in made:
            r.close()


@pytest.mark.parametrize("cut", ["owner-to-replica", "both-ways"])
def test_split_between_owner_and_replica(cluster: Cluster, consumers: list[LookupdConsumer],
                                         relays: list[SplitRelay], tmp_path: Path, cut: str) -> None:
    """A's connections to B are cut (and, ``both-ways``, B's to A), with messages unfinished; both
    stay alive, and both reach C. A finds its link to B silent and places the topic on C, copying it
    the unfinished messages: publishes are answered, refused only while no replica acks them.

    ``owner-to-replica``: B still reaches A's ``/ping``, so it does not take over; it asks A which
    topics it still holds for it and lets go of this one. When A is then lost, C delivers every
    unfinished message and nothing is delivered twice.

    ``both-ways``: B's ``/ping`` of A fails too, so B takes over while A goes on delivering the
    same messages: duplicates, no more than B held, and never a loss."""
    lookupd = cluster.start_lookupd()
    timeout, wait = 3.0, 1.0
    flags = ("--replicas=2", f"--replica-timeout={timeout:g}s", f"--replica-wait={wait:g}s")
    ra, rb = SplitRelay(), SplitRelay()
    relays.extend([ra, rb])
    a, b, c = cluster.nodes((*flags, f"--broadcast-http-port={ra.port}"),
                            (*flags, f"--broadcast-http-port={rb.port}"), flags)
    ra.target, rb.target = a.http, b.http
    ra.pids = rb.pids = [a.pid, b.pid, c.pid]
    wait_known(a, b, c)
    topic = make_topic(a, b, "split")

    unfinished = publish_and_finish(a, b, topic, [b"before-%04d" % i for i in range(600)], 200)

    rb.cut_off(a.pid)
    if cut == "both-ways":
        ra.cut_off(b.pid)
    split_at = time.monotonic()

    # publishes go on: each answered within --replica-wait, OK again once the topic is on C (a
    # third of the timeout into the silence); on through the timeout, when B decides
    answers: list[tuple[float, float, int, list[bytes]]] = []
    moved: float | None = None
    n = 0
    while time.monotonic() < split_at + timeout + 2.0 or not answers or answers[-1][2] != 200:
        assert time.monotonic() < split_at + 30.0, (answers[-3:], replication_log(a))
        bodies = [b"during-%04d" % (n + i) for i in range(20)]
        n += 20
        sent = time.monotonic()
        code, answer = mpub(a, topic, bodies)
        answers.append((sent - split_at, time.monotonic() - sent, code, bodies))
        assert code == 200 or (code, answer) == (503, b'{"message":"NO_REPLICA"}'), (code, answer)
        if moved is None and (in_sync(a, topic) or {}).get("peer") == address_of(c):
            moved = time.monotonic() - split_at
        time.sleep(0.05)
    slowest = max(x[1] for x in answers)
    assert slowest <= wait + 1.5, f"a publish waited {slowest:.1f} s, --replica-wait={wait:g}s"
    assert moved is not None and moved <= timeout / 3 + 2.0, (moved, replica_of(a, topic), replication_log(a))
    acknowledged = {body for x in answers if x[2] == 200 for body in x[3]}
    offered = {body for x in answers for body in x[3]}
    assert ping(a) == ping(b) == (200, b"OK")
    assert rb.cut_connections >= 1, "A's link to B never came through the relay"

    if cut == "owner-to-replica":
        # B finds A alive: no takeover; it lets go of the copies A placed elsewhere, then A is lost
        let_go = poll(lambda: topic not in standby_topics(b, a), timeout + 10)
        assert let_go, f"B kept its copies of A's {topic}: {stats(b).get('standby')}\n{replication_log(a, b)}"
        assert not re.search(rf"took over {topic}: [1-9]", b.read_output()), replication_log(b)
        lose(a)
    else:
        # B cannot reach A either: it takes over what it held at the split, while A goes on delivering
        b.wait_output(rf"took over {topic}: {len(unfinished)} messages", timeout + 10)
    expected = unfinished | acknowledged
    consumer = consume_through_lookupd(tmp_path, consumers, lookupd, "consumer",
                                       partial(covers, expected), 40, topic=topic)
    missing = expected - set(consumer.bodies())
    assert not missing, (f"{len(missing)} of {len(expected)} lost: {sorted(missing)[:3]}\n"
                         f"{consumer.log()}\n{replication_log(a, b, c)}")
    if cut == "both-ways":
        wait_for("B's copies delivered and finished", lambda: depth(b, topic, in_flight=True) == 0, 10)
    time.sleep(1.0)  # a late second copy would have come now
    got = Counter(consumer.bodies())
    twice = {body for body, k in got.items() if k > 1}
    extra = sum(k - 1 for k in got.values())
    assert set(got) <= unfinished | offered, sorted(set(got) - unfinished - offered)[:3]
    if cut == "owner-to-replica":
        assert not twice, (f"{len(twice)} delivered twice (B let go: only C should deliver): {sorted(twice)[:3]}\n"
                           f"{replication_log(b, c)}")
    else:
        assert twice <= unfinished and extra <= len(unfinished), (len(twice), extra, sorted(twice - unfinished)[:3])
        assert ping(a) == ping(b) == (200, b"OK")
    print(f"split {cut}: {len(answers)} publishes during it ({sum(1 for x in answers if x[2] == 200)} OK, "
          f"slowest {slowest:.2f} s), on C {moved:.1f} s after the split; {len(unfinished)} unfinished at the "
          f"split, {extra} delivered twice")
