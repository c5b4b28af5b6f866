"""``--workers``: one node on several processes, to clients one nsqd (real daemons on loopback).

The client suites' behaviours run against ``--workers=2`` too: the modules
that define a ``workers`` fixture with the parameters ``[1, 2]``
(``test_pynsq.py``, ``test_protocol_live.py``, ``test_client_live.py``,
``test_features_live.py``). This module checks what only a node on several
processes can get wrong: every publisher's messages reach a consumer on the
one address exactly once, a worker killed with -9 is started again without
losing an acknowledged message, and a clean stop under load loses nothing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from nsqtw.nsqd.cpus import auto_workers
from nsqtw.workers.pool import HTTP_HOLD
from tests.helpers import wait_for
from tests.rawclient import Client, collect, subscribe

PUBLISHERS = 8


def direct_children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:  # gone
        return []


def children(pid: int) -> list[int]:
    """The worker processes of the node whose core is ``pid``: the children of its fork server
    (the core's one child)."""
    return [w for server in direct_children(pid) for w in direct_children(server)]


def stats(d: Any) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{d.http_address}/stats?format=json", timeout=10) as r:
        return dict(json.load(r))


class Publisher(threading.Thread):
    """Publishes numbered bodies one PUB at a time, reconnecting after an error; remembers each
    body whose OK it read (acknowledged), until told to stop or ``count`` are acknowledged."""

    def __init__(self, address: str, topic: str, name: str, count: int | None = None) -> None:
        super().__init__(daemon=True)
        self.address, self.topic, self.tag, self.count = address, topic, name, count
        self.acked: list[bytes] = []
        self.errors = 0
        self.stopping = threading.Event()
        self.connected = threading.Event()

    def run(self) -> None:
        n = 0
        client: Client | None = None
        while not self.stopping.is_set() and (self.count is None or len(self.acked) < self.count):
            body = f"{self.tag}-{n}".encode()
            try:
                if client is None:
                    client = Client(self.address)
                    self.connected.set()
                client.pub(self.topic, body)
            except (OSError, AssertionError, Exception):
                self.errors += 1
                if client is not None:
                    client.close()
                client = None
                time.sleep(0.05)
                continue
            self.acked.append(body)
            n += 1
        if client is not None:
            client.close()


def drain(address: str, topic: str, channel: str, expected: set[bytes], timeout: float = 60) -> list[bytes]:
    """Every message of the channel, read and FINed until ``expected`` are all in (or timeout)."""
    c = subscribe(address, topic, channel, rdy=500)
    got: list[bytes] = []

    def enough(by: dict[int, list[Any]]) -> bool:
        got[:] = [m.body for m in by[0]]
        return expected <= set(got)

    collect([c], enough, timeout)
    c.close()
    return got


def test_a_consumer_on_the_one_address_gets_every_message_exactly_once(daemon_factory) -> None:
    d = daemon_factory("--workers=2")
    assert len(wait_for(lambda: len(children(d.pid)) == 2 and children(d.pid), what="two workers")) == 2
    consumer = subscribe(d.tcp_address, "w", "c", rdy=1000)
    publishers = [Publisher(d.tcp_address, "w", f"p{i}", count=300) for i in range(PUBLISHERS)]
    for p in publishers:
        p.start()
    expected = {f"p{i}-{n}".encode() for i in range(PUBLISHERS) for n in range(300)}
    got = collect([consumer], lambda by: len(by[0]) >= len(expected), timeout=120)[0]
    for p in publishers:
        p.join(30)
    bodies = [m.body for m in got]
    assert set(bodies) == expected
    assert len(bodies) == len(expected)  # none twice
    assert not any(p.errors for p in publishers)
    assert consumer.nothing_for(0.5) == []  # and nothing more
    # /stats shows the one node: the topic's count, the consumer the workers serve
    s = stats(d)
    (topic,) = s["topics"]
    assert topic["message_count"] == len(expected)
    (channel,) = topic["channels"]
    (client,) = channel["clients"]
    assert (client["state"], client["ready_count"], client["finish_count"]) == (3, 1000, len(expected))
    consumer.close()


def test_stats_lists_each_worker_clients_publishes(daemon_factory) -> None:
    d = daemon_factory("--workers=2")
    clients = [Client(d.tcp_address) for _ in range(4)]
    for i, c in enumerate(clients):
        for _ in range(i + 1):
            c.pub("s", b"x")
    producers = stats(d)["producers"]
    assert sorted(p["pub_counts"][0]["count"] for p in producers) == [1, 2, 3, 4]
    for c in clients:
        c.close()


def test_a_worker_killed_under_load_is_started_again_and_nothing_acknowledged_is_lost(daemon_factory) -> None:
    d = daemon_factory("--workers=2")
    workers = wait_for(lambda: len(children(d.pid)) == 2 and children(d.pid), what="two workers")
    # a consumer that holds messages without FIN: whichever worker it is on dies below
    holder = subscribe(d.tcp_address, "k", "c", rdy=20)
    publishers = [Publisher(d.tcp_address, "k", f"p{i}") for i in range(4)]
    for p in publishers:
        p.start()
    wait_for(lambda: all(len(p.acked) > 50 for p in publishers), what="publishes")
    held = collect([holder], lambda by: len(by[0]) >= 20, timeout=20, fin=False)[0]
    assert len(held) == 20
    for killed, pid in enumerate(workers, 1):  # each worker in turn, under load
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda killed=killed: len(re.findall(r"WORKER\(\d\): exited .*signal 9", d.read_output()))
                 == killed, what="the core seeing its worker die")
        wait_for(lambda pid=pid: len(children(d.pid)) == 2 and pid not in children(d.pid),
                 what="the worker started again")
        acked = sum(len(p.acked) for p in publishers)
        wait_for(lambda acked=acked: sum(len(p.acked) for p in publishers) > acked + 50,
                 what="publishes after the restart")
    for p in publishers:
        p.stopping.set()
    for p in publishers:
        p.join(30)
    assert all(p.errors for p in publishers)  # both workers died: every publisher's connection
    acknowledged = {b for p in publishers for b in p.acked}
    # the held messages went back to the channel when their worker died: delivered again
    got = drain(d.tcp_address, "k", "c", acknowledged | {m.body for m in held})
    assert acknowledged <= set(got)


