"""A data path on a disk that fills up, then gets space back (issue #15 item 1).

Where the test may mount (root), the data path is on a real 8 MiB tmpfs
that a filler file fills to the last byte and that gets its space back when
the file is removed; the same scenarios also run everywhere with an
injected fault in the disk layer (writes fail with ENOSPC while a flag file
exists, see :mod:`tests.reliability.faults`).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from tests.daemon import Daemon
from tests.rawclient import Client, subscribe
from tests.reliability.conftest import assert_no_traceback, http_raw, ping, status_of, wait_for
from tests.reliability.faults import faulty_daemon_code

DiskFull = tuple[Daemon, Callable[[], None], Callable[[], None]]


def _filler(path: str) -> Callable[[], None]:
    """Fill the filesystem of ``path`` up to its last byte with one file."""
    def fill() -> None:
        with open(os.path.join(path, "filler"), "wb", buffering=0) as f:
            for size in (65536, 1):  # then the last partial chunk
                try:
                    while True:
                        f.write(b"\0" * size)
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e
    return fill


def _full_disk(kind: str, tmp_path, *extra: str) -> Iterator[DiskFull]:
    """A running daemon (with ``extra`` flags), ``fill()`` its disk and ``make_room()`` again."""
    if kind == "tmpfs":
        path = tmp_path / "fs"
        path.mkdir()
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(path)],
                                capture_output=True)
        if result.returncode != 0:
            pytest.skip("cannot mount tmpfs here (the injected variant covers it): "
                        + result.stderr.decode().strip())
        data = path / "data"
        data.mkdir()
        d = Daemon(str(data), "--mem-queue-size=0", "--max-bytes-per-file=65536", *extra)
        d.start()
        try:
            yield d, _filler(str(path)), lambda: os.unlink(path / "filler")
        finally:
            d.stop()
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
    else:
        path = tmp_path / "data"
        path.mkdir()
        flag = str(tmp_path / "disk-is-full")
        d = Daemon(str(path), "--mem-queue-size=0", "--max-bytes-per-file=65536", *extra,
                   code=faulty_daemon_code(), env={"NSQTW_TEST_DISK_FULL_FLAG": flag})
        d.start()
        try:
            yield d, lambda: open(flag, "w").close(), lambda: os.unlink(flag)
        finally:
            d.stop()


@pytest.fixture(params=["tmpfs", "injected"])
def full_disk(request, tmp_path) -> Iterator[DiskFull]:
    """A running daemon, ``fill()`` its disk and ``make_room()`` again."""
    yield from _full_disk(request.param, tmp_path)


@pytest.fixture(params=["tmpfs", "injected"])
def full_disk_workers(request, tmp_path) -> Iterator[DiskFull]:
    """The same with ``--workers=2``: the core writes, the workers answer publishes under grants."""
    yield from _full_disk(request.param, tmp_path, "--workers=2")


def http_post(d: Daemon, path: str, body: bytes = b"") -> int:
    request = (b"POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
               % (path.encode(), len(body))) + body
    return status_of(http_raw(d.http_address, request, timeout=30))


def test_disk_full_then_space_returns(full_disk) -> None:
    """Disk full: publishes are still taken (into bounded memory), /ping and /stats say NOK with the
    error; space back: health OK, and every acknowledged message is delivered."""
    _fill_then_make_room(*full_disk)


def test_disk_full_with_workers_then_space_returns(full_disk_workers) -> None:
    """The same through a node's worker processes, most publishes answered by a worker under the
    core's grant while the disk is full: none of them is lost."""
    _fill_then_make_room(*full_disk_workers)


