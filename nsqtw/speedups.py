"""The optional compiled speed-ups: ``_nsqtw_speedups`` (nsqtw/_speedups.c), or None.

setup.py builds the extension where a C compiler and Python's headers are
found, and skips it where not. The modules with compiled twins of their
per-message functions (:mod:`nsqtw.core.message`, :mod:`nsqtw.protocol.wire`,
and :mod:`nsqtw.storage.segments` for its per-record loops on the disk threads)
use them when this module found the extension and keep their own Python
definitions otherwise (also when the build found lacks one of :data:`FUNCTIONS`:
an older install's, first on the path); ``NSQTW_NO_SPEEDUPS`` in the environment chooses the
Python ones on purpose. Both give the same results (tests/unit/test_message.py,
tests/unit/test_wire.py, tests/unit/test_segments.py,
tests/integration/test_speedups_live.py).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

__all__ = ["COMPILED", "FUNCTIONS", "NOTE"]


#: every function of the extension that a module of nsqtw uses
FUNCTIONS = ("bind", "frames", "decode_messages", "message_ids", "start_flight", "end_flight", "encode_new",
             "fin_run", "split_mpub", "take_publish", "split_records", "frame_records")


def _load(name: str = "_nsqtw_speedups") -> tuple[Any, str]:
    if os.environ.get("NSQTW_NO_SPEEDUPS"):
        return None, "compiled speed-ups: off (NSQTW_NO_SPEEDUPS is set), using the pure-Python path"
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None, ("compiled speed-ups: not built (install with a C compiler and Python's headers "
                      "to build them), using the pure-Python path")
    missing = [f for f in FUNCTIONS if not hasattr(module, f)]
    if missing:
        # an older build found first on the path (another install's, say): none of it is used,
        # rather than half of it or an import error
        return None, (f"compiled speed-ups: the build found ({module.__file__}) is older than this nsqtw "
                      f"(it lacks {', '.join(missing)}), using the pure-Python path")
    return module, "compiled speed-ups: in use"


#: the extension module, or None; NOTE is the line the daemons log at start-up
COMPILED, NOTE = _load()
