"""Giving the C heap's free memory back to the system once a daemon has started.

Start-up (imports, compiling modules without cached bytecode, reading
``nsqd.dat``) frees much of what it allocates, but glibc's ``malloc`` keeps
freed pages mapped: about 1.3 MB of an idle nsqd's RSS
(``docs/performance.md``, Memory). ``malloc_trim(0)`` returns them.
"""

from __future__ import annotations

import ctypes
from typing import Any

__all__ = ["release_free_heap"]


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
