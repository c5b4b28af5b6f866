"""nsqtw.net.launch: the word a daemonized start sends to the process that was started, and its wait.

The whole path, with twistd daemonizing real programs, is in
tests/integration/test_startup.py (``test_failed_start_is_one_fatal_line``).
"""

from __future__ import annotations

import os

from twisted.trial.unittest import SynchronousTestCase

from nsqtw.net import launch


def spawned(ok: bool) -> int:
    """A child process that exits at once, 0 or 1 (twistd's waiting parent, as the wait sees it)."""
    program = "/bin/true" if ok else "/bin/false"
    return os.posix_spawn(program, [program], os.environ)


class WaitForWordTests(SynchronousTestCase):
    def wait(self, word: bytes, twistd_parent_ok: bool = True) -> tuple[int, bytes]:
        read_fd, write_fd = os.pipe()
        child = spawned(twistd_parent_ok)
        os.write(write_fd, word)
        os.close(write_fd)
        try:
            return launch.wait_for_word(read_fd, child, "nsqd", "twistd.log")
        finally:
            try:
                os.waitpid(child, 0)
            except ChildProcessError:
                pass  # the wait reaped it

    def test_ready_is_status_0_and_nothing_said(self) -> None:
        """The daemon bound every listener: the started process exits 0 and prints nothing."""
        self.assertEqual(self.wait(b"READY\n"), (0, b""))

    def test_a_fatal_word_is_status_1_and_that_line(self) -> None:
        """The daemon's FATAL line is what the started process writes to stderr, and it exits 1."""
        line = b"FATAL: failed to instantiate nsqd - listen (127.0.0.1:4150) failed - bind: in use\n"
        self.assertEqual(self.wait(line), (1, line))

    def test_only_the_first_line_counts(self) -> None:
        self.assertEqual(self.wait(b"READY\nFATAL: late\n"), (0, b""))

    def test_no_word_after_twistd_failed_is_twistds_status(self) -> None:
        """twistd failed before the services started (its waiting parent said why, exit 1): that
        status, and nothing more is written."""
        self.assertEqual(self.wait(b"", twistd_parent_ok=False), (1, b""))

    def test_no_word_from_a_started_daemon_is_status_1_naming_the_log(self) -> None:
        """twistd said the services started, but the daemon died before it was ready."""
        self.assertEqual(self.wait(b"READ"),
                         (1, b"FATAL: nsqd exited during start-up - see twistd.log\n"))

    def test_log_location(self) -> None:
        self.assertEqual(launch.log_location({"logfile": None}), "twistd.log")
        self.assertEqual(launch.log_location({"logfile": "/var/log/nsqd.log"}), "/var/log/nsqd.log")
        self.assertEqual(launch.log_location({"syslog": True, "logfile": None}), "syslog")


class DaemonWordTests(SynchronousTestCase):
    """What the daemon sends: one word, the first; outside twistd, nothing."""

    def setUp(self) -> None:
        self.read_fd, write_fd = os.pipe()
        self.addCleanup(os.close, self.read_fd)
        saved = launch._mode, launch._report_fd
        launch._mode, launch._report_fd = "daemon", write_fd

        def restore() -> None:
            if launch._report_fd is not None:
                os.close(launch._report_fd)
            launch._mode, launch._report_fd = saved

        self.addCleanup(restore)

    def received(self) -> bytes:
        data = b""
        while chunk := os.read(self.read_fd, 4096):
            data += chunk
        return data

    def test_failed_sends_the_fatal_line_and_closes(self) -> None:
        launch.failed("failed to instantiate nsqlookupd - listen (x) failed - nope")
        launch.started()  # too late: the pipe is closed, nothing more is said
        self.assertEqual(self.received(), b"FATAL: failed to instantiate nsqlookupd - listen (x) failed - nope\n")
        self.assertIsNone(launch._report_fd)

    def test_started_sends_ready(self) -> None:
        launch.started()
        self.assertEqual(self.received(), b"READY\n")

    def test_a_reason_over_lines_is_one_line(self) -> None:
        launch.failed("failed to parse metadata - line one\nline two")
        self.assertEqual(self.received(), b"FATAL: failed to parse metadata - line one line two\n")

    def test_nobody_listening_is_not_an_error(self) -> None:
        """The started process is gone (^C): the daemon's word goes nowhere, quietly."""
        os.close(self.read_fd)
        self.read_fd = os.open(os.devnull, os.O_RDONLY)
        launch.failed("nope")
        self.assertIsNone(launch._report_fd)


class PidFileTests(SynchronousTestCase):
    """twistd's pid file check, said in one line where a process it names runs; the rest left to twistd."""

    def setUp(self) -> None:
        import shutil
        import tempfile

        self.folder = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.folder)

    def pidfile(self, text: str | None) -> str:
        path = os.path.join(self.folder, f"{len(os.listdir(self.folder))}.pid")
        if text is not None:
            with open(path, "w") as f:
                f.write(text)
        return path

    def test_a_running_process_is_one_fatal_line(self) -> None:
        path = self.pidfile(str(os.getpid()))
        with self.assertRaises(SystemExit) as raised:
            launch.refuse_running_pid_file({"pidfile": path})
        message = str(raised.exception.code)
        self.assertEqual(message.splitlines(), [message])
        self.assertTrue(message.startswith(f"FATAL: another twistd server is running, PID {os.getpid()} (pid file "))

    def test_stale_garbled_missing_or_none_are_twistds(self) -> None:
        child = spawned(True)
        os.waitpid(child, 0)  # gone: its pid names no process now
        for options in ({"pidfile": self.pidfile(str(child))}, {"pidfile": self.pidfile("x")},
                        {"pidfile": self.pidfile(None)}, {"pidfile": ""}, {}, None):
            launch.refuse_running_pid_file(options)