def test_a_publish_the_worker_answered_survives_its_kill_while_the_core_is_stopped(daemon_factory) -> None:
    """A worker answers a publish its grant covers without waiting for the core, once the record is
    in the kernel's socket buffer: answered with the core stopped (SIGSTOP), then the worker
    killed with -9 before the core ever ran, the message is still delivered."""
    d = daemon_factory("--workers=2")
    workers = wait_for(lambda: len(children(d.pid)) == 2 and children(d.pid), what="the workers")
    subscribe(d.tcp_address, "g", "c", rdy=0).close()
    publisher = Client(d.tcp_address)
    publisher.pub("g", b"asked the core")  # answered by the core, with a grant for the topic
    os.kill(d.pid, signal.SIGSTOP)
    try:
        publisher.pub("g", b"answered by the worker")  # reads the OK: the worker alone answered
        for pid in workers:  # whichever served the publisher
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not any(alive(pid) for pid in workers), what="the workers gone")
    finally:
        os.kill(d.pid, signal.SIGCONT)
    publisher.close()
    wait_for(lambda: len(children(d.pid)) == 2 and not set(workers) & set(children(d.pid)),
             what="the workers started again")
    got = drain(d.tcp_address, "g", "c", {b"asked the core", b"answered by the worker"}, timeout=20)
    assert sorted(got) == [b"answered by the worker", b"asked the core"]


