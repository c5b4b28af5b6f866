"""--durable-delivery on a small disk: it carries more than the disk holds, and a backlog that fills the
disk still drains (a real 8 MiB tmpfs; root only, as tests/reliability/test_disk_faults.py).

Found by the chaos runner: a durable node on a 64 MiB tmpfs stopped delivering for good. Every
message passes through the topic's queue and each channel's, whose segments go only at
--max-bytes-per-file (100 MiB), so the disk filled with records consumers had long finished; and
delivery needs the journal, which needs disk, so nothing more could be read to make room.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from tests.daemon import Daemon
from tests.rawclient import Client, Closed, subscribe
from tests.reliability.conftest import assert_no_traceback, http_raw, ping, status_of, wait_for

BODY = b"x" * 2042


@pytest.fixture
def small_disk(tmp_path) -> Iterator[str]:
    """A data directory on an 8 MiB tmpfs of its own."""
    path = tmp_path / "fs"
    path.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(path)], capture_output=True)
    if result.returncode != 0:
        pytest.skip("cannot mount tmpfs here: " + result.stderr.decode().strip())
    try:
        data = path / "data"
        data.mkdir()
        yield str(data)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def used_bytes(path: str) -> int:
    return shutil.disk_usage(path).used


def post(d: Daemon, path: str) -> None:
    request = f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n".encode()
    assert status_of(http_raw(d.http_address, request, timeout=10)) == 200


def test_a_durable_node_carries_five_times_its_disk(small_disk) -> None:
    """40 MiB through an 8 MiB disk with a consumer keeping up: every MPUB is answered OK and every
    message delivered (before, the topic's and the channel's segments kept every record and the
    28th MPUB of 100 KiB failed with E_MPUB_FAILED)."""
    d = Daemon(small_disk, "--durable-delivery").start()
    try:
        consumer = subscribe(d.tcp_address, "t", "c", rdy=200)
        publisher = Client(d.tcp_address)
        for r in range(400):
            bodies = [b"%06d" % (r * 50 + i) + BODY for i in range(50)]
            publisher.mpub("t", bodies)
            assert publisher.response(timeout=10) == (0, b"OK"), f"MPUB {r} ({r * 50 * 2048 >> 20} MiB in)"
            got = consumer.messages(50, timeout=10, fin=True)
            assert [m.body for m in got] == bodies
        assert wait_for(lambda: used_bytes(small_disk) < 3 << 20, 10), used_bytes(small_disk)
        assert ping(d) == (200, b"OK")
        assert_no_traceback(d)
    finally:
        d.stop()


class Publisher(threading.Thread):
    """MPUBs of 20 messages until told to stop; an error answer (nsqd closes the connection after
    E_MPUB_FAILED) counts as a failure, and it reconnects and goes on with new bodies."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.acked: list[bytes] = []
        self.failures = 0
        #: OK answers after the first failure: publishing resumed once there was room again
        self.ok_after_failure = 0
        self.halt = threading.Event()

    def run(self) -> None:
        client: Client | None = None
        n = 0
        while not self.halt.is_set():
            bodies = [b"%07d" % (n + i) + BODY for i in range(20)]
            n += 20
            try:
                if client is None:
                    client = Client(self.address, timeout=30)
                client.mpub("t", bodies)
                answer = client.response(timeout=30)
            except (Closed, OSError):
                answer = (1, b"closed")
            if answer == (0, b"OK"):
                self.acked.extend(bodies)
                if self.failures:
                    self.ok_after_failure += 1
            else:
                self.failures += 1
                if client is not None:
                    client.close()
                client = None
                time.sleep(0.05)
        if client is not None:
            client.close()


def drain(address: str, channel: str, into: set[bytes], quiet: float) -> None:
    consumer = subscribe(address, "t", channel, rdy=200)
    while True:
        try:
            m = consumer.message(timeout=quiet)
        except (TimeoutError, Closed):
            return
        into.add(m.body)
        consumer.fin(m)


def state(d: Daemon, data: str) -> str:
    """What a failure report needs: the files and their sizes, and the end of the daemon's log."""
    files = "\n".join(f"{f.name} {f.stat().st_size}" for f in sorted(os.scandir(data), key=lambda f: f.name))
    return f"{files}\n{used_bytes(data)} bytes used\n{d.read_output()[-12000:]}"


def test_a_backlog_that_fills_the_disk_drains_and_publishing_resumes(small_disk) -> None:
    """Two channels without consumers while a publisher keeps going: the disk fills with their
    backlog and publishing fails (E_MPUB_FAILED). Consumers then drain both channels while the
    publisher goes on: every acknowledged message reaches both, publishing works again, health is
    OK and the space comes back. Before, the journals could not write on the full disk, so nothing
    was delivered and no space ever came back."""
    d = Daemon(small_disk, "--durable-delivery").start()
    try:
        post(d, "/topic/create?topic=t")
        post(d, "/channel/create?topic=t&channel=a")
        post(d, "/channel/create?topic=t&channel=b")
        publisher = Publisher(d.tcp_address)
        publisher.start()
        assert wait_for(lambda: publisher.failures >= 5, 30), "the disk never filled"
        full_at = len(publisher.acked)
        got: dict[str, set[bytes]] = {"a": set(), "b": set()}
        consumers = [threading.Thread(target=drain, args=(d.tcp_address, ch, got[ch], 5.0), daemon=True)
                     for ch in got]
        for t in consumers:
            t.start()
        assert wait_for(lambda: publisher.ok_after_failure >= 20, 30), \
            "publishing did not resume\n" + state(d, small_disk)
        publisher.halt.set()
        publisher.join(30)
        for t in consumers:
            t.join(60)
        acked = set(publisher.acked)
        assert len(acked) > full_at
        for ch, bodies in got.items():
            assert not acked - bodies, f"{len(acked - bodies)} of {len(acked)} acknowledged never reached {ch}"
        assert wait_for(lambda: ping(d) == (200, b"OK"), 15), ping(d)
        # the backlog filled the disk; drained, each of the three queues keeps at most the segment
        # it writes (under DRAINED_ROLL_BYTES, 1 MiB, plus the MPUB that passed it) and each journal
        # what it holds since its last compaction (from a 64th of the disk, 128 KiB)
        assert wait_for(lambda: used_bytes(small_disk) < 4 << 20, 15), state(d, small_disk)
        assert_no_traceback(d)
    finally:
        d.stop()
