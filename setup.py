"""The optional compiled speed-ups; everything else about the package is in setup.cfg.

The modules listed in nsqtw/speedups.py (``MODULES``) are compiled from their
own source with mypyc where mypy (a build requirement, pyproject.toml) and a
C compiler are found. Each extension is ``optional``: where one cannot be
built the package installs as plain Python, which gives the same results
(nsqtw/speedups.py says how the choice is made and logged). In a checkout,
``python setup.py build_ext --inplace --force`` builds them beside their ``.py``
files, as ``pip install -e .`` does.
"""

from __future__ import annotations

import ast
import os
import sys

from setuptools import Extension, setup


def compiled_modules() -> list[str]:
    """The source paths of nsqtw.speedups.MODULES, read without importing the package."""
    with open(os.path.join("nsqtw", "speedups.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["MODULES"]:
            return [name.replace(".", "/") + ".py" for name in ast.literal_eval(node.value)]
    raise SystemExit("setup.py: nsqtw/speedups.py has no MODULES")


def extensions() -> list[Extension]:
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("setup.py: mypyc not found, installing the pure-Python modules only", file=sys.stderr)
        return []
    # no config file: the project's mypy.ini names a plugin the build environment lacks, and
    # the compiled modules import nothing that needs it (tools/check.sh runs the full check)
    # group_name: their code goes into one shared library, nsqtw__mypyc (nsqtw.speedups.GROUP)
    try:
        exts: list[Extension] = mypycify(["--config-file=", "--strict", *compiled_modules()], group_name="nsqtw",
                                         opt_level="3")
    except (Exception, SystemExit) as e:  # mypy's errors end in SystemExit: still no reason to fail the install
        print(f"setup.py: mypyc could not compile the speed-ups ({e!r}), installing the pure-Python modules only",
              file=sys.stderr)
        return []
    for ext in exts:
        ext.optional = True  # no compiler, no headers: the plain .py files serve
    return exts


setup(ext_modules=extensions())
