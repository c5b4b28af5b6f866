"""What whoever started a daemon learns: it is ready, or one FATAL line on stderr and exit status 1.

Under ``twistd -n`` the daemon is the process that was started: its stderr
is the log (:func:`nsqtw.log.log_to_stderr_by_default`), which holds the
start-up lines back until the start is settled, so a failed start shows
its FATAL line alone (:meth:`nsqtw.log.BufferedLogWriter.hold_start`).
With ``--logfile`` the FATAL line is written to stderr as well.

Without ``-n`` twistd daemonizes: the process that was started waits only
until the services' ``startService`` returned, then exits 0, while the
daemon's stderr is ``/dev/null``. nsqd opens its listeners after it loaded
its metadata, later than that, and a listener that fails in any program
stops the reactor without failing ``startService``; twistd offers no way
to say otherwise. So :func:`report_to_launcher`, the last step of each
tap's ``makeService``, forks once before twistd does: the started process
waits on a pipe for the daemon's word and exits with it, ``0`` once every
listener is bound (:func:`started`, with ``READY=1``), or ``1`` after
writing the daemon's ``FATAL: ...`` line to its own stderr
(:func:`failed`). The child goes on into twistd, which daemonizes it as
before; twistd's own errors (a pid file it cannot write, ``--uid`` it
cannot take) still reach the terminal through twistd's waiting parent, and
the started process then exits with that parent's status.

Nothing here uses a private name of Twisted: twistd's documented order
(the plugin makes its service, then twistd daemonizes) and its
``nodaemon`` option are all it relies on.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import Any

from nsqtw import log

__all__ = ["failed", "refuse_running_pid_file", "report_to_launcher", "started", "wait_for_word"]

#: the daemon's words to the process that started it, one line each
READY = b"READY"
FATAL = b"FATAL: "

#: "unknown" outside twistd (tests), "foreground" under ``twistd -n``, "daemon" once daemonizing
_mode = "unknown"
#: the daemon's end of the pipe to the started process; None once it had its word
_report_fd: int | None = None


def report_to_launcher(twistd_options: Mapping[str, Any] | None, program: str) -> None:
    """Make sure the process that was started learns how the start went (see the module's text).

    Called last in ``makeService``, after every check that can refuse the
    start in this very process (a data path that is missing or in use,
    TLS files that do not load): those end it with their FATAL line
    before anything forks. Without ``-n`` this call returns only in the
    child that goes on to become the daemon.
    """
    global _mode, _report_fd
    if twistd_options is None:
        return
    if twistd_options.get("nodaemon"):
        _mode = "foreground"
        log.hold_until_started()
        return
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:  # goes on into twistd, which daemonizes it
        os.close(read_fd)
        _mode, _report_fd = "daemon", write_fd
        # twistd's waiting parent (this process, after twistd's first fork) must not hold the
        # daemon's end: a daemon that dies before its word then closes the pipe for good
        waiter = os.getpid()
        os.register_at_fork(after_in_parent=lambda: _let_go(waiter))
        return
    os.close(write_fd)
    try:
        status, text = wait_for_word(read_fd, child, program, log_location(twistd_options))
    except KeyboardInterrupt:  # ^C while waiting: no traceback, the status a shell gives it
        status, text = 130, b""
    if text:
        _write_all(2, text)
    os._exit(status)


def _let_go(waiter: int) -> None:
    """After a fork, in twistd's waiting parent only: close the daemon's end of the pipe."""
    global _report_fd
    if os.getpid() == waiter and _report_fd is not None:
        os.close(_report_fd)
        _report_fd = None


def refuse_running_pid_file(twistd_options: Mapping[str, Any] | None) -> None:
    """twistd's check of ``--pidfile``, said in one FATAL line: a process it names is running.

    twistd refuses it too, a moment later, in five lines ("Another twistd
    server is running, PID N", a blank line and three of advice). A stale
    pid file (its process gone), one that holds no number or a process
    nsqtw may not signal are left to twistd, which removes the first and
    says one line about the others.
    """
    pidfile = (twistd_options or {}).get("pidfile")
    if not pidfile:
        return
    try:
        with open(pidfile) as f:
            pid = int(f.read())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return
    raise SystemExit(f"FATAL: another twistd server is running, PID {pid} (pid file {os.path.abspath(pidfile)})"
                     " - start this one in another directory, or give it its own --pidfile=FILE")


def log_location(twistd_options: Mapping[str, Any]) -> str:
    """Where a daemonized twistd writes its log, as the words of a message."""
    if twistd_options.get("syslog"):
        return "syslog"
    return str(twistd_options.get("logfile") or "twistd.log")  # twistd opens it before it changes --rundir


def wait_for_word(read_fd: int, child: int, program: str, log_at: str) -> tuple[int, bytes]:
    """The started process's wait: its exit status and what it writes to stderr.

    ``READY``: 0, nothing. ``FATAL: ...``: 1, that line. The pipe closing
    without a word (the daemon died, or twistd failed before the services
    started): the status of twistd's waiting parent ``child``, which wrote
    twistd's own message; if that was 0, the daemon died during start-up
    and its log says why.
    """
    data = b""
    while b"\n" not in data:
        chunk = os.read(read_fd, 4096)
        if not chunk:
            break
        data += chunk
    os.close(read_fd)
    word = data.split(b"\n", 1)[0] if b"\n" in data else b""
    if word == READY:
        return 0, b""
    if word.startswith(FATAL):
        return 1, word + b"\n"
    code = _twistd_parent_status(child)
    if code is not None and code > 0:
        return code, b""  # twistd said why
    return 1, f"FATAL: {program} exited during start-up - see {log_at}\n".encode()


def _twistd_parent_status(child: int, grace: float = 0.5) -> int | None:
    """The exit status of twistd's waiting parent ``child``, once the daemon went without a word.

    When twistd itself failed, the daemon told that parent before it
    ended, and the parent exits at once with its own message. When the
    daemon died before telling it (killed during its start), twistd's
    parent would wait for ever: after ``grace`` it is ended, and None
    says so.
    """
    deadline = time.monotonic() + grace
    while True:
        pid, wait_status = os.waitpid(child, os.WNOHANG)
        if pid:
            return os.waitstatus_to_exitcode(wait_status)
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            return None
        time.sleep(0.01)


def started() -> None:
    """Every listener is bound: the start-up lines go out, and the started process exits 0."""
    log.start_settled(failed=False)
    _send(READY + b"\n")


def failed(reason: str) -> None:
    """The start failed: the terminal gets ``FATAL: <reason>`` and nothing more; status 1 follows.

    Called before the FATAL line is logged. Under ``twistd -n`` with the
    log on stderr that logged line is the one (the held start-up lines are
    dropped); with ``--logfile`` the line is written to stderr too; a
    daemon sends it to the process that started it.
    """
    log.start_settled(failed=True)
    line = FATAL + reason.encode("utf-8", "replace").replace(b"\n", b" ") + b"\n"
    if _mode == "daemon":
        _send(line)
    elif _mode == "foreground" and not log.logs_to_stderr():
        # twistd sends sys.stderr to the log once it logs: the process's own stream is __stderr__
        stream = sys.__stderr__
        if stream is not None:
            try:
                stream.write(line.decode("utf-8"))
                stream.flush()
            except (OSError, ValueError):
                pass  # stderr is gone: the log file has the line


def _send(word: bytes) -> None:
    """The daemon's one word to the process that started it (the first counts; later ones are dropped)."""
    global _report_fd
    fd, _report_fd = _report_fd, None
    if fd is None:
        return
    try:
        _write_all(fd, word)
    except OSError:
        pass  # it is gone (^C): nobody is waiting
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
