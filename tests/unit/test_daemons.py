"""nsqtw.tools.daemons' stop: a graceful stop that hangs is named and killed, never waited on for ever."""

from __future__ import annotations

import os
import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase

from nsqtw.tools.daemons import stop_daemons

#: a process that says it is ready, then sleeps; with "ignore" it ignores SIGTERM as a hung stop would,
#: with "exit" its own handler exits 0 (Python code, which runs only while the process does)
SLEEPER = ("import signal, sys, time\n"
           "if sys.argv[1] == 'ignore': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
           "if sys.argv[1] == 'exit': signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
           "print('ready', flush=True)\n"
           "time.sleep(120)\n")


def sleeper(mode: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, mode], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"  # its handler is in place before the stop
    proc.stdout.close()
    return proc


class StopDaemonsTests(SynchronousTestCase):
    def test_each_stops_on_sigterm(self) -> None:
        procs = [sleeper("plain"), sleeper("plain")]
        stop_daemons(("owner", procs[0]), ("peer", procs[1]))
        self.assertEqual([p.returncode for p in procs], [-15, -15])

    def test_one_that_hangs_is_killed_named_and_the_others_still_stopped(self) -> None:
        hung, fine = sleeper("ignore"), sleeper("plain")
        with self.assertRaises(RuntimeError) as caught:
            stop_daemons(("owner", hung), ("peer", fine), within=0.5)
        self.assertIn(f"owner (pid {hung.pid})", str(caught.exception))
        self.assertNotIn("peer", str(caught.exception))
        self.assertEqual((hung.returncode, fine.returncode), (-9, -15))


#: an nsqd stand-in for compare's Session: prints the lines it waits for, ignores SIGTERM, sleeps
STUBBORN_NSQD = ("import signal, sys, time\n"
                 "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                 "print('TCP: listening on 127.0.0.1:1', file=sys.stderr)\n"
                 "print('HTTP: listening on 127.0.0.1:2', file=sys.stderr, flush=True)\n"
                 "time.sleep(120)\n")


class CompareSessionStopTests(SynchronousTestCase):
    def test_a_daemon_that_hangs_on_its_stop_fails_the_comparison_by_name_and_its_data_goes(self) -> None:
        from nsqtw.tools import compare

        tmp = self.mktemp()
        os.makedirs(tmp)
        self.patch(compare, "STOP_WITHIN", 0.5)
        session = compare.Session([sys.executable, "-c", STUBBORN_NSQD], [], tmp, "Go")
        with self.assertRaises(RuntimeError) as caught:
            session.stop()
        self.assertIn(f"Go nsqd (pid {session.pid})", str(caught.exception))
        self.assertEqual(session.proc.returncode, -9)
        self.assertFalse(os.path.exists(session.data))
