"""The daemons' heap: free memory back to the system once started, long-lived objects kept old.

Start-up (imports, compiling modules without cached bytecode, reading
``nsqd.dat``) frees much of what it allocates, but glibc's ``malloc`` keeps
freed pages mapped: about 1.3 MB of an idle nsqd's RSS
(``docs/performance.md``, Memory). ``malloc_trim(0)`` returns them.

A daemon's bulk is long-lived (nsqd's queued messages, nsqlookupd's
registrations): :func:`keep_long_lived_old` sets the cyclic garbage
collector's thresholds so they leave the young generations and a full
collection, which stops the reactor while it looks at every object, comes
rarely.
"""

from __future__ import annotations

import ctypes
import gc
from typing import Any

__all__ = ["keep_long_lived_old", "release_free_heap"]

#: the collector's thresholds for a daemon: young collections every 50,000 allocations, the
#: middle one every 20 of them, a full one (also bounded by CPython's 25 % growth rule) every 100
GC_THRESHOLDS = (50000, 20, 100)


def keep_long_lived_old() -> None:
    """Set :data:`GC_THRESHOLDS`: a REGISTER flood of 100,000 topics at nsqlookupd went from
    full collections of up to 232 ms to young ones of at most 21 ms (docs/reliability.md)."""
    gc.set_threshold(*GC_THRESHOLDS)


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
