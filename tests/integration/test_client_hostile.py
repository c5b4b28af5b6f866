"""The client library and the ``nsqtw`` tools against a server that breaks the V2 protocol.

A fake nsqd on loopback (port 0) reads the magic and IDENTIFY, then answers
with what a broken or foreign server might send. Each connection must end
with one error line and no traceback: the library reports the failed
attempt and retries with a growing delay; the tools exit 1, as Go's tools
exit on a failed ``ConnectToNSQD``. Where Go's binaries are present
(``../shared/anchor/bin``) the same server is shown to them in the same run.
"""

from __future__ import annotations

import gc
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor, task
from twisted.logger import globalLogPublisher

from nsqtw.client import Config, Consumer, Producer
from nsqtw.client.errors import NSQClientError
from tests.daemon import ROOT


def frame(ftype: int, body: bytes) -> bytes:
    return struct.pack(">ii", len(body) + 4, ftype) + body


#: what the server answers IDENTIFY with; then it keeps the connection open (unless "closes")
ANSWERS = {
    "identify-not-json": frame(0, b"{not json"),
    "error-frame": frame(1, b"E_BAD_BODY IDENTIFY refused"),
    "bad-frame-type": frame(7, b"OK"),
    "negative-size": struct.pack(">i", -5) + b"xxxx",
    "huge-size": struct.pack(">i", 0x7FFFFFFF) + b"xxxx",
    "http-server": b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
    "closed-mid-frame": struct.pack(">ii", 100, 0) + b"abc",
}
CLOSES = {"closed-mid-frame"}
#: the cases Go's nsq_tail v1.3.0 gives up on at once (exit 1); it takes a bad frame type as OK
#: and waits, and waits for a huge frame's bytes, until the server closes
GO_EXITS = {"identify-not-json", "error-frame", "negative-size", "closed-mid-frame"}
ANCHOR = Path(ROOT).parent / "shared" / "anchor" / "bin"


class BrokenServer:
    """A TCP server on loopback that answers every connection's first bytes with ``answer``."""

    def __init__(self, answer: bytes, close: bool) -> None:
        self.answer = answer
        self.close = close
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self._open: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self._open.append(conn)
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        try:
            conn.recv(65536)
            conn.sendall(self.answer)
            if self.close:
                conn.close()
        except OSError:
            pass

    def stop(self) -> None:
        self.sock.close()
        for conn in self._open:
            conn.close()


@pytest.fixture(params=sorted(ANSWERS))
def broken(request: pytest.FixtureRequest) -> Iterator[tuple[str, BrokenServer]]:
    server = BrokenServer(ANSWERS[request.param], request.param in CLOSES)
    yield request.param, server
    server.stop()


@pytest.fixture
def logged() -> Iterator[list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)
    yield events
    globalLogPublisher.removeObserver(events.append)


def _tracebacks(events: list[dict[str, Any]]) -> list[str]:
    gc.collect()  # a Deferred's unhandled failure is logged when it is collected
    return [e["log_failure"].getTraceback() for e in events if "log_failure" in e]


def _errors(events: list[dict[str, Any]]) -> list[str]:
    return [str(e.get("error")) for e in events if "error connecting to nsqd" in e.get("log_format", "")]


@pytest_twisted.ensureDeferred
async def test_consumer_reports_and_retries(broken: tuple[str, BrokenServer], logged: list[dict[str, Any]]) -> None:
    """A consumer's first attempt fails with the error (``first_attempts``), one error line per attempt,
    no traceback; it tries again later, and stops cleanly."""
    name, server = broken
    consumer = Consumer("t", "c", lambda m: None, Config(lookupd_poll_interval=60.0),
                        nsqd_tcp_addresses=[server.address], reactor=reactor)
    consumer.start()
    with pytest.raises(NSQClientError):
        await consumer.first_attempts()
    deadline = time.monotonic() + 30
    while server.connections < 2 and time.monotonic() < deadline:
        await task.deferLater(reactor, 0.1)
    assert server.connections >= 2, "no retry"
    await defer.Deferred.fromCoroutine(_settle())
    await consumer.stop()
    assert _tracebacks(logged) == []
    errors = _errors(logged)
    assert len(errors) >= 1 and all(server.address in e or "E_BAD_BODY" in e for e in errors), errors


