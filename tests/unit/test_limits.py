"""The open-file limit a daemon runs with: its soft limit raised to the hard one, as Go's runtime does."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase

from tests.daemon import ROOT

CHILD = ("import resource; from nsqtw.net.limits import raise_open_file_limit as r; print(r());"
         " print(*resource.getrlimit(resource.RLIMIT_NOFILE))")


class OpenFileLimitTests(SynchronousTestCase):
    def run_child(self, soft: int) -> list[str]:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

        out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True,
                             preexec_fn=limit, env=dict(os.environ, PYTHONPATH=ROOT)).stdout
        return out.splitlines()

    def test_the_soft_limit_is_raised_to_the_hard_one(self) -> None:
        """A process started with a soft limit of 256 (systemd's default is 1,024) runs with the hard one."""
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if hard == resource.RLIM_INFINITY or hard <= 256:
            self.skipTest(f"a hard limit of {hard}")
        moved, now = self.run_child(256)
        self.assertEqual(moved, f"(256, {hard})")
        self.assertEqual(now, f"{hard} {hard}")

    def test_a_limit_already_at_the_hard_one_is_left(self) -> None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if hard == resource.RLIM_INFINITY:
            self.skipTest("no hard limit")
        moved, now = self.run_child(hard)
        self.assertEqual((moved, now), ("None", f"{hard} {hard}"))
