"""Real ``--replicas=2`` clusters on loopback, shared by the replication tests: nsqtw-lookupd and
nsqtw nodes as processes (port 0, each in its own folder), HTTP and ``/stats`` probes, and a consumer
that finds the nodes through lookupd, in a process of its own.

The ``cluster`` and ``consumers`` fixtures (tests/reliability/conftest.py) stop what a test started.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from tests import helpers
from tests.daemon import ROOT, TWISTD, Daemon, LookupdDaemon, Started
from tests.rawclient import FRAME_MESSAGE, Client, Msg
from tests.reliability.faults import faulty_daemon_code

TOPIC = "t"
CHANNEL = "c"
#: how long a replica may take to be chosen and in step: nodes read lookupd's /nodes every 15 s
CHOSEN_WITHIN = 60.0


# -- HTTP -------------------------------------------------------------------------------------------


def http(address: str, method: str, path: str, body: bytes | None = None,
         timeout: float = 30.0) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://{address}{path}", data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def post(address: str, path: str, body: bytes | None = None) -> None:
    code, answer = http(address, "POST", path, body)
    assert code == 200, (path, code, answer)


def stats(node: Daemon) -> dict[str, Any]:
    code, body = http(node.http_address, "GET", "/stats?format=json", timeout=10.0)
    assert code == 200, (code, body)
    return dict(json.loads(body))


def topic_stats(node: Daemon, topic: str = TOPIC) -> dict[str, Any] | None:
    for t in stats(node).get("topics", []):
        if t["topic_name"] == topic:
            return dict(t)
    return None


def replica_of(node: Daemon, topic: str = TOPIC) -> dict[str, Any] | None:
    """The topic's ``replica`` object in the node's /stats (None while the topic or field is missing)."""
    t = topic_stats(node, topic)
    return None if t is None else t.get("replica")


def in_sync(node: Daemon, topic: str = TOPIC) -> dict[str, Any] | None:
    r = replica_of(node, topic)
    return r if r is not None and r.get("state") == "in_sync" and r.get("peer") else None


def wait_for(what: str, check: Callable[[], Any], timeout: float) -> Any:
    return helpers.wait_for(check, timeout, what)


def log_tail(*daemons: Daemon, chars: int = 3000) -> str:
    return "\n".join(f"--- {d.plugin} {d.http_address} ---\n{d.read_output()[-chars:]}" for d in daemons)


# -- daemons ----------------------------------------------------------------------------------------


class Cluster:
    """nsqtw-lookupd and nsqtw nodes, each in its own folder under the test's tmp_path."""

    def __init__(self, root: str) -> None:
        self.started = Started(root)
        self.lookupd: LookupdDaemon | None = None
        self.count = 0
        #: the faults (:mod:`tests.reliability.faults`' environment) of the nodes to come, by number
        self.faults_of: dict[int, dict[str, str]] = {}

    def start_lookupd(self) -> LookupdDaemon:
        self.lookupd = LookupdDaemon(self.started.folder("lookupd"), "--broadcast-address=127.0.0.1")
        self.started.start(self.lookupd)
        return self.lookupd

    def restart_lookupd(self) -> LookupdDaemon:
        """lookupd started again on its ports after a kill: a new process, knowing no node until
        they connect again (each retries with its backoff, at most 15 s apart)."""
        assert self.lookupd is not None
        lookupd = self.lookupd
        lookupd.start(tcp=lookupd.tcp_address, http=lookupd.http_address)
        return lookupd

    def _daemon(self, *args: str) -> Daemon:
        assert self.lookupd is not None
        self.count += 1
        faults = self.faults_of.get(self.count)
        d = Daemon(self.started.folder(f"node{self.count}"), "--broadcast-address=127.0.0.1",
                   f"--lookupd-tcp-address={self.lookupd.tcp_address}", *args, env=faults,
                   code=TWISTD if faults is None else faulty_daemon_code())
        self.started.daemons.append(d)
        return d

    def node(self, *args: str) -> Daemon:
        return self._daemon(*args).start(timeout=40)

    def nodes(self, *args_each: tuple[str, ...]) -> list[Daemon]:
        """One node per tuple of arguments, started together: they register with lookupd within
        moments of each other, so each usually finds all the others in the same read of lookupd's
        /nodes instead of over its 15 s polls (see :func:`candidates_of`)."""
        daemons = [self._daemon(*args) for args in args_each]
        with ThreadPoolExecutor(len(daemons)) as pool:
            return list(pool.map(lambda d: d.start(timeout=60), daemons))


def address_of(node: Daemon) -> str:
    """The node's name among replicas (and in lookupd): its broadcast address and HTTP port, which
    ``--broadcast-http-port`` sets when given."""
    port = node.http[1]
    for arg in node.args:
        if arg.startswith("--broadcast-http-port="):
            port = int(arg.split("=", 1)[1])
    return f"127.0.0.1:{port}"


