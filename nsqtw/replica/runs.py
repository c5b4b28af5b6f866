"""Where a FIN run's IDs are in a standby's arrays: read at once, found as runs of the next messages.

:meth:`~nsqtw.replica.standby.Standby.finish` runs per message consumed, on
the owner (its own log) and on the replica. A Python step per ID, a hex
parse and a search in an array of millions, cost about as much as the rest
of a consumed message; a FIN run is mostly the next messages in order (a
reader FINs in the order it was sent, and the arrays are in ID order), so it
is read as one hex string and a run of them is measured with a few compares of slices.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence

__all__ = ["id_values", "run_length"]


def id_values(ids: list[bytes], raw: bytes) -> Sequence[int]:
    """The ID values of ``ids`` (``raw``: them joined) that are IDs, 16 hex digits: all at once
    when each is one, else one by one, leaving out what is not."""
    n = len(ids)
    if len(raw) == 16 * n and (n == 0 or len(set(map(len, ids))) == 1):
        try:
            packed = bytes.fromhex(raw.decode("ascii"))
        except ValueError:  # (UnicodeDecodeError is one)
            packed = b""
        if len(packed) == 8 * n:  # (fromhex skips whitespace: every byte was a digit)
            return struct.unpack(f">{n}Q", packed)
    out = []
    for mid in ids:
        try:
            out.append(int(mid, 16))
        except ValueError:
            continue
    return out


def run_length(values: array[int], i: int, found: Sequence[int], k: int) -> int:
    """How far ID values ``found`` from ``k`` on are ``values`` (sorted, each once) from ``i`` on, at
    least 2 (the caller saw so): all of the rest if it is (the usual FIN run), else doubled while
    the slices agree, then halved between the last that did and the first that did not (C compares
    of slices, not a Python step a message)."""
    limit = min(len(found) - k, len(values) - i)
    if values[i + limit - 1] == found[k + limit - 1] and values[i:i + limit] == array("Q", found[k:k + limit]):
        return limit
    good, bad = 2, limit
    while good < bad:
        m = min(2 * good, bad)
        if values[i + good:i + m] == array("Q", found[k + good:k + m]):
            good = m
        else:
            bad = m
            break
    while bad - good > 1:
        m = (good + bad) // 2
        if values[i + good:i + m] == array("Q", found[k + good:k + m]):
            good = m
        else:
            bad = m
    return good