def test_a_clean_stop_under_load_loses_nothing(daemon_factory, tmp_path) -> None:
    path = str(tmp_path / "node")
    d = daemon_factory("--workers=2", data_path=path)
    # the channel exists before the first publish, so it holds every message
    subscribe(d.tcp_address, "z", "c", rdy=0).close()
    publishers = [Publisher(d.tcp_address, "z", f"p{i}") for i in range(4)]
    for p in publishers:
        p.start()
    wait_for(lambda: all(len(p.acked) > 100 for p in publishers), what="publishes")
    assert d.stop() == 0
    for p in publishers:
        p.stopping.set()
    for p in publishers:
        p.join(30)
    acknowledged = {b for p in publishers for b in p.acked}
    again = daemon_factory("--workers=2", data_path=path)
    got = drain(again.tcp_address, "z", "c", acknowledged)
    assert acknowledged <= set(got)
    assert len(got) == len(set(got))


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by a dead parent, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_workers_die_with_the_core_and_leave_with_a_clean_stop(daemon_factory) -> None:
    killed = daemon_factory("--workers=2")
    orphans = wait_for(lambda: len(children(killed.pid)) == 2 and children(killed.pid), what="two workers")
    killed.kill()  # SIGKILL of the core: its workers end too (PR_SET_PDEATHSIG, else the link's end)
    wait_for(lambda: not any(alive(p) for p in orphans), timeout=10, what="the workers gone with the core")
    stopped = daemon_factory("--workers=2")
    workers = wait_for(lambda: len(children(stopped.pid)) == 2 and children(stopped.pid), what="two workers")
    assert stopped.stop() == 0
    assert not any(alive(p) for p in workers)
    assert "starting it again" not in stopped.read_output()  # a stopping node restarts no worker


def test_the_default_chooses_the_workers_from_the_usable_cpus(daemon_factory) -> None:
    """--workers=0, the default: the count comes from the CPUs the daemon may run on, and the log says so."""
    d = daemon_factory("--workers=0")
    cpus = len(os.sched_getaffinity(0))
    count = auto_workers(cpus)
    line = wait_for(lambda: next((x for x in d.output if "usable CPUs" in x), None), what="the workers line")
    assert f"({cpus} usable CPUs; --workers=0, the default, chose" in line
    if count == 1:
        assert "one process serves every client" in line
        assert children(d.pid) == []
    else:
        assert f"{count} worker processes serve TCP clients" in line
        wait_for(lambda: len(children(d.pid)) == count, what=f"{count} workers")
    c = Client(d.tcp_address)
    c.pub("auto", b"x")
    assert stats(d)["topics"][0]["message_count"] == 1
    c.close()


def client_sockets(port: int) -> set[int]:
    """The inodes of the established TCP sockets whose local port is ``port`` (the node's side)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                        inodes.add(int(fields[9]))
        except OSError:
            pass
    return inodes


def held(pid: int, inodes: set[int]) -> int:
    """How many of the sockets ``inodes`` process ``pid`` holds."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and int(target[8:-1]) in inodes:
            count += 1
    return count


def per_worker(d: Any, workers: list[int], expected: int) -> list[int]:
    """How many of the node's client connections each worker holds, once ``expected`` are held."""
    def counts() -> list[int] | None:
        inodes = client_sockets(d.tcp[1])
        each = [held(pid, inodes) for pid in workers]
        return each if sum(each) >= expected else None

    return list(wait_for(counts, what=f"{expected} connections held by the workers"))


def test_connections_spread_evenly_over_the_workers_idle_and_busy(daemon_factory) -> None:
    """The core hands each connection to the worker with the fewest: 64 connections over 4
    workers are 16 each when idle, and still within 10-22 each while two publishers keep
    workers busy; the core itself holds none."""
    d = daemon_factory("--workers=4")
    workers = wait_for(lambda: (w := children(d.pid)) and len(w) == 4 and w, what="four workers")
    clients = [Client(d.tcp_address) for _ in range(64)]
    for c in clients:  # each connection is served (the magic took; a NOP needs no answer)
        c.send(b"NOP\n")
    each = per_worker(d, workers, 64)
    assert all(10 <= n <= 22 for n in each), each
    assert held(d.pid, client_sockets(d.tcp[1])) == 0
    for c in clients:
        c.close()
    wait_for(lambda: sum(held(pid, client_sockets(d.tcp[1])) for pid in workers) == 0, what="all closed")
    busy = [Publisher(d.tcp_address, "spread", f"p{i}") for i in range(2)]
    for p in busy:
        p.start()
        p.connected.wait(10)
    try:
        clients = [Client(d.tcp_address) for _ in range(64)]
        each = per_worker(d, workers, 66)
        assert all(10 <= n <= 22 for n in each), each
    finally:
        for p in busy:
            p.stopping.set()
        for p in busy:
            p.join(10)
        for c in clients:
            c.close()