_CANDIDATES = re.compile(r"REPLICATION: candidates (\[[^\]]*\]|none)")


def candidates_of(node: Daemon) -> set[str]:
    """The peers the node's log last said it may place copies on (``REPLICATION: candidates [...]``)."""
    found = _CANDIDATES.findall(node.read_output())
    if not found or found[-1] == "none":
        return set()
    return set(re.findall(r"'([^']+)'", found[-1]))


def knows(node: Daemon, *others: Daemon) -> bool:
    """Whether ``node``'s candidates are exactly ``others`` (a topic made now is placed among them)."""
    return candidates_of(node) == {address_of(o) for o in others}


def nodes_registered(lookupd: Daemon, *nodes: Daemon) -> bool:
    _, body = http(lookupd.http_address, "GET", "/nodes", timeout=10.0)
    have = {p["http_port"] for p in json.loads(body).get("producers", [])}
    return {int(address_of(n).rsplit(":", 1)[1]) for n in nodes} <= have


# -- the consumer through lookupd, a process of its own ----------------------------------------------

CONSUMER = r"""
import sys
from twisted.internet import reactor
from twisted.internet.task import LoopingCall
from nsqtw.client import Config, Consumer

lookupd, topic, channel, path, max_in_flight, poll = sys.argv[1:]
out = open(path, "ab")


def handle(msg):
    out.write(msg.body + b" " + msg.id + b" " + msg.nsqd_address.encode() + b"\n")


config = Config(max_in_flight=int(max_in_flight), lookupd_poll_interval=float(poll),
                lookupd_poll_jitter=0.1, max_attempts=0, rdy_redistribute_interval=1.0)
consumer = Consumer(topic, channel, handle, config, lookupd_http_addresses=[lookupd])
LoopingCall(out.flush).start(0.05)
reactor.addSystemEventTrigger("after", "shutdown", out.close)
consumer.start()
reactor.run()
"""


class LookupdConsumer:
    """``nsqtw.client.Consumer`` given only lookupd's HTTP address; ``bodies()`` is what it was handed."""

    def __init__(self, folder: str, lookupd: Daemon, max_in_flight: int = 100, poll: float = 0.5,
                 topic: str = TOPIC, channel: str = CHANNEL) -> None:
        self.path = os.path.join(folder, "consumed")
        self.log_path = os.path.join(folder, "consumer.log")
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", CONSUMER, lookupd.http_address, topic, channel, self.path,
                 str(max_in_flight), str(poll)],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env, cwd=folder)

    def records(self) -> list[tuple[bytes, bytes, bytes]]:
        """(body, message ID, node) per message handed to the handler so far (whole lines only)."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        lines = data.split(b"\n")[:-1]
        return [tuple(line.split(b" ", 2)) for line in lines]  # type: ignore[misc]

    def bodies(self) -> list[bytes]:
        return [r[0] for r in self.records()]

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read()[-3000:].decode("utf-8", "replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def consume_through_lookupd(tmp_path: Path, consumers: list[LookupdConsumer], lookupd: Daemon, name: str,
                           until: Callable[[list[bytes]], bool], timeout: float,
                           topic: str = TOPIC, channel: str = CHANNEL) -> LookupdConsumer:
    """Start a lookupd consumer in ``tmp_path/name`` and wait (at most ``timeout``) for ``until(bodies)``."""
    folder = tmp_path / name
    folder.mkdir()
    consumer = LookupdConsumer(str(folder), lookupd, max_in_flight=100, poll=0.5, topic=topic, channel=channel)
    consumers.append(consumer)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not until(consumer.bodies()):
        time.sleep(0.2)
    return consumer


# -- nodes, topics and what they hold (the replication tests' shared steps) ---------------------------

#: a new node is found within a second while a node knows no peer, else at lookupd's next read (15 s)
KNOWN_WITHIN = 40.0


def wait_known(*nodes: Daemon) -> None:
    """Until each node knows all the others as candidates (so a topic made now is placed among them)."""
    wait_for("each node's candidates are the other nodes",
             lambda: all(knows(n, *(o for o in nodes if o is not n)) for n in nodes), KNOWN_WITHIN)


def start_nodes(cluster: Cluster, *args_each: tuple[str, ...]) -> list[Daemon]:
    """Nodes started together, returned once each knows all the others."""
    nodes = cluster.nodes(*args_each)
    wait_known(*nodes)
    return nodes


def peer_of(node: Daemon, topic: str) -> str | None:
    """Where the node places the topic's copies (/stats ``replica.peer``)."""
    return (replica_of(node, topic) or {}).get("peer")


