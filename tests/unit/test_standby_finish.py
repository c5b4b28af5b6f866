"""A standby's FINs (``Standby.finish``), read a run at a time, against the message-by-message rule.

``finish`` runs per message consumed on both nodes of a replicated topic, so
it reads a FIN run's IDs as one hex string, takes a run of the next
messages in order all at once, and looks for each other ID just after the
one before. The rule it must keep is the plain one, written here as the
oracle: each ID that is a held, not-done message is finished for the
channel, and done once no other channel owes it. Random runs (in order,
reversed, shuffled, repeated, unknown, not IDs, of other lengths) on two
standbys fed the same records must leave the same state. Socket-free.
"""

from __future__ import annotations

import random
from array import array
from bisect import bisect_left
from typing import Any

import pytest

from nsqtw.replica.runs import id_values, run_length
from nsqtw.replica.standby import Standby, _Debt
from tests.unit.test_replica import add, make_standby, mid


def oracle_finish(s: Standby, channel: str, ids: list[bytes]) -> None:
    """The rule, one ID at a time (what ``finish`` did before it read runs at once)."""
    debt = s.channels.get(channel)
    if debt is None:
        debt = s.channels[channel] = _Debt(s.base, len(s.values))
    for m in ids:
        try:
            value = int(m, 16)
        except ValueError:
            continue
        i = bisect_left(s.values, value)
        if i < len(s.values) and s.values[i] == value and not s.done[i]:
            debt.finished[i] = 1
            if not any(d.start <= s.base + i and not d.finished[i] for d in s.channels.values()):
                s.done[i] = 1
                s.live -= 1
                s.live_bytes -= s.sizes[i]


def state(s: Standby) -> tuple[Any, ...]:
    return (list(s.values), bytes(s.done), s.live, s.live_bytes, s.base,
            {name: (d.start, bytes(d.finished)) for name, d in s.channels.items()})


def noisy_ids(rng: random.Random, values: list[int]) -> list[bytes]:
    """A FIN run as a reader might send it, or as nothing checked it."""
    if rng.random() < 0.4:  # the usual run: the next messages, in the order sent
        start = rng.randrange(len(values))
        return [mid(v) for v in values[start:start + rng.randint(1, 40)]]
    picked = sorted(rng.sample(values, rng.randint(0, min(len(values), 40))))
    how = rng.random()
    if how < 0.2:
        rng.shuffle(picked)
    elif how < 0.3:
        picked.reverse()
    ids = [mid(v) for v in picked]
    if rng.random() < 0.2:
        ids += ids[: rng.randint(0, len(ids))]  # repeated
    if rng.random() < 0.15:
        ids.insert(rng.randint(0, len(ids)), mid(10_000 + rng.randint(0, 100)))  # never held
    if rng.random() < 0.1:
        ids.insert(rng.randint(0, len(ids)), rng.choice([b"not-hex-at-all!!", b"12", b"0" * 17, b"00000000 0000001"]))
    if rng.random() < 0.05:
        ids = [m.upper() for m in ids]
    return ids


@pytest.mark.parametrize("seed", range(12))
def test_finish_runs_leave_what_the_rule_one_id_at_a_time_leaves(tmp_path: Any, seed: int) -> None:
    rng = random.Random(seed)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    fast, slow = make_standby(tmp_path / "a"), make_standby(tmp_path / "b")
    channels = ["c"]
    for s in (fast, slow):
        s.channel("c", True)
    n = 0
    for _ in range(120):
        step = rng.random()
        if step < 0.3:
            batch = list(range(n + 1, n + 1 + rng.randint(1, 30)))
            n = batch[-1]
            for s in (fast, slow):
                add(s, *batch)
        elif step < 0.35 and len(channels) < 4:
            name, backlog = f"ch{len(channels)}", rng.random() < 0.5
            channels.append(name)
            for s in (fast, slow):
                s.channel(name, backlog)
        elif step < 0.38:
            for s in (fast, slow):
                s.maintain()  # (cuts the done prefix from memory)
        elif n:
            channel = rng.choice([*channels, "unknown"])
            ids = noisy_ids(rng, list(range(max(1, n - 60), n + 1)))
            fast.finish(channel, ids)
            oracle_finish(slow, channel, ids)
        assert state(fast) == state(slow)
    assert fast.live < n  # (the runs did finish messages: the comparison was not of two untouched standbys)


def test_a_run_of_ids_in_the_order_sent_finishes_each_once(tmp_path: Any) -> None:
    s = make_standby(tmp_path)
    s.channel("c", True)
    add(s, *range(1, 101))
    s.finish("c", [mid(v) for v in range(1, 51)])
    assert s.live == 50 and s.live_bytes == sum(len(b"m%d" % v) for v in range(51, 101))
    s.finish("c", [mid(v) for v in range(1, 101)])  # the first 50 again: counted once
    assert s.live == 0 and s.live_bytes == 0


def test_id_values_reads_a_run_at_once_and_leaves_out_what_is_not_an_id() -> None:
    assert list(id_values([mid(1), mid(0xABCDEF)], mid(1) + mid(0xABCDEF))) == [1, 0xABCDEF]
    assert list(id_values([mid(2).upper()], mid(2).upper())) == [2]
    assert list(id_values([], b"")) == []
    # not all IDs: each as int(id, 16) takes it (what the rule did), the others left out
    for ids in ([mid(1), b"not-hex-at-all!!"], [mid(1), b"00000000 0000003"], [b"0" * 15, b"1" * 17],
                [mid(1), "é".encode() * 8]):
        assert list(id_values(ids, b"".join(ids))) == [int(m, 16) for m in ids if _hex(m)]


def _hex(m: bytes) -> bool:
    try:
        int(m, 16)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("seed", range(8))
def test_run_length_is_how_far_the_ids_go_on_with_the_next_messages(seed: int) -> None:
    rng = random.Random(seed)
    values = array("Q", sorted(rng.sample(range(10_000), 300)))
    for _ in range(200):
        i = rng.randrange(len(values) - 2)
        k = rng.randrange(5)
        n = rng.randint(2, 120)
        found = [rng.randrange(10_000) for _ in range(k)] + list(values[i:i + n])
        if rng.random() < 0.7 and len(found) > k + 2:  # broken off somewhere after the first two
            cut = rng.randrange(k + 2, len(found))
            found[cut] = found[cut] + 1 if rng.random() < 0.5 else 10_001
        want = 0
        while k + want < len(found) and i + want < len(values) and values[i + want] == found[k + want]:
            want += 1
        assert run_length(values, i, found, k) == want