def _fill_then_make_room(d: Daemon, fill: Callable[[], None], make_room: Callable[[], None]) -> None:
    acked = []
    body = b"x" * 1000
    for i in range(300):
        if i == 20:
            fill()
        c = Client(d.tcp_address)
        c.cmd("PUB", "t", body=b"%05d" % i + body)
        ftype, data = c.response(timeout=5)
        c.close()
        assert ftype == 0, data
        acked.append(b"%05d" % i + body)
    assert wait_for(lambda: ping(d)[0] == 500, 10)
    status, text = ping(d)
    assert status == 500 and text.startswith(b"NOK") and b"no space left on device" in text.lower(), text
    with urllib.request.urlopen(f"http://{d.http_address}/stats?format=json") as r:
        assert json.load(r)["health"].startswith("NOK")
    assert http_post(d, "/pub?topic=t", b"http") == 200
    acked.append(b"http")

    make_room()
    assert wait_for(lambda: ping(d)[0] == 200, 10)
    assert ping(d) == (200, b"OK")
    Client(d.tcp_address).pub("t", b"after")
    acked.append(b"after")

    got = {m.body for m in subscribe(d.tcp_address, "t", "c", rdy=200).drain()}
    assert set(acked) <= got
    assert_no_traceback(d)


def held_handoff(d: Daemon) -> list[bytes]:
    """Issue #15's set-up: channel c on topic full, the topic paused, 3,000 acknowledged messages of
    1 KB in the topic's queue (written by the time this returns); returns their bodies."""
    assert http_post(d, "/topic/create?topic=full") == 200
    assert http_post(d, "/channel/create?topic=full&channel=c") == 200
    assert http_post(d, "/topic/pause?topic=full") == 200
    bodies = [b"%05d" % i + b"k" * 1019 for i in range(3000)]
    c = Client(d.tcp_address)
    for i in range(0, 3000, 100):
        c.mpub("full", bodies[i:i + 100])
        assert c.response(timeout=10) == (0, b"OK")
    c.close()
    time.sleep(1.0)  # handed to the disk thread: written by now
    return bodies


def test_handoff_on_full_disk_loses_nothing(full_disk) -> None:
    """Issue #15's scenario: --mem-queue-size=0, channel c on topic full, the topic paused, 3,000
    messages of 1 KB published and acknowledged; the disk fills and the topic is unpaused (the
    hand-off to the channel fails to write); space returns: all 3,000 are delivered (were 950)."""
    d, fill, make_room = full_disk
    bodies = held_handoff(d)
    fill()
    assert http_post(d, "/topic/unpause?topic=full") == 200
    assert wait_for(lambda: ping(d)[0] == 500, 15), "the hand-off's writes did not fail"
    time.sleep(2.5)  # a couple of failed retries
    assert ping(d)[0] == 500
    make_room()
    assert wait_for(lambda: ping(d) == (200, b"OK"), 15), (ping(d), d.read_output()[-3000:])
    consumer = subscribe(d.tcp_address, "full", "c", rdy=500)
    got = []
    for m in consumer.drain():
        got.append(m.body)
        consumer.fin(m)
    assert len(got) == 3000 and set(got) == set(bodies), (len(got), len(set(got)))
    assert_no_traceback(d)


def test_parked_channels_overflow_on_a_full_disk_loses_nothing(tmp_path) -> None:
    """Ten channels without clients share their topic's log (parked) until their share would pass
    --mem-queue-size=100; the disk is full by then, so the copies they take as their own go to disk
    queues that cannot write: /ping says NOK. Space back: health OK, and each channel delivers every
    acknowledged message exactly once."""
    path = tmp_path / "data"
    path.mkdir()
    flag = str(tmp_path / "disk-is-full")
    d = Daemon(str(path), "--mem-queue-size=100", code=faulty_daemon_code(),
               env={"NSQTW_TEST_DISK_FULL_FLAG": flag})
    d.start()
    try:
        channels = [f"c{i}" for i in range(10)]
        assert http_post(d, "/topic/create?topic=t") == 200
        for ch in channels:
            assert http_post(d, f"/channel/create?topic=t&channel={ch}") == 200
        bodies = [b"%05d" % i for i in range(600)]
        pub = Client(d.tcp_address)
        pub.mpub("t", bodies[:100])  # the channels' shared log holds these
        assert pub.response(timeout=10) == (0, b"OK")
        open(flag, "w").close()
        for i in range(100, 600, 100):  # past the bound: each channel's own copies, to its disk queue
            pub.mpub("t", bodies[i:i + 100])
            assert pub.response(timeout=10) == (0, b"OK")
        assert wait_for(lambda: ping(d)[0] == 500, 15), "the channels' writes did not fail"
        stats = json.loads(urllib.request.urlopen(f"http://{d.http_address}/stats?format=json&topic=t").read())
        depths = {c["channel_name"]: c["depth"] for c in stats["topics"][0]["channels"]}
        assert depths == dict.fromkeys(channels, 600)
        os.unlink(flag)
        assert wait_for(lambda: ping(d) == (200, b"OK"), 15), ping(d)
        consumers = {ch: subscribe(d.tcp_address, "t", ch, rdy=600) for ch in channels}
        for ch, consumer in consumers.items():
            got = [m.body for m in consumer.messages(600, timeout=30, fin=True)]
            assert sorted(got) == bodies, ch
        for ch, consumer in consumers.items():
            assert consumer.nothing_for(0.2) == [], f"{ch} delivered more than 600"
        assert_no_traceback(d)
    finally:
        d.stop()


