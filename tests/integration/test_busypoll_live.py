"""--busy-poll on a real daemon (200 µs by default): it says so at start-up, serves as before, and sleeps
once traffic stops.

Spinning trades CPU for latency only while traffic is brisk; the promise
that matters for a node at rest is that it goes back to sleep. The
daemon's own CPU time (from ``/proc``) is read over a quiet stretch after
a burst of round trips: a reactor that kept spinning would use nearly all
of a core there, a sleeping one almost none.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.rawclient import Client, Msg

ROUND_TRIPS = 3000
QUIET = 2.0


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("flag", ["", "--busy-poll=0", "--busy-poll=200us", "--busy-poll=10ms"],
                         ids=["default", "off", "200us", "10ms"])
def test_round_trips_then_sleep(daemon_factory, flag: str) -> None:
    d = daemon_factory(*([flag] if flag else []))
    assert any("reactor class: nsqtw.net.epollreactor.NSQTWReactor" in line for line in d.output), d.output[:12]
    said = [line for line in d.output if "busy polling:" in line]
    if flag == "--busy-poll=0":
        assert said == [], said
    else:
        limit = (flag or "=200us").split("=")[1].replace("us", "µs")
        assert said and f"up to {limit} while traffic is brisk" in said[0], d.output[:12]

    p = Client(d.tcp_address)
    c = Client(d.tcp_address)
    c.sub("bp", "ch", rdy=1)
    for i in range(ROUND_TRIPS):  # one message at a time, each answered before the next
        p.pub("bp", b"%d" % i)  # waits for its OK
    got: list[Msg] = []
    while len(got) < ROUND_TRIPS:
        m = c.message(timeout=10)
        got.append(m)
        c.fin(m)
        c.cmd("RDY", 1)
    assert [m.body for m in got] == [b"%d" % i for i in range(ROUND_TRIPS)]

    time.sleep(0.5)  # the last spin is long over
    before = cpu_seconds(d.pid)
    time.sleep(QUIET)
    used = cpu_seconds(d.pid) - before
    # a spinning reactor would use ~QUIET seconds here; heartbeats and timers use next to nothing
    assert used < 0.1 * QUIET, f"{used:.2f}s of CPU in {QUIET}s without traffic"
