"""RSS of a node whose channels hold a disk backlog nobody reads, before and after a restart.

Usage: PYTHONPATH=TREE python tools/idle_backlog_rss.py   (CHANNELS, default 100)

Starts ``twistd -n nsqtw --mem-queue-size=100`` in a scratch directory,
creates one topic with ``CHANNELS`` channels, publishes 10,000 messages of
200 B (each channel gets a copy, all but 100 of them on disk), prints the
RSS, restarts the daemon on the same directory and prints the RSS after 3
s with no consumer connected. A disk queue that reads ahead before anyone
reads it shows here as about a megabyte per channel
(docs/performance.md, "Reading back from disk").
"""

from __future__ import annotations

import os
import socket
import struct
import tempfile
import time
import urllib.request

from nsqtw.tools.daemons import nsqtw_command, start_listening

MESSAGES = 10_000
BATCH = 200
BODY = b"x" * 200


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return int(next(ln for ln in f if ln.startswith("VmRSS")).split()[1]) / 1024


def post(http: str, path: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"http://{http}{path}", method="POST"), timeout=10).read()


def main() -> None:
    channels = int(os.environ.get("CHANNELS", "100"))
    with tempfile.TemporaryDirectory(prefix="nsqtw-idle-backlog-") as data:
        measure(channels, [*nsqtw_command(), f"--data-path={data}", "--tcp-address=127.0.0.1:0",
                           "--http-address=127.0.0.1:0", "--mem-queue-size=100"], data)


def measure(channels: int, cmd: list[str], data: str) -> None:
    proc, tcp, http = start_listening(cmd, data)
    try:
        post(http, "/topic/create?topic=t")
        for i in range(channels):
            post(http, f"/channel/create?topic=t&channel=c{i}")
        host, port = tcp.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b"  V2")
            mpub = (b"MPUB t\n" + struct.pack(">ii", 4 + BATCH * (4 + len(BODY)), BATCH)
                    + (struct.pack(">i", len(BODY)) + BODY) * BATCH)
            for _ in range(MESSAGES // BATCH):
                s.sendall(mpub)
                s.recv(64)  # OK
        time.sleep(3)
        print(f"{channels} channels of {MESSAGES:,} messages, RSS before the restart: {rss_mb(proc.pid):.1f} MB")
    finally:
        proc.terminate()
        proc.wait()
    proc, tcp, http = start_listening(cmd, data)
    try:
        time.sleep(3)
        print(f"RSS 3 s after the restart, nobody reading: {rss_mb(proc.pid):.1f} MB")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