def _publishers_against_a_full_disk(tmp_path, topic_of: Callable[[int], str], taken: tuple[int, int],
                                    *flags: str) -> None:
    """50 concurrent MPUB publishers (480 KB each, 24 MB in all) against a full disk, publisher n to
    ``topic_of(n)``: only ``taken`` (low, high) of them are answered while the disk is full, the rest
    are not read; an HTTP publisher gets 503 after its wait; space back: every publisher gets OK and
    every message is delivered."""
    path = tmp_path / "data"
    path.mkdir()
    flag = str(tmp_path / "disk-is-full")
    d = Daemon(str(path), "--mem-queue-size=0", *flags, code=faulty_daemon_code(),
               env={"NSQTW_TEST_DISK_FULL_FLAG": flag})
    d.start()
    try:
        topics = sorted({topic_of(n) for n in range(50)})
        for topic in topics:
            assert http_post(d, f"/topic/create?topic={topic}") == 200
            assert http_post(d, f"/channel/create?topic={topic}&channel=c") == 200
        open(flag, "w").close()
        answers: dict[int, tuple[float, tuple[int, bytes]]] = {}
        started = time.monotonic()

        def publish(n: int) -> None:
            c = Client(d.tcp_address, timeout=90)
            c.mpub(topic_of(n), [b"%02d-%02d-" % (n, i) + b"p" * 48_000 for i in range(10)])
            answers[n] = (time.monotonic() - started, c.response(timeout=90))
            c.close()

        threads = [threading.Thread(target=publish, args=(n,)) for n in range(50)]
        for t in threads:
            t.start()
        assert wait_for(lambda: len(answers) >= taken[0], 20)
        time.sleep(2.0)
        early = dict(answers)
        assert taken[0] <= len(early) <= taken[1], len(early)
        assert all(a == (0, b"OK") for _, a in early.values())
        http_started = time.monotonic()
        assert http_post(d, f"/pub?topic={topics[-1]}", b"refused") == 503
        assert 9 <= time.monotonic() - http_started < 20
        assert len(answers) == len(early)  # still nobody else answered
        os.unlink(flag)
        for t in threads:
            t.join(60)
        assert len(answers) == 50 and all(a == (0, b"OK") for _, a in answers.values()), answers
        got: set[bytes] = set()
        for topic in topics:
            got |= {m.body[:6] for m in subscribe(d.tcp_address, topic, "c", rdy=200).drain()}
        assert got == {b"%02d-%02d-" % (n, i) for n in range(50) for i in range(10)}
        assert_no_traceback(d)
    finally:
        d.stop()


def test_publishers_wait_at_the_bound(tmp_path) -> None:
    """One topic: publishes are taken only while its unwritten backlog is under its own bound
    (16 MiB / 480 KB: at most 35 batches, the one crossing the bound included)."""
    _publishers_against_a_full_disk(tmp_path, lambda n: "t", (30, 35))


def test_publishers_of_many_topics_wait_at_the_node_bound(tmp_path) -> None:
    """Ten topics, each far under its own bound (5 publishers, 2.4 MB): together they are held to the node's
    ``--max-unwritten-bytes`` (4 MiB / 480 KB: at most 9 batches, the one crossing it included),
    so memory waiting for the disk does not grow with the number of topics."""
    _publishers_against_a_full_disk(tmp_path, lambda n: f"t{n % 10}", (7, 9), "--max-unwritten-bytes=4194304")
