"""How long a live daemon's reactor stalls while a page is fetched: a LoopingCall lag probe inside it.

``Daemon(..., code=lag_probe_code())`` runs twistd with a probe on the
reactor: a ``LoopingCall`` every 2 ms notes how late each tick came and logs
``LAGPROBE <monotonic time> <worst lateness> <worst busy>`` for each 100 ms.
A tick comes late when the reactor was busy, or when the process was not
scheduled (a loaded machine), so lateness alone blames the daemon for the
machine. *Busy* is the CPU the reactor thread itself used between two
ticks (``time.thread_time``): a page built on the reactor shows there in
full, a descheduled process does not. The tests bound *busy*; lateness is
reported beside it.  ``time.monotonic`` is the same clock in
every process of the machine, so the test matches the log to its fetch.
Used by tests/integration/test_metrics_scale.py and benchmarks/metrics_stall.py.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import time
from dataclasses import dataclass

from tests.daemon import TWISTD, Daemon

_PROBE = '''
import time as _time
from twisted.internet import reactor as _reactor, task as _task
_probe = {"last": None, "cpu": None, "worst": 0.0, "busy": 0.0}
def _tick():
    now, cpu = _time.monotonic(), _time.thread_time()
    if _probe["last"] is not None:
        _probe["worst"] = max(_probe["worst"], now - _probe["last"] - 0.002)
        _probe["busy"] = max(_probe["busy"], cpu - _probe["cpu"])
    _probe["last"], _probe["cpu"] = now, cpu
def _report():
    print("LAGPROBE %.6f %.6f %.6f" % (_time.monotonic(), _probe["worst"], _probe["busy"]), flush=True)
    _probe["worst"] = _probe["busy"] = 0.0
_reactor.callWhenRunning(lambda: _task.LoopingCall(_tick).start(0.002))
_reactor.callWhenRunning(lambda: _task.LoopingCall(_report).start(0.1, now=False))
'''

_LINE = re.compile(r"LAGPROBE (\d+\.\d+) (\d+\.\d+) (\d+\.\d+)")


def lag_probe_code() -> str:
    """Python for ``Daemon(code=...)``: the lag probe, then twistd."""
    return _PROBE + TWISTD


@dataclass
class FetchFigures:
    path: str
    #: seconds from sending the request to the last byte of the answer
    seconds: float
    body_bytes: int
    #: the reactor's worst stall while the fetch ran (seconds of wall time, the machine's load included)
    worst_stall: float
    #: the most CPU the reactor thread used between two probe ticks meanwhile (seconds): its own stalls
    worst_busy: float = 0.0


def _lags(daemon: Daemon, start: float, end: float) -> list[tuple[float, float]]:
    """(worst lateness, worst busy) of each probe window that overlaps [start, end]."""
    out = []
    for m in _LINE.finditer(daemon.read_output()):
        at = float(m.group(1))
        if start <= at <= end + 0.1:  # a window ending just after the fetch still covers part of it
            out.append((float(m.group(2)), float(m.group(3))))
    return out


def fetch_with_probe(daemon: Daemon, path: str, accept: str | None = None) -> FetchFigures:
    """Fetch ``path`` and read the worst reactor stall the probe saw meanwhile."""
    host, port = daemon.http
    conn = http.client.HTTPConnection(host, port, timeout=300)
    started = time.monotonic()
    conn.request("GET", path, headers={"Accept": accept} if accept else {})
    r = conn.getresponse()
    body = r.read()
    ended = time.monotonic()
    conn.close()
    assert r.status == 200, (r.status, body[:200])
    deadline = time.monotonic() + 5
    while True:  # wait for the window that covers the end of the fetch to be logged
        lags = _lags(daemon, started, ended)
        if any(float(m.group(1)) > ended + 0.1 for m in _LINE.finditer(daemon.read_output())):
            break
        assert time.monotonic() < deadline, "the lag probe stopped reporting"
        time.sleep(0.05)
    return FetchFigures(path, ended - started, len(body), max((w for w, _ in lags), default=0.0),
                        max((b for _, b in lags), default=0.0))


def idle_stall(daemon: Daemon, seconds: float) -> float:
    """The worst reactor stall over ``seconds`` of doing nothing (the machine's noise)."""
    started = time.monotonic()
    time.sleep(seconds)
    return max((w for w, _ in _lags(daemon, started, time.monotonic() - 0.1)), default=0.0)


def write_metadata(data_path: str, topics: int, channels_per_topic: int) -> None:
    """An ``nsqd.dat`` naming ``topics`` × ``channels_per_topic`` channels, loaded at start."""
    doc = {"topics": [{"name": f"t{t}", "paused": False,
                       "channels": [{"name": f"c{c}", "paused": False} for c in range(channels_per_topic)]}
                      for t in range(topics)],
           "version": "1.3.0"}
    with open(os.path.join(data_path, "nsqd.dat"), "w") as f:
        json.dump(doc, f)
