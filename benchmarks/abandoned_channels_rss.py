"""The RSS a node's writes add on channels that were consumed once and then lost their consumers.

Usage: ``PYTHONPATH=. python benchmarks/abandoned_channels_rss.py [--channels=300] [--messages=3000]``
from the checkout: the daemon runs the nsqtw this script imported (``PYTHONPATH=OTHER`` for an A/B).

One nsqd with ``--mem-queue-size=0`` (every message on disk) gets a topic
with ``--channels`` channels and 10 messages. A consumer subscribes to each
channel in turn, takes one message, finishes it and goes away. Six seconds
later (past two ``--sync-timeout`` ticks) ``--messages`` 200-byte messages
are published in MPUBs of 500, and the growth of ``VmRSS`` three seconds
after the last one is printed (MB of 10^6 bytes). A disk queue that is no
longer read lets its read-ahead go (``nsqtw/storage/readahead.py``), so the
writes stay on disk instead of being read ahead into memory for each
channel (docs/storage.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import struct
import tempfile
import time
import urllib.request

import nsqtw
from nsqtw.tools.daemons import nsqtw_command, rss_bytes, start_daemon, stop_daemons

ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [os.path.dirname(os.path.dirname(os.path.abspath(nsqtw.__file__))), os.environ.get("PYTHONPATH", "")]))
BODY = b"x" * 200
FRAME_MESSAGE = 2


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("the daemon closed the connection")
        data += chunk
    return data


def consume_one(tcp: str, channel: str) -> None:
    """Subscribe to ``channel`` of topic ``t``, finish one message, close."""
    host, port = tcp.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"  V2" + f"SUB t {channel}\nRDY 1\n".encode())
        while True:
            size, frame = struct.unpack(">ii", _recv_exactly(sock, 8))
            data = _recv_exactly(sock, size - 4)
            if frame == FRAME_MESSAGE:
                sock.sendall(b"FIN " + data[10:26] + b"\n")
                return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", type=int, default=300)
    parser.add_argument("--messages", type=int, default=3000)
    args = parser.parse_args()
    data = tempfile.mkdtemp()
    cmd = [*nsqtw_command(), f"--data-path={data}", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
           "--mem-queue-size=0"]
    proc, found = start_daemon(cmd, data, ENV)
    http = f"http://{found['HTTP']}"
    try:
        def post(path: str, body: bytes = b"") -> None:
            urllib.request.urlopen(http + path, data=body, timeout=60).read()

        def mpub(count: int) -> None:
            for start in range(0, count, 500):
                n = min(500, count - start)
                post("/mpub?topic=t&binary=true",
                     struct.pack(">i", n) + (struct.pack(">i", len(BODY)) + BODY) * n)

        post("/topic/create?topic=t")
        for i in range(args.channels):
            post(f"/channel/create?topic=t&channel=c{i}")
        mpub(10)
        for i in range(args.channels):
            consume_one(found["TCP"], f"c{i}")
        time.sleep(6)
        before = rss_bytes(proc.pid)
        mpub(args.messages)
        time.sleep(3)
        grew = rss_bytes(proc.pid) - before
        print(f"{args.channels} channels consumed once and abandoned, then {args.messages} messages of "
              f"200 B: RSS grew {grew / 1e6:.1f} MB")
    finally:
        stop_daemons(("nsqtw", proc))
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
