"""benchmarks/soak.py --disk-faults: the judgement of what /ping said in a fault cycle (no daemon)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

_SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"
_spec = importlib.util.spec_from_file_location("benchmarks_soak", _SOAK)
assert _spec is not None and _spec.loader is not None
soak = importlib.util.module_from_spec(_spec)
sys.modules["benchmarks_soak"] = soak  # dataclasses look their module up
_spec.loader.exec_module(soak)

NOK = (500, b"NOK - DISKQUEUE(soak) failed to write: [Errno 28] No space left on device")
OK = (200, b"OK")


def samples(*answers: tuple[float, tuple[int, bytes]]) -> list[tuple[float, int, bytes]]:
    return [(t, status, body) for t, (status, body) in answers]


class HealthVerdictTests(SynchronousTestCase):
    """Full from 10 to 18, the cycle ends at 30."""

    def verdict(self, *answers: tuple[float, tuple[int, bytes]]):  # type: ignore[no-untyped-def]
        return soak.health_verdict(samples(*answers), 10.0, 18.0, 30.0)

    def test_truthful(self) -> None:
        """OK until the first failed write, NOK while full and a little after, then OK: the truth."""
        v = self.verdict((9.0, OK), (10.1, OK), (10.4, NOK), (17.9, NOK), (18.2, NOK), (18.5, OK), (29.0, OK))
        self.assertTrue(v.truthful)
        self.assertAlmostEqual(v.nok_after, 0.4)
        self.assertAlmostEqual(v.ok_after, 0.5)
        self.assertEqual(v.first_nok, NOK[1])

    def test_never_nok_is_a_lie(self) -> None:
        v = self.verdict((10.5, OK), (17.0, OK), (19.0, OK))
        self.assertIsNone(v.nok_after)
        self.assertFalse(v.truthful)

    def test_ok_again_while_full_is_a_lie(self) -> None:
        v = self.verdict((10.5, NOK), (12.0, OK), (13.0, NOK), (19.0, OK))
        self.assertEqual(v.ok_while_full, 1)
        self.assertFalse(v.truthful)

    def test_never_ok_again_is_a_lie(self) -> None:
        v = self.verdict((10.5, NOK), (19.0, NOK), (29.0, NOK))
        self.assertIsNone(v.ok_after)
        self.assertFalse(v.truthful)

    def test_nok_after_recovery_is_a_lie(self) -> None:
        v = self.verdict((10.5, NOK), (19.0, OK), (25.0, NOK))
        self.assertEqual(v.nok_after_recovery, 1)
        self.assertFalse(v.truthful)

    def test_no_answer_says_nothing_and_other_cycles_are_ignored(self) -> None:
        """A restart's unanswered pings (0) count for nothing; answers outside 10-30 are another cycle's."""
        v = self.verdict((5.0, NOK), (10.2, (0, b"")), (10.5, NOK), (11.0, (0, b"")), (19.0, OK),
                         (20.0, (0, b"")), (31.0, NOK))
        self.assertTrue(v.truthful)
