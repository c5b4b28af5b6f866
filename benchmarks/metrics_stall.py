"""Scrape a node with many channels and print how long it took and how long the reactor stalled.

    python benchmarks/metrics_stall.py --topics 10 --channels 1000 --scrapes 5

Starts nsqtw on loopback with a LoopingCall lag probe on its reactor
(tests/scrape_probe.py) and an nsqd.dat naming topics × channels, then
fetches ``/metrics`` (and, for comparison, ``/stats?format=json``, which nsqd's
API builds on the reactor in one go) and prints, for each fetch, its time,
its size and the reactor's worst stall meanwhile, plus the worst stall of an
idle stretch of the same length (the machine's own noise). Not run in CI;
tests/integration/test_metrics_scale.py checks the bound.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.daemon import Daemon  # noqa: E402
from tests.scrape_probe import fetch_with_probe, idle_stall, lag_probe_code, write_metadata  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=10)
    parser.add_argument("--channels", type=int, default=1000, help="channels per topic")
    parser.add_argument("--scrapes", type=int, default=5)
    parser.add_argument("--openmetrics", action="store_true", help="ask for OpenMetrics")
    parser.add_argument("--lookupd", type=int, default=0, metavar="NODES",
                        help="instead: time nsqlookupd's count of topics × channels registered by NODES nodes"
                             " (the part of its scrape that runs on the reactor), in process")
    args = parser.parse_args()
    if args.lookupd:
        return lookupd_counts(args.lookupd, args.topics, args.channels, args.scrapes)
    data = tempfile.mkdtemp(prefix="nsqtw-metrics-")
    write_metadata(data, args.topics, args.channels)
    started = time.monotonic()
    d = Daemon(data, code=lag_probe_code()).start(timeout=300)
    print(f"node with {args.topics * args.channels} channels up in {time.monotonic() - started:.1f}s")
    accept = "application/openmetrics-text; version=1.0.0" if args.openmetrics else None
    try:
        print(f"idle: worst reactor stall over 2s {idle_stall(d, 2.0) * 1000:.1f} ms")
        for _ in range(args.scrapes):
            f = fetch_with_probe(d, "/metrics", accept)
            print(f"/metrics: {f.seconds:.2f}s, {f.body_bytes} bytes, worst reactor stall "
                  f"{f.worst_stall * 1000:.1f} ms (reactor busy {f.worst_busy * 1000:.1f} ms)")
        f = fetch_with_probe(d, "/stats?format=json")
        print(f"/stats?format=json (for comparison): {f.seconds:.2f}s, {f.body_bytes} bytes, worst reactor "
              f"stall {f.worst_stall * 1000:.1f} ms (reactor busy {f.worst_busy * 1000:.1f} ms)")
    finally:
        d.stop()
        shutil.rmtree(data, ignore_errors=True)
    return 0


def lookupd_counts(nodes: int, topics: int, channels: int, runs: int) -> int:
    from twisted.internet.task import Clock

    from nsqtw.lookupd.db import PeerInfo, Registration
    from nsqtw.lookupd.lookupd import NSQLookupd
    from nsqtw.lookupd.metrics import LookupdMetrics
    from nsqtw.lookupd.options import defaults

    lookupd = NSQLookupd(defaults("bench"), Clock())
    for n in range(nodes):
        peer = PeerInfo(id=f"node{n}", last_update=lookupd.now_ns())
        lookupd.db.add_producer(Registration("client", "", ""), peer)
        for t in range(topics):
            lookupd.db.add_producer(Registration("topic", f"t{t}", ""), peer)
            for c in range(channels):
                lookupd.db.add_producer(Registration("channel", f"t{t}", f"c{c}"), peer)
    metrics = LookupdMetrics(lookupd)
    for _ in range(runs):
        started = time.perf_counter()
        metrics.prepare()
        print(f"nsqlookupd, {nodes} nodes x {topics * channels} channels: counted on the reactor in "
              f"{(time.perf_counter() - started) * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
