"""The daemons' heap: free memory back to the system once started, long-lived objects kept old.

Start-up (imports, compiling modules without cached bytecode, reading
``nsqd.dat``) frees much of what it allocates, but glibc's ``malloc`` keeps
freed pages mapped: about 1.3 MB of an idle nsqd's RSS
(``docs/performance.md``, Memory). ``malloc_trim(0)`` returns them.

A daemon's bulk is long-lived (nsqd's queued messages, nsqlookupd's
registrations): :func:`keep_long_lived_old` sets the cyclic garbage
collector's thresholds so they leave the young generations and a full
collection, which stops the reactor while it looks at every object, comes
rarely. What nsqd builds at start (every topic and channel of ``nsqd.dat``)
is frozen out of every collection (:func:`freeze_start_up`): with 15,000
topics a collection of it took 0.6 s of a 2.5 s restart, and any later full
collection would look at it all again. Until a topic or channel is deleted:
its cycles must be collectable, so the first deletion puts everything back
in the oldest generation (:func:`thaw`), as if collected at start.

Big blocks are a third matter. glibc serves a ``malloc`` of 128 KiB or more
with pages of its own and unmaps them on ``free`` -- but it then raises that
threshold to the size of each such block freed, up to 32 MiB. After the
first MPUB of a megabyte, every later megabyte-sized buffer (an MPUB's
bytes, a disk queue's read-ahead chunk) is carved out of the heap, and what
is freed between live blocks stays in the RSS. :func:`return_big_blocks`
keeps the threshold where glibc starts it.
"""

from __future__ import annotations

import ctypes
import gc
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["freeze_start_up", "keep_long_lived_old", "release_free_heap", "return_big_blocks", "thaw"]

#: the collector's thresholds for a daemon: young collections every 50,000 allocations, the
#: middle one every 20 of them, a full one (also bounded by CPython's 25 % growth rule) every 100
GC_THRESHOLDS = (50000, 20, 100)


def keep_long_lived_old() -> None:
    """Set :data:`GC_THRESHOLDS`: a REGISTER flood of 100,000 topics at nsqlookupd went from
    full collections of up to 232 ms to young ones of at most 21 ms (docs/reliability.md)."""
    gc.set_threshold(*GC_THRESHOLDS)


_frozen = False


def freeze_start_up() -> None:
    """Everything allocated so far out of the collector's sight (``gc.freeze``), at no cost now."""
    global _frozen
    gc.freeze()
    _frozen = True


def thaw() -> None:
    """Something start-up built is deleted: what :func:`freeze_start_up` froze is collectable again."""
    global _frozen
    if _frozen:
        _frozen = False
        gc.unfreeze()


def release_free_heap(libc: Any = None) -> bool:
    """Call the C library's ``malloc_trim(0)``; whether it has one (glibc does, musl does not).

    ``libc`` is for tests; by default the process's own symbols are searched.
    """
    try:
        trim = (ctypes.CDLL(None) if libc is None else libc).malloc_trim
    except (OSError, AttributeError):
        return False
    trim(0)
    return True


#: ``mallopt``'s parameter for the mmap threshold (glibc's ``malloc.h``: ``M_MMAP_THRESHOLD``)
M_MMAP_THRESHOLD = -3
#: blocks of at least this many bytes get pages of their own, unmapped when freed (glibc's start value)
MMAP_THRESHOLD = 128 * 1024


def return_big_blocks(libc: Any = None, environ: Mapping[str, str] = os.environ) -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD`; whether it was set.

    Setting it turns off glibc's raising of the threshold, so a freed block of
    128 KiB or more goes back to the system at once. With 16 KiB messages in
    MPUBs of a megabyte past a stuck consumer, the node's RSS grew by about
    half as much (tests/reliability/test_backpressure.py, docs/performance.md,
    Memory). A threshold the user gave glibc (``MALLOC_MMAP_THRESHOLD_``, or
    ``glibc.malloc.mmap_threshold`` in ``GLIBC_TUNABLES``) is left as it is,
    and a C library without ``mallopt`` (musl) is left alone. ``libc`` is for
    tests; by default the process's own symbols are searched.
    """
    if "MALLOC_MMAP_THRESHOLD_" in environ or "mmap_threshold" in environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        mallopt = (ctypes.CDLL(None) if libc is None else libc).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
