"""What a one-message publish costs each side of a ``--workers`` link, in process (no daemons).

- **core**: a worker's GRANTED_PUB records (one 100-byte message each), read
  by the core's :class:`~nsqtw.workers.peer.WorkerPeer` as one read of
  ``BATCH`` records: the µs each, the topic's publish included.
- **worker**: a client's PUB on a worker's connection, answered by the worker
  under a grant: parsed, the record written to a real socket pair (the
  link), the OK written. The µs each, the kernel's send included, the
  client's socket and the reactor's wake-up not.
- **one process**: the same PUB on one process's connection (parsed,
  published, answered), for comparison.

docs/performance.md ("Several processes") uses these to say what the core
and a worker can each take on a machine with cores to spare.

    python benchmarks/link_records.py [BATCH]      # NSQTW_NO_SPEEDUPS=1 for the pure build
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from twisted.internet.task import Clock  # noqa: E402
from twisted.internet.testing import StringTransport  # noqa: E402

from nsqtw.core.nsqd import NSQD  # noqa: E402
from nsqtw.nsqd.options import defaults  # noqa: E402
from nsqtw.protocol.v2 import V2Factory  # noqa: E402
from nsqtw.workers import link  # noqa: E402
from nsqtw.workers.peer import WorkerPeer  # noqa: E402
from nsqtw.workers.remote import RemoteNode  # noqa: E402

BODY = b"x" * 100
ROUNDS = 20


def _clock() -> Clock:
    clock = Clock()
    clock.advance(time.time())  # message IDs are made from the time
    return clock


def core(batch: int) -> float:
    clock = _clock()
    nsqd = NSQD(defaults(), clock)
    peer = WorkerPeer(nsqd, clock, 0)
    peer.link.makeConnection(StringTransport())
    topic = nsqd.get_topic("bp")
    records = b"".join(b"".join(link.encode(link.GRANTED_PUB, 0, 0, 0, b"bp", [BODY]))
                       for _ in range(batch))
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        peer.link.dataReceived(records)
        best = min(best, time.perf_counter() - start)
        topic.memory.clear()
    return best / batch * 1e6


class _Unix(StringTransport):
    """The worker's end of the link as a socket pair the link writes to straight (as Twisted's
    unix transport would, with nothing waiting in its buffer)."""

    connected = True
    disconnecting = False
    _writeDisconnected = False
    _tempDataLen = 0
    offset = 0
    dataBuffer = b""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.socket = sock


def _pubs(node: Any, clock: Clock, batch: int, between: Callable[[], None]) -> float:
    """µs a PUB on a V2 connection of ``node``, best of :data:`ROUNDS` runs of ``batch``;
    ``between()`` after each run clears what the run left."""
    proto = V2Factory(node, clock).buildProtocol(None)
    client = StringTransport()
    proto.makeConnection(client)
    proto.dataReceived(b"  V2")
    pub = b"PUB bp\n" + len(BODY).to_bytes(4, "big") + BODY
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(batch):
            proto.dataReceived(pub)
        best = min(best, time.perf_counter() - start)
        client.clear()
        between()
    return best / batch * 1e6


def worker(batch: int) -> float:
    clock = _clock()
    ours, core_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    core_end.setblocking(False)
    node = RemoteNode(defaults(), clock, 0)
    node.link.makeConnection(_Unix(ours))
    node.credit["bp"] = 1 << 60

    def drain() -> None:
        try:
            while core_end.recv(1 << 20):
                pass
        except BlockingIOError:
            pass

    result = _pubs(node, clock, batch, drain)
    assert node.credit["bp"] < 1 << 60, "the publishes were not answered under the grant"
    return result


def one_process(batch: int) -> float:
    """The same PUB on one process's connection, for comparison: parsed, published, answered."""
    clock = _clock()
    nsqd = NSQD(defaults(), clock)
    topic = nsqd.get_topic("bp")
    return _pubs(nsqd, clock, batch, topic.memory.clear)


def main() -> None:
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    print(f"core:   {core(batch):.2f} µs a one-message GRANTED_PUB record ({batch} a read, best of {ROUNDS})")
    print(f"worker: {worker(batch):.2f} µs a PUB answered under a grant (best of {ROUNDS})")
    print(f"one process: {one_process(batch):.2f} µs a PUB (best of {ROUNDS})")


if __name__ == "__main__":
    main()