def test_connections_made_while_workers_start_are_spread_over_all(daemon_factory, tmp_path) -> None:
    """Clients that connect while the workers start wait in the backlog until every worker is ready,
    then are spread over all of them: the first worker ready does not take them all."""
    d = daemon_factory("--workers=4", env={"NSQTW_TEST_HOLD_WORKERS": str(tmp_path / "release-{index}")})
    workers = wait_for(lambda: (w := children(d.pid)) and len(w) == 4 and w, what="four workers")
    (tmp_path / "release-0").touch()
    time.sleep(1.0)  # worker 0 serves; the others are held
    clients = [Client(d.tcp_address) for _ in range(64)]
    for c in clients:
        c.send(b"NOP\n")
    time.sleep(0.5)
    assert sum(held(pid, client_sockets(d.tcp[1])) for pid in workers) == 0, "accepted before all were ready"
    for index in (1, 2, 3):
        (tmp_path / f"release-{index}").touch()
    try:
        each = per_worker(d, workers, 64)
        assert all(10 <= n <= 22 for n in each), each
    finally:
        for c in clients:
            c.close()


def _raw_get(address: str, path: str) -> socket.socket:
    """A GET sent on a fresh connection; the answer is left to read."""
    host, port = address.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n".encode())
    return s


def _read_all(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    s.close()
    return out


def test_ping_and_ready_wait_for_every_worker(daemon_factory, tmp_path, notify_socket) -> None:
    """Until every worker is ready the service manager hears nothing, and HTTP requests wait in
    the backlog as TCP clients do: a ``/ping`` sent as soon as the ``listening on`` lines are out
    (gnsq's test harness does that) is answered ``OK`` once the workers are, as Go nsqd's would
    be, not ``500`` meanwhile; a client that connects meanwhile is served then too."""
    release = tmp_path / "release"
    path, notify = notify_socket
    d = daemon_factory("--workers=2", env={"NSQTW_TEST_HOLD_WORKERS": str(release), "NOTIFY_SOCKET": path})
    ping = _raw_get(d.http_address, "/ping")
    early = Client(d.tcp_address)
    early.cmd("PUB", "early", body=b"x")
    ping.settimeout(1.5)
    try:
        said = ping.recv(100)
    except TimeoutError:
        said = b""
    assert said == b"", f"/ping answered before the workers were ready: {said!r}"
    notify.settimeout(0.3)
    try:
        said = notify.recv(100)
    except OSError:
        said = b""
    assert b"READY=1" not in said
    release.touch()
    ping.settimeout(10)
    answer = _read_all(ping)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\nOK"), answer
    assert early.response() == (0, b"OK")
    notify.settimeout(10)
    assert notify.recv(100) == b"READY=1"
    with urllib.request.urlopen(f"http://{d.http_address}/ping", timeout=5) as r:
        assert r.read() == b"OK"
    early.close()


def test_http_answers_after_its_hold_when_workers_do_not_start(daemon_factory, tmp_path) -> None:
    """The HTTP listeners wait for the workers ``HTTP_HOLD`` seconds at most: workers that do not
    start leave ``/ping`` answering ``500 NOK - worker processes starting`` after that."""
    d = daemon_factory("--workers=2", env={"NSQTW_TEST_HOLD_WORKERS": str(tmp_path / "never")})
    began = time.monotonic()
    try:
        urllib.request.urlopen(f"http://{d.http_address}/ping", timeout=HTTP_HOLD + 10)
        raise AssertionError("/ping answered OK before the workers were ready")
    except urllib.error.HTTPError as e:
        assert e.code == 500
        assert e.read() == b"NOK - worker processes starting"
    assert time.monotonic() - began >= HTTP_HOLD - 1


def test_ping_ok_right_after_the_listening_lines(daemon_factory) -> None:
    """gnsq's harness: read the ``listening on`` lines, then ``/ping`` at once, expecting OK
    (with four workers starting on a busy machine, they are seldom all ready by then)."""
    d = daemon_factory("--workers=4")
    with urllib.request.urlopen(f"http://{d.http_address}/ping", timeout=HTTP_HOLD + 5) as r:
        assert r.read() == b"OK"