def covers(expected: set[bytes], got: list[bytes]) -> bool:
    return expected <= set(got)


def make_topic(owner: Daemon, replica: Daemon, prefix: str, channel: str | None = CHANNEL) -> str:
    """A topic of ``owner`` (with ``channel``) whose copies go to ``replica``: names are tried in turn
    (rendezvous spreads them over the candidates) and /stats tells where each was placed."""
    for i in range(40):
        name = f"{prefix}{i}"
        post(owner.http_address, f"/topic/create?topic={name}")
        peer = wait_for(f"{name} placed on a replica", partial(peer_of, owner, name), 10)
        if peer == address_of(replica):
            if channel is not None:
                post(owner.http_address, f"/channel/create?topic={name}&channel={channel}")
            wait_for(f"{name}'s replica in step", partial(in_sync, owner, name), 20)
            return name
        post(owner.http_address, f"/topic/delete?topic={name}")
    raise AssertionError(f"no topic of {address_of(owner)} placed on {address_of(replica)} in 40 names")


def mpub(node: Daemon, topic: str, bodies: list[bytes], timeout: float = 30.0) -> tuple[int, bytes]:
    return http(node.http_address, "POST", f"/mpub?topic={topic}", b"\n".join(bodies), timeout=timeout)


def publish_all(node: Daemon, topic: str, bodies: list[bytes]) -> None:
    """Every body published and acknowledged (200 OK: the replica holds its copy)."""
    for i in range(0, len(bodies), 200):
        code, answer = mpub(node, topic, bodies[i:i + 200])
        assert (code, answer) == (200, b"OK"), (topic, i, code, answer, log_tail(node))


def finish_some(node: Daemon, topic: str, count: int, max_in_flight: int = 50) -> set[bytes]:
    """FIN ``count`` messages of ``topic``/``CHANNEL`` on the node itself, then leave: what else was
    in flight goes back to the channel unfinished. Returns the finished bodies."""
    finished: set[bytes] = set()
    sub = Client(node.tcp_address, timeout=30.0)
    sub.sub(topic, CHANNEL, max_in_flight)
    while len(finished) < count:
        m = sub.message(30.0)
        sub.fin(m)
        finished.add(m.body)
    sub.cmd("RDY", 0)
    try:  # those already on their way are not finished: they are requeued when it leaves
        while True:
            f = sub.read(0.5)
            assert f[0] == FRAME_MESSAGE, f
            assert Msg(f[1]).body not in finished
    except TimeoutError:
        pass
    sub.close()
    return finished


def publish_and_finish(owner: Daemon, replica: Daemon, topic: str, bodies: list[bytes], count: int) -> set[bytes]:
    """Every body published to the owner, ``count`` of them finished there; once the replica holds
    exactly the rest (FINs travel to it without an answer), returns that rest."""
    publish_all(owner, topic, bodies)
    unfinished = set(bodies) - finish_some(owner, topic, count)
    wait_for(f"{address_of(replica)} holds {address_of(owner)}'s unfinished messages of {topic}, and only those",
             lambda: held_for(replica, owner, topic) == len(unfinished), 20)
    return unfinished


def held_for(replica: Daemon, owner: Daemon, topic: str) -> int:
    """Unfinished messages the replica holds for the owner's topic (its /stats ``standby``), not taken over."""
    return sum(int(s["messages"]) for s in stats(replica).get("standby") or []
               if s["owner"] == address_of(owner) and s["topic"] == topic and not s["taken_over"])


def standby_topics(replica: Daemon, owner: Daemon) -> set[str]:
    return {str(s["topic"]) for s in stats(replica).get("standby") or [] if s["owner"] == address_of(owner)}


def depth(node: Daemon, topic: str, channel: str = CHANNEL, in_flight: bool = False) -> int:
    """The channel's depth on the node (with ``in_flight``, its messages in flight too)."""
    t = topic_stats(node, topic) or {}
    return sum(int(c["depth"]) + (int(c["in_flight_count"]) if in_flight else 0)
               for c in t.get("channels", []) if c["channel_name"] == channel)


def replication_log(*nodes: Daemon) -> str:
    """The nodes' REPLICATION lines (what a failure needs: who was placed where, and when)."""
    return "\n".join(f"--- {address_of(n)} ---\n" + "\n".join(
        line for line in n.read_output().splitlines() if "REPLICATION" in line)[-4000:] for n in nodes)


def lose(node: Daemon) -> None:
    """The machine lost: kill -9, its data directory gone with it."""
    node.kill()
    shutil.rmtree(node.data_path)


def ping(node: Daemon) -> tuple[int, bytes]:
    return http(node.http_address, "GET", "/ping", timeout=5.0)
