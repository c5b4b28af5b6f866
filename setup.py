"""The optional compiled speed-ups; everything else about the package is in setup.cfg.

``_nsqtw_speedups`` (nsqtw/_speedups.c) is built where a C compiler and
Python's headers are found and skipped where they are not (``optional``):
nsqtw.core.message then uses its own pure-Python definitions, which give the
same results (docs/performance.md, "The compiled speed-ups").
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("_nsqtw_speedups", ["nsqtw/_speedups.c"], optional=True)])
