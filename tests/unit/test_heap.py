"""release_free_heap: glibc's malloc_trim(0) when the C library has it; return_big_blocks: a fixed mmap threshold;
keep_long_lived_old: the GC thresholds."""

from __future__ import annotations

import gc
import platform

from twisted.trial.unittest import SynchronousTestCase

from nsqtw.heap import (
    GC_THRESHOLDS,
    M_MMAP_THRESHOLD,
    MMAP_THRESHOLD,
    keep_long_lived_old,
    release_free_heap,
    return_big_blocks,
)


class FakeLibc:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(pad)
        return 1


class FakeMallopt:
    def __init__(self, answer: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.answer = answer

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self.answer


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


class ReturnBigBlocksTests(SynchronousTestCase):
    def test_fixes_the_mmap_threshold(self) -> None:
        """glibc's M_MMAP_THRESHOLD (-3) is set to 128 KiB, which also stops glibc raising it."""
        libc = FakeMallopt()
        self.assertTrue(return_big_blocks(libc, {}))
        self.assertEqual(libc.calls, [(-3, 128 * 1024)])
        self.assertEqual((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (-3, 131072))

    def test_a_refused_value_says_so(self) -> None:
        """mallopt answers 0 when it takes no value: the caller hears False."""
        self.assertFalse(return_big_blocks(FakeMallopt(answer=0), {}))

    def test_the_users_threshold_wins(self) -> None:
        """A threshold given to glibc in the environment is left alone, either way of giving it."""
        for environ in ({"MALLOC_MMAP_THRESHOLD_": "1048576"},
                        {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=65536"}):
            libc = FakeMallopt()
            self.assertFalse(return_big_blocks(libc, environ))
            self.assertEqual(libc.calls, [])
        libc = FakeMallopt()
        self.assertTrue(return_big_blocks(libc, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}))
        self.assertEqual(libc.calls, [(-3, 131072)])

    def test_without_mallopt_does_nothing(self) -> None:
        """A C library without mallopt is left alone."""
        self.assertFalse(return_big_blocks(object(), {}))

    def test_runs_on_this_system(self) -> None:
        """On glibc the real call is made and accepted (mallopt answers 1)."""
        if platform.libc_ver()[0] != "glibc":
            self.skipTest("not glibc")
        self.assertTrue(return_big_blocks(environ={}))


class KeepLongLivedOldTests(SynchronousTestCase):
    def test_sets_the_thresholds(self) -> None:
        """The collector's thresholds become the daemons' (young collections every 50,000 allocations)."""
        self.addCleanup(gc.set_threshold, *gc.get_threshold())
        gc.set_threshold(700, 10, 10)
        keep_long_lived_old()
        self.assertEqual(gc.get_threshold(), GC_THRESHOLDS)
        self.assertEqual(GC_THRESHOLDS, (50000, 20, 100))


class FreezeTests(SynchronousTestCase):
    def test_start_up_is_frozen_until_something_is_deleted(self) -> None:
        """What start-up built is out of every collection until a topic or channel is deleted; then
        it is collectable again (its cycles with it), and a second deletion changes nothing."""
        from nsqtw import heap
        from tests.helpers import make_nsqd

        self.addCleanup(gc.unfreeze)
        nsqd, _ = make_nsqd()
        nsqd.get_topic("t").get_channel("c")
        heap.freeze_start_up()
        frozen = gc.get_freeze_count()
        self.assertGreater(frozen, 1000)
        nsqd.get_topic("t").delete_channel("c")
        self.assertEqual(gc.get_freeze_count(), 0)
        heap.freeze_start_up()
        nsqd.delete_topic("t")
        self.assertEqual(gc.get_freeze_count(), 0)
        heap.thaw()
