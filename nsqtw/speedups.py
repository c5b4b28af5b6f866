"""The optional compiled speed-ups: the modules in :data:`MODULES`, compiled by mypyc from their own source.

setup.py compiles each module named here with mypyc (as black and mypy ship
themselves) where mypyc and a C compiler are found, and leaves it plain
Python where not: the compiled module and the ``.py`` are the same source,
so both builds give the same results (the protocol, message and segment
tests run against both: ``.ci/run``). A compiled module sits beside its
``.py`` and Python's import prefers it; this module decides, before any of
them is imported (``nsqtw/__init__.py`` calls :func:`install`), whether the
compiled ones are used. They are all used or none is (compiled code calls
the other compiled modules directly, and half a build would mix two kinds
of Message):

- ``NSQTW_NO_SPEEDUPS`` in the environment chooses the ``.py`` files on
  purpose;
- a build that lacks a part (the install found no compiler) is not used;
- in a checkout, a build older than a source (an in-place build left
  behind by an edit) is not used: ``python setup.py build_ext --inplace --force``
  rebuilds it.

:data:`NOTE` is the line the daemons log at start-up.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

__all__ = ["GROUP", "IN_USE", "MODULES", "NOTE", "install"]

#: The modules setup.py compiles; adding one to the compiled build is one line here. A module
#: named here is typed Python that mypyc accepts (mypy --strict passes on it).
MODULES = (
    "nsqtw.core.message",
    "nsqtw.storage.formats",
    "nsqtw.protocol.wire",
)

#: the mypyc build's shared library (setup.py's group name), a top-level module beside the package
GROUP = "nsqtw__mypyc"

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _build(name: str, root: str) -> str | None:
    """The compiled file of module ``name`` under ``root``, or None."""
    stem = os.path.join(root, *name.split("."))
    return next((stem + s for s in importlib.machinery.EXTENSION_SUFFIXES if os.path.exists(stem + s)), None)


def _choose(modules: Sequence[str] = MODULES, root: str = _ROOT) -> tuple[bool, str]:
    """Whether the compiled modules are to be used, and the line that says so."""
    if os.environ.get("NSQTW_NO_SPEEDUPS"):
        return False, "compiled speed-ups: off (NSQTW_NO_SPEEDUPS is set), using the pure-Python path"
    library = _build(GROUP, root)
    if library is None or any(_build(name, root) is None for name in modules):
        return False, ("compiled speed-ups: not built (install with mypy and a C compiler to build them), "
                       "using the pure-Python path")
    # in a checkout (setup.py beside the package), an edit after the last in-place build leaves it
    # behind its source; an installed package's files are as the wheel made them
    built = os.path.getmtime(library)
    stale = [name for name in modules if os.path.exists(os.path.join(root, "setup.py"))
             and os.path.getmtime(os.path.join(root, *name.split(".")) + ".py") > built]
    if stale:
        return False, (f"compiled speed-ups: the build is older than {', '.join(stale)} (rebuild with "
                       "`python setup.py build_ext --inplace --force`), using the pure-Python path")
    return True, f"compiled speed-ups: in use (mypyc: {', '.join(modules)})"


class _PureFinder(importlib.abc.MetaPathFinder):
    """Finds the ``.py`` of each of :data:`MODULES`, ahead of its compiled twin."""

    def __init__(self, modules: Sequence[str]) -> None:
        self.modules = frozenset(modules)

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None,
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.modules or not path:
            return None
        leaf = fullname.rpartition(".")[2]
        for entry in path:
            source = os.path.join(entry, leaf + ".py")
            if os.path.exists(source):
                return importlib.util.spec_from_file_location(fullname, source)
        return None


#: whether the compiled modules are used; NOTE is the line the daemons log at start-up
IN_USE, NOTE = _choose()


def install() -> None:
    """Make the imports of :data:`MODULES` take the ``.py`` files unless :data:`IN_USE`; once, before they load."""
    if not IN_USE and not any(isinstance(f, _PureFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PureFinder(MODULES))
