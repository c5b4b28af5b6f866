"""How long a standby's bookkeeping holds the reactor when many copies are held, in-process.

Usage: PYTHONPATH=TREE python benchmarks/standby_stalls.py [HELD]   (default 2,000,000)

A replica holds, per owner and topic, a :class:`~nsqtw.replica.standby.Standby`:
one flag a byte per message and channel. Some of its operations touch every
message held, on the reactor thread, so their time is a stall for every
client of the node. This times each with ``HELD`` messages of 200 bytes held
for two channels (their log on a real disk in a scratch directory, its
writes run at once on this thread):

- ``SNAP_IDS`` record: one record's IDs confirmed (``SNAP_IDS_MAX`` of them,
  a relinking owner's unfinished messages);
- ``SYNCED``: what no ``SNAP`` named let go (here every other message);
- a channel gone, then the other emptied: what no channel owes let go;
- the owner's side, ``live_id_runs``: the runs of IDs to send, when all but
  two messages are finished;
- a ``SNAP`` record taken in (``SNAP_IDS`` first named none of them): of
  ``LIVE_RUNS_SLICE`` messages, the most an owner sends in one now, and of a
  whole 16 MiB segment, as an older nsqtw sent;
- the owner's side, ``live_runs``: what of a 16 MiB segment of its own log
  a new replica is sent, every message unfinished, found a slice
  (``LIVE_RUNS_SLICE`` messages) a reactor turn: the longest slice and all
  of them together (the whole segment held the reactor in one go before it
  was sliced).

Prints each time in milliseconds, the best of ``REPS`` (environment, default 3).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable

from nsqtw.replica.disklog import StandbyLog, log_prefix
from nsqtw.replica.owner import LIVE_RUNS_SLICE, SNAP_IDS_MAX
from nsqtw.replica.records import MESSAGE_HEADER, index_messages, pub_messages
from nsqtw.replica.standby import Standby, unheld
from nsqtw.storage.executor import SynchronousDiskExecutor

BODY = b"x" * 200
#: messages added per PUB-like record while filling
FILL = 65536
#: the messages of BODY that fill a 16 MiB log segment
SEGMENT_MESSAGES = (16 << 20) // (len(BODY) + MESSAGE_HEADER)


def held(path: str, n: int, channels: tuple[str, ...] = ("a", "b")) -> Standby:
    """A standby of ``n`` messages (ID values 1..n) owed by ``channels``."""
    s = Standby("10.0.0.1:4151", "t", StandbyLog(path, log_prefix("10.0.0.1:4151", "t"), SynchronousDiskExecutor(),
                                                 False))
    for name in channels:
        s.channel(name, True)
    for k in range(1, n + 1, FILL):
        values = list(range(k, min(n, k + FILL - 1) + 1))
        s.add(pub_messages(values, [BODY] * len(values), 0, 0.0), values, [len(BODY)] * len(values))
    return s


def timed(setup: Callable[[str], Callable[[], object]]) -> float:
    """The best of REPS runs of what ``setup`` (given a scratch directory) returns, in ms."""
    best = float("inf")
    for _ in range(int(os.environ.get("REPS", "3"))):
        with tempfile.TemporaryDirectory() as path:
            run = setup(path)
            started = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - started)
    return best * 1000


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000

    def snap_ids(path: str) -> Callable[[], object]:
        s = held(path, n)
        s.begin_sync()
        return lambda: unheld([s], list(range(1, SNAP_IDS_MAX + 1)), ["a", "b"])

    def synced(path: str) -> Callable[[], object]:
        s = held(path, n)
        s.begin_sync()
        for k in range(1, n + 1, FILL):
            s.confirm(list(range(k, min(n, k + FILL - 1) + 1, 2)), ["a", "b"])
        return lambda: s.synced(True)

    def gone_and_emptied(path: str) -> Callable[[], object]:
        s = held(path, n)
        return lambda: (s.channel_gone("b"), s.empty("a"))

    def id_runs(path: str) -> Callable[[], object]:
        s = held(path, n, ("a",))
        s.finish("a", [b"%016x" % v for v in range(2, n)])
        return lambda: list(s.live_id_runs(s.arrivals, SNAP_IDS_MAX))

    def snap(path: str, count: int = SEGMENT_MESSAGES) -> Callable[[], object]:
        s = held(path, n)
        values = list(range(n + 1, n + count + 1))
        data = pub_messages(values, [BODY] * count, 0, 0.0)

        def take() -> None:
            indexed, sizes = index_messages(data)
            s.add_snapshot(data, indexed, sizes, ["a"])
        return take

    def segment_slices() -> tuple[float, float]:
        """The owner's walk of one 16 MiB segment of its own log: the longest slice, all of them (ms)."""
        count = SEGMENT_MESSAGES
        longest = total = float("inf")
        for _ in range(int(os.environ.get("REPS", "3"))):
            with tempfile.TemporaryDirectory() as path:
                s = held(path, count)
                data = pub_messages(list(range(1, count + 1)), [BODY] * count, 0, 0.0)
                pos, arrival, more, slices = 0, s.base, True, []
                while more:
                    started = time.perf_counter()
                    _, pos, arrival, more = s.live_runs(data, pos, arrival, s.arrivals, LIVE_RUNS_SLICE)
                    slices.append(time.perf_counter() - started)
                longest, total = min(longest, max(slices) * 1000), min(total, sum(slices) * 1000)
        return longest, total

    print(f"{n:,} messages held, two channels (best of {os.environ.get('REPS', '3')}):")
    print(f"  a SNAP_IDS record of {SNAP_IDS_MAX:,} IDs confirmed: {timed(snap_ids):.1f} ms")
    print(f"  SYNCED letting go of every other message: {timed(synced):.1f} ms")
    print(f"  a channel gone, then the other emptied: {timed(gone_and_emptied):.1f} ms")
    print(f"  live_id_runs with all but two finished: {timed(id_runs):.1f} ms")
    print(f"  a SNAP of {LIVE_RUNS_SLICE:,} messages taken in: {timed(lambda p: snap(p, LIVE_RUNS_SLICE)):.1f} ms")
    print(f"  a SNAP of a 16 MiB segment taken in: {timed(snap):.1f} ms")
    longest, total = segment_slices()
    print(f"  the owner's walk of a 16 MiB segment for a new replica: {longest:.1f} ms a slice of"
          f" {LIVE_RUNS_SLICE:,} messages at most, {total:.1f} ms in all")


if __name__ == "__main__":
    main()
