"""The RSS a node's messages add when they wait on many channels that nobody reads.

Usage: ``PYTHONPATH=. python benchmarks/idle_channels_rss.py [--channels=1000] [--messages=10000]
[--consumed-once]`` from the checkout: the daemon runs the nsqtw this script imported
(``PYTHONPATH=OTHER`` for an A/B).

One nsqd (``--mem-queue-size`` as large as ``--messages``, so everything
stays in memory) gets a topic with ``--channels`` channels, none with a
client, then ``--messages`` 100-byte messages in MPUBs of 1,000. Once every
channel's depth shows all of them, the growth of ``VmRSS`` since the
channels were made is printed (MB of 10^6 bytes). A channel without clients
shares its topic's messages (``nsqtw/core/parking.py``), so the growth is
about that of the messages themselves, whatever the number of channels
(docs/performance.md, Memory).

``--consumed-once``: channels whose consumers went away, everything on disk
(``--mem-queue-size=0``). The topic gets 10 messages (``SEEDED``); a consumer subscribes
to each channel in turn, finishes one message and goes away; six seconds
later (past two ``--sync-timeout`` ticks) the messages are published and
the growth is read once every channel's depth shows them, plus one second.
A disk queue no longer read lets its read-ahead go
(``nsqtw/storage/readahead.py``), so they stay on disk (docs/storage.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request

# after PYTHONPATH, so that an A/B's other tree is the one imported (and run)
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import nsqtw  # noqa: E402
from nsqtw.tools.daemons import nsqtw_command, rss_bytes, start_daemon, stop_daemons  # noqa: E402
from tests.rawclient import subscribe  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [os.path.dirname(os.path.dirname(os.path.abspath(nsqtw.__file__))), os.environ.get("PYTHONPATH", "")]))
#: --consumed-once: messages on the topic before its channels' consumers take one each
SEEDED = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=10000)
    parser.add_argument("--consumed-once", action="store_true",
                        help="each channel consumed once, then abandoned; everything on disk")
    args = parser.parse_args()
    data = tempfile.mkdtemp()
    cmd = [*nsqtw_command(), f"--data-path={data}", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
           f"--mem-queue-size={0 if args.consumed_once else args.messages}"]
    proc, found = start_daemon(cmd, data, ENV)
    http = f"http://{found['HTTP']}"
    try:
        def post(path: str, body: bytes = b"") -> None:
            urllib.request.urlopen(http + path, data=body, timeout=60).read()

        post("/topic/create?topic=t")
        for i in range(args.channels):
            post(f"/channel/create?topic=t&channel=c{i}")
        if args.consumed_once:
            post("/mpub?topic=t", b"\n".join(b"x" * 100 for _ in range(SEEDED)))
            for i in range(args.channels):
                client = subscribe(found["TCP"], "t", f"c{i}", rdy=1)
                client.fin(client.message())
                client.close()
            time.sleep(6)
        else:
            time.sleep(1)
        before = rss_bytes(proc.pid)
        batch = b"\n".join(b"x" * 100 for _ in range(1000))
        for _ in range(args.messages // 1000):
            post("/mpub?topic=t", batch)
        want = args.channels * (args.messages // 1000 * 1000 + (SEEDED - 1 if args.consumed_once else 0))
        for _ in range(1200):
            with urllib.request.urlopen(http + "/stats?format=json&topic=t", timeout=60) as r:
                stats = json.load(r)
            if sum(c["depth"] for c in stats["topics"][0]["channels"]) == want:
                break
            time.sleep(0.5)
        time.sleep(1)
        grew = rss_bytes(proc.pid) - before
        kind = "consumed once and abandoned" if args.consumed_once else "without clients"
        print(f"{args.channels} channels {kind}, {args.messages} messages of 100 B: RSS grew {grew / 1e6:.1f} MB")
    finally:
        stop_daemons(("nsqtw", proc))
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
