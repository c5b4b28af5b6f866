"""Is what deleted topics and channels leave behind garbage the collector frees, or kept?

Usage: python benchmarks/garbage_after_delete.py [TOPICS] [CHANNELS_PER_TOPIC]   (default 300 × 5)

Starts nsqtw with a probe: on SIGUSR1 it counts the objects the collector tracks, runs a full
collection, and counts again. Creates the topics and channels over HTTP, deletes them, and
prints the counts at the start, loaded, and after the deletes. docs/performance.md quotes it.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.daemon import TWISTD, Daemon  # noqa: E402

PROBE = '''
import gc as _gc, signal as _sig
from twisted.internet import reactor as _r
def _report():
    before = len(_gc.get_objects())
    freed = _gc.collect()
    print("GCPROBE tracked=%d freed_by_full_collection=%d tracked_after=%d"
          % (before, freed, len(_gc.get_objects())), flush=True)
_sig.signal(_sig.SIGUSR1, lambda *a: _r.callFromThread(_report))
'''


def main() -> None:
    topics = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    channels = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    data = tempfile.TemporaryDirectory()
    d = Daemon(data.name, code=PROBE + TWISTD).start(timeout=60)

    def post(path: str) -> None:
        request = urllib.request.Request(f"http://{d.http_address}{path}", data=b"", method="POST")
        urllib.request.urlopen(request, timeout=60).read()

    def probe(label: str) -> None:
        os.kill(d.proc.pid, signal.SIGUSR1)
        time.sleep(2)
        line = [ln for ln in d.read_output().splitlines() if "GCPROBE" in ln][-1]
        print(f"{label:<30} {line.split('GCPROBE ')[1]}")

    try:
        time.sleep(1)
        probe("just started")
        for t in range(topics):
            post(f"/topic/create?topic=t{t}")
            for c in range(channels):
                post(f"/channel/create?topic=t{t}&channel=c{c}")
        probe(f"{topics} x {channels} created")
        for t in range(topics):
            post(f"/topic/delete?topic=t{t}")
        time.sleep(2)
        probe("all deleted")
    finally:
        d.stop()
        data.cleanup()


if __name__ == "__main__":
    main()