@pytest_twisted.ensureDeferred
async def test_producer_reports_and_fails_publishes(broken: tuple[str, BrokenServer],
                                                    logged: list[dict[str, Any]]) -> None:
    """A producer's first attempt fails with the error, a publish waiting for a connection fails after
    ``connect_wait``, and nothing is logged as a traceback."""
    _, server = broken
    producer = Producer(server.address, Config(), reactor=reactor, connect_wait=3.0)
    published = producer.publish("t", b"x")
    with pytest.raises(NSQClientError):
        await producer.first_attempts()
    with pytest.raises(NSQClientError):
        await published
    await producer.stop()
    assert _tracebacks(logged) == []
    assert len(_errors(logged)) >= 1


async def _settle() -> None:
    await task.deferLater(reactor, 0.2)


def _run(cmd: list[str], stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(cmd, input=stdin.decode(), env=env, capture_output=True, text=True, timeout=90, cwd=ROOT)


TOOLS = {
    "tail": (["tail", "--topic=t"], "nsq_tail"),
    "pub": (["pub", "--topic=t"], "to_nsq"),
    "to-http": (["to-http", "--topic=t", "--channel=c", "--post=http://127.0.0.1:1/"], "nsq_to_http"),
    "to-nsq": (["to-nsq", "--topic=t", "--channel=c", "--destination-nsqd-tcp-address=127.0.0.1:1"], "nsq_to_nsq"),
}


TOOL_CASES = [("tail", case) for case in sorted(ANSWERS)] + [
    (tool, case) for tool in ("pub", "to-http", "to-nsq") for case in ("identify-not-json", "closed-mid-frame")]


@pytest.mark.parametrize(("tool", "case"), TOOL_CASES)
def test_tool_exits_with_one_line(tool: str, case: str) -> None:
    """The tool given the server's address exits 1 with the error in one line on stderr and no
    traceback; Go's nsq_tail exits 1 too where it gives up (side by side, when its binary is present)."""
    server = BrokenServer(ANSWERS[case], case in CLOSES)
    try:
        args, go_tool = TOOLS[tool]
        flags = [*args, f"--nsqd-tcp-address={server.address}"]
        out = _run([sys.executable, "-m", "nsqtw.tools.cli", *flags], stdin=b"hello\n")
        assert out.returncode == 1, out.stdout + out.stderr
        assert "Traceback" not in out.stderr and "Unhandled" not in out.stderr, out.stderr
        # Go's log.Fatal line: the date and time, then the error (not a client log line: "ERR    1 ...")
        texts = [line.split(" ", 2)[2] for line in out.stderr.splitlines() if line.count(" ") >= 2]
        fatal = [t for t in texts if t.startswith((f"({server.address})", "E_BAD_BODY"))]
        assert len(fatal) == 1, out.stderr
        go = ANCHOR / go_tool
        if tool == "tail" and case in GO_EXITS and go.exists():
            ran = _run([str(go), *flags])
            assert ran.returncode == 1, ran.stderr
    finally:
        server.stop()


def test_to_file_keeps_running(tmp_path: Path) -> None:
    """``nsqtw to-file`` keeps running, as nsq_to_file does, logging each failed attempt without a
    traceback, and stops cleanly on SIGTERM."""
    server = BrokenServer(ANSWERS["identify-not-json"], close=False)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "nsqtw.tools.cli", "to-file", "--topic=t",
                             f"--output-dir={tmp_path}", f"--nsqd-tcp-address={server.address}"],
                            env=env, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        # A connection is counted when accepted, before the tool has read the answer and logged
        # its error: the third connection comes only after the second attempt failed and was logged.
        deadline = time.monotonic() + 60
        while server.connections < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None and server.connections >= 3
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Unhandled" not in err, err
    assert err.count("error connecting to nsqd") >= 2, err
