"""The optional compiled speed-ups: ``_nsqtw_speedups`` (nsqtw/_speedups.c), or None.

setup.py builds the extension where a C compiler and Python's headers are
found, and skips it where not. The modules with compiled twins of their
per-message functions (:mod:`nsqtw.core.message`, :mod:`nsqtw.protocol.wire`,
and :mod:`nsqtw.storage.segments` for its per-record loops on the disk threads)
use them when this module found the extension and keep their own Python
definitions otherwise; ``NSQTW_NO_SPEEDUPS`` in the environment chooses the
Python ones on purpose. Both give the same results (tests/unit/test_message.py,
tests/unit/test_wire.py, tests/unit/test_segments.py,
tests/integration/test_speedups_live.py).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

__all__ = ["COMPILED", "NOTE"]


def _load() -> tuple[Any, str]:
    if os.environ.get("NSQTW_NO_SPEEDUPS"):
        return None, "compiled speed-ups: off (NSQTW_NO_SPEEDUPS is set), using the pure-Python path"
    try:
        return importlib.import_module("_nsqtw_speedups"), "compiled speed-ups: in use"
    except ImportError:
        return None, ("compiled speed-ups: not built (install with a C compiler and Python's headers "
                      "to build them), using the pure-Python path")


#: the extension module, or None; NOTE is the line the daemons log at start-up
COMPILED, NOTE = _load()
