"""After kill -9 with --sync-every=1 no message ID is put in flight twice (issue #15 item 3).

The topic → channel hand-off not yet committed at the crash is replayed at
the next start, so a channel can hold two copies of one ID. The copy that
finds its ID already in flight (or deferred) is dropped at delivery: the
consumer never gets an ``E_FIN_FAILED ... ID not in flight`` for a FIN.
"""

from __future__ import annotations

import threading
import time

from tests.daemon import Daemon
from tests.rawclient import FRAME_MESSAGE, HEARTBEAT, OK, Client, Closed, Msg

FRAME_ERROR = 1


class FinChecker:
    """Publishes MPUBs and consumes (FIN every message), recording every error frame."""

    def __init__(self, address: str, start: int) -> None:
        self.address = address
        self.next = start
        self.errors: list[bytes] = []
        self.received: list[bytes] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._publish, self._consume)]
        for t in self.threads:
            t.start()

    def _publish(self) -> None:
        try:
            c = Client(self.address)
            while not self.stop.is_set():
                c.mpub("t", [b"m%07d" % (self.next + k) for k in range(20)])
                assert c.response(timeout=10) == OK
                self.next += 20
        except (Closed, OSError, AssertionError, TimeoutError):
            pass

    def _consume(self) -> None:
        try:
            c = Client(self.address)
            c.sub("t", "c", rdy=100)
            while True:
                try:
                    ftype, data = c.read_frame(0.5)
                except TimeoutError:
                    if self.stop.is_set():
                        return
                    continue
                if (ftype, data) == HEARTBEAT:
                    c.cmd("NOP")
                elif ftype == FRAME_ERROR:
                    self.errors.append(data)
                elif ftype == FRAME_MESSAGE:
                    m = Msg(data)
                    self.received.append(m.body)
                    c.fin(m)
        except (Closed, OSError, AssertionError):
            pass

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(15)


def test_no_duplicate_in_flight_after_kill_9_replays(tmp_path) -> None:
    path = tmp_path / "data"
    path.mkdir()
    args = ("--mem-queue-size=0", "--sync-every=1")
    errors: list[bytes] = []
    received = 0
    start = 0
    for _ in range(4):
        d = Daemon(str(path), *args)
        d.start()
        load = FinChecker(d.tcp_address, start)
        time.sleep(2.0)
        d.kill()
        load.join()
        errors.extend(load.errors)
        received += len(load.received)
        start = load.next + 1_000_000  # new IDs' bodies never collide with the last cycle's
    d = Daemon(str(path), *args)
    d.start()
    try:
        load = FinChecker(d.tcp_address, start)
        time.sleep(3.0)
        load.join()
        errors.extend(load.errors)
        received += len(load.received)
    finally:
        d.stop()
    assert received > 1000
    assert errors == [], errors[:5]
