"""release_free_heap: glibc's malloc_trim(0) when the C library has it; keep_long_lived_old: the GC thresholds."""

from __future__ import annotations

import gc
import platform

from twisted.trial.unittest import SynchronousTestCase

from nsqtw.heap import GC_THRESHOLDS, keep_long_lived_old, release_free_heap


class FakeLibc:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(pad)
        return 1


class ReleaseFreeHeapTests(SynchronousTestCase):
    def test_trims_with_no_padding(self) -> None:
        """It asks the C library to return every free page: malloc_trim(0)."""
        libc = FakeLibc()
        self.assertTrue(release_free_heap(libc))
        self.assertEqual(libc.calls, [0])

    def test_without_malloc_trim_does_nothing(self) -> None:
        """A C library without malloc_trim (musl) is left alone."""
        self.assertFalse(release_free_heap(object()))

    def test_runs_on_this_system(self) -> None:
        """On glibc the real call is made (and returns)."""
        if platform.libc_ver()[0] != "glibc":
            self.skipTest("not glibc")
        self.assertTrue(release_free_heap())


class KeepLongLivedOldTests(SynchronousTestCase):
    def test_sets_the_thresholds(self) -> None:
        """The collector's thresholds become the daemons' (young collections every 50,000 allocations)."""
        self.addCleanup(gc.set_threshold, *gc.get_threshold())
        gc.set_threshold(700, 10, 10)
        keep_long_lived_old()
        self.assertEqual(gc.get_threshold(), GC_THRESHOLDS)
        self.assertEqual(GC_THRESHOLDS, (50000, 20, 100))
