"""The command-line tools' scenarios, run the same way against Go's tools and nsqtw's subcommands.

``benchmarks/record_tools_reference.py`` runs each scenario with Go's binaries
(nsqd and the tool) and stores the result in ``tests/reference/tools/``;
``tests/integration/test_tools_live.py`` runs it with nsqtw's daemon and
``nsqtw <subcommand>`` and compares. A scenario returns only what does not
vary from run to run (bodies, files with host, pid and date normalised,
request counts), so the two can be compared exactly.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.daemon import ROOT
from tests.rawclient import Client, subscribe

REFERENCE = os.path.join(ROOT, "tests", "reference", "tools")

#: Go tool -> nsqtw subcommand
SUBCOMMAND = {"nsq_tail": "tail", "to_nsq": "pub", "nsq_stat": "stat", "nsq_to_file": "to-file",
              "nsq_to_http": "to-http", "nsq_to_nsq": "to-nsq"}


@dataclass
class Env:
    """Where a scenario runs: how to start a tool, an nsqd, and a scratch directory."""

    tool: Callable[[str], list[str]]
    start_nsqd: Callable[[], Any]
    tmp: str
    env: dict[str, str]


def nsqtw_tool(name: str) -> list[str]:
    return [sys.executable, "-m", "nsqtw.tools.cli", SUBCOMMAND[name]]


def tool_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def wait_for(check: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {value!r}")
        time.sleep(0.05)


def stats(http_address: str, topic: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{http_address}/stats?format=json&topic={topic}", timeout=5) as r:
        data = json.loads(r.read())
    topics = data.get("topics") or []
    return dict(topics[0]) if topics else {}


def channel(http_address: str, topic: str, name: str) -> dict[str, Any]:
    for c in stats(http_address, topic).get("channels") or []:
        if c["channel_name"] == name:
            return dict(c)
    return {}


def post(http_address: str, path: str, body: bytes = b"") -> None:
    req = urllib.request.Request(f"http://{http_address}{path}", data=body, method="POST")
    urllib.request.urlopen(req, timeout=5).read()


def publish(address: str, topic: str, bodies: list[bytes]) -> None:
    c = Client(address)
    c.mpub(topic, bodies)
    c.response()
    c.close()


def read_topic(address: str, topic: str, count: int, ch: str = "check") -> list[str]:
    """``count`` messages of ``topic`` (FINed), then nothing more for a moment."""
    c = subscribe(address, topic, ch, rdy=min(max(count, 1), 2500))
    got = [m.body.decode() for m in c.messages(count, timeout=10, fin=True)] if count else []
    extra = c.nothing_for(0.5)
    c.close()
    assert not extra, extra
    return got


class Tool:
    """One tool process; its output is collected by threads so it never blocks."""

    def __init__(self, env: Env, name: str, *args: str, stdin: bytes | None = None) -> None:
        self.proc = subprocess.Popen([*env.tool(name), *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env.env, cwd=env.tmp)
        self.stdout = b""
        self.stderr = b""
        self._threads = [threading.Thread(target=self._read, args=("stdout",), daemon=True),
                         threading.Thread(target=self._read, args=("stderr",), daemon=True)]
        for t in self._threads:
            t.start()
        assert self.proc.stdin is not None
        if stdin is not None:
            self.proc.stdin.write(stdin)
        self.proc.stdin.close()

    def _read(self, name: str) -> None:
        stream = getattr(self.proc, name)
        while chunk := stream.read1(65536):
            setattr(self, name, getattr(self, name) + chunk)

    def wait(self, timeout: float = 30.0) -> int:
        rc = self.proc.wait(timeout)
        for t in self._threads:
            t.join(5)
        return rc

    def terminate(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.wait(10)

    def error_lines(self) -> list[str]:
        """stderr lines that mention ERROR, without their timestamps."""
        text = self.stderr.decode("utf-8", "replace")
        return [re.sub(r"^[\d/: .]+", "", line) for line in text.splitlines() if "ERROR" in line]


# --- to_nsq / nsqtw pub -------------------------------------------------------------


def pub_lines(env: Env) -> dict[str, Any]:
    """Lines from stdin (an empty one skipped, the last without a newline) go to every nsqd given."""
    nodes = [env.start_nsqd(), env.start_nsqd()]
    stdin = b"first\nsecond\n\nthird with spaces\nlast"
    tool = Tool(env, "to_nsq", "--topic=pub_t", *(f"--nsqd-tcp-address={n.tcp_address}" for n in nodes),
                stdin=stdin)
    rc = tool.wait()
    counts = [stats(n.http_address, "pub_t").get("message_count", 0) for n in nodes]
    return {"exit": rc, "received": [read_topic(n.tcp_address, "pub_t", c) for n, c in zip(nodes, counts, strict=True)]}


def pub_delimiter(env: Env) -> dict[str, Any]:
    """--delimiter splits on one byte instead of newlines; --rate throttles without losing any."""
    n = env.start_nsqd()
    tool = Tool(env, "to_nsq", "--topic=pub_d", f"--nsqd-tcp-address={n.tcp_address}", "--delimiter=,",
                "--rate=50", stdin=b"x,y,,z\nw,")
    rc = tool.wait()
    return {"exit": rc, "received": read_topic(n.tcp_address, "pub_d", stats(n.http_address, "pub_d")
                                                .get("message_count", 0))}


# --- nsq_tail / nsqtw tail -----------------------------------------------------------


def tail_n(env: Env) -> dict[str, Any]:
    """-n 3 prints three bodies, one per line, and exits 0."""
    n = env.start_nsqd()
    publish(n.tcp_address, "tail_t", [b"one", b"two", b"three", b"four", b"five"])
    tool = Tool(env, "nsq_tail", "--topic=tail_t", f"--nsqd-tcp-address={n.tcp_address}", "-n", "3",
                "--channel=keep")
    rc = tool.wait()
    return {"exit": rc, "stdout": tool.stdout.decode()}


def tail_print_topic(env: Env) -> dict[str, Any]:
    """Two topics with --print-topic: ``topic | body`` lines; SIGTERM ends it with status 0."""
    n = env.start_nsqd()
    publish(n.tcp_address, "tail_a", [b"a1", b"a2"])
    publish(n.tcp_address, "tail_b", [b"b1", b"b2"])
    tool = Tool(env, "nsq_tail", "--topic=tail_a", "--topic=tail_b", f"--nsqd-tcp-address={n.tcp_address}",
                "--print-topic")
    wait_for(lambda: tool.stdout.count(b"\n") >= 4, what="4 lines")
    rc = tool.terminate()
    return {"exit": rc, "lines": sorted(tool.stdout.decode().splitlines())}


# --- nsq_stat / nsqtw stat -----------------------------------------------------------------


def stat_table(env: Env) -> dict[str, Any]:
    """Two reports of a channel with 3 queued and 2 in flight: the header and rows, exactly."""
    n = env.start_nsqd()
    post(n.http_address, "/topic/create?topic=stat_t")
    post(n.http_address, "/channel/create?topic=stat_t&channel=c")
    publish(n.tcp_address, "stat_t", [b"1", b"2", b"3", b"4", b"5"])
    holder = subscribe(n.tcp_address, "stat_t", "c", rdy=2)
    holder.messages(2, timeout=5)  # held in flight, never FINed
    tool = Tool(env, "nsq_stat", "--topic=stat_t", "--channel=c", f"--nsqd-http-address={n.http_address}",
                "--count=2", "--interval=1s")
    rc = tool.wait()
    holder.close()
    return {"exit": rc, "stdout": tool.stdout.decode()}


def stat_missing_channel(env: Env) -> dict[str, Any]:
    """A channel the topic does not have: Go's error line and status 1."""
    n = env.start_nsqd()
    post(n.http_address, "/topic/create?topic=stat_m")
    tool = Tool(env, "nsq_stat", "--topic=stat_m", "--channel=nope", f"--nsqd-http-address={n.http_address}",
                "--count=1", "--interval=1s")
    rc = tool.wait()
    return {"exit": rc, "stdout": tool.stdout.decode(), "errors": tool.error_lines()}


# --- nsq_to_file / nsqtw to-file ---------------------------------------------------------------


def _files(directory: str) -> dict[str, str]:
    """Every file under ``directory``, names normalised, gzip members decompressed."""
    host = socket.gethostname().split(".")[0]
    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                data = f.read()
            if name.endswith(".gz"):
                data = gzip.decompress(data)
            rel = os.path.relpath(path, directory).replace(host, "<HOST>")
            rel = re.sub(r"\d{4}-\d\d-\d\d_\d\d", "<DATETIME>", rel)
            out[rel] = data.decode()
    return dict(sorted(out.items()))


def _gzip_members(path: str) -> int:
    with open(path, "rb") as f:
        data = f.read()
    members = 0
    while data:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        d.decompress(data)
        data = d.unused_data
        members += 1
    return members


def _run_to_file(env: Env, n: Any, topic: str, count: int, *args: str) -> Tool:
    tool = Tool(env, "nsq_to_file", f"--topic={topic}", f"--nsqd-tcp-address={n.tcp_address}",
                "--sync-interval=500ms", *args)

    def drained() -> bool:
        c = channel(n.http_address, topic, "nsq_to_file")
        return bool(c) and c["message_count"] == count and c["depth"] == 0 and c["in_flight_count"] == 0
    wait_for(drained, what="every message written and FINed")
    time.sleep(0.7)  # past one more sync tick, which may rotate (Go opens the next revision then)
    return tool


def to_file_plain(env: Env) -> dict[str, Any]:
    """Default filename format and no rotation: one file with every body on its own line."""
    n = env.start_nsqd()
    out = os.path.join(env.tmp, "plain")
    publish(n.tcp_address, "tf_plain", [b"alpha", b"beta", b"gamma"])
    tool = _run_to_file(env, n, "tf_plain", 3, f"--output-dir={out}")
    rc = tool.terminate()
    return {"exit": rc, "files": _files(out)}


def to_file_gzip_rotate(env: Env) -> dict[str, Any]:
    """--gzip with --rotate-size=5: a new revision every two 3-byte lines, each a valid gzip file."""
    n = env.start_nsqd()
    out = os.path.join(env.tmp, "gz")
    publish(n.tcp_address, "tf_gz", [b"m1", b"m2", b"m3", b"m4", b"m5", b"m6"])
    tool = _run_to_file(env, n, "tf_gz", 6, f"--output-dir={out}", "--gzip", "--rotate-size=5")
    rc = tool.terminate()
    return {"exit": rc, "files": _files(out)}


def to_file_work_dir(env: Env) -> dict[str, Any]:
    """--work-dir: the file is written there and moved to --output-dir when closed; a custom format."""
    n = env.start_nsqd()
    out, work = os.path.join(env.tmp, "out"), os.path.join(env.tmp, "work")
    publish(n.tcp_address, "tf_wd", [b"w1", b"w2"])
    tool = _run_to_file(env, n, "tf_wd", 2, f"--output-dir={out}", f"--work-dir={work}",
                        "--filename-format=<TOPIC>/<HOST><REV>.txt", "--datetime-format=%Y")
    rc = tool.terminate()
    return {"exit": rc, "files": _files(out), "work": _files(work)}


# --- nsq_to_http / nsqtw to-http ------------------------------------------------------------


class HTTPRecorder:
    """Endpoints on 127.0.0.1 that answer 200 and record each request."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.record()

            def do_POST(self) -> None:
                self.record()

            def record(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size) if size else b""
                outer.requests.append({"method": self.command, "path": self.path, "body": body.decode(),
                                       "content_type": self.headers.get("Content-Type"),
                                       "x_test": self.headers.get("X-Test")})
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def to_http_post_round_robin(env: Env) -> dict[str, Any]:
    """POST to two endpoints in turn with a custom header and content type: 3 to the second, 2 to the first."""
    n = env.start_nsqd()
    ends = [HTTPRecorder(), HTTPRecorder()]
    publish(n.tcp_address, "th_p", [b"p1", b"p2", b"p3", b"p4", b"p5"])
    tool = Tool(env, "nsq_to_http", "--topic=th_p", f"--nsqd-tcp-address={n.tcp_address}",
                f"--post={ends[0].url}/in", f"--post={ends[1].url}/in", "--mode=round-robin",
                "--header=X-Test:yes", "--content-type=text/plain", "--status-every=0")
    try:
        wait_for(lambda: sum(len(e.requests) for e in ends) == 5, what="5 requests")
        wait_for(lambda: channel(n.http_address, "th_p", "nsq_to_http").get("in_flight_count") == 0)
        rc = tool.terminate()
    finally:
        tool.kill()
        for e in ends:
            e.close()
    shape = {(r["method"], r["path"], r["content_type"], r["x_test"]) for e in ends for r in e.requests}
    return {"exit": rc, "counts": [len(e.requests) for e in ends], "shape": sorted(map(list, shape)),
            "bodies": sorted(r["body"] for e in ends for r in e.requests)}


def to_http_get(env: Env) -> dict[str, Any]:
    """GET with the body query-escaped into the URL's %s."""
    n = env.start_nsqd()
    end = HTTPRecorder()
    publish(n.tcp_address, "th_g", ["a b&c/d=é~".encode()])
    tool = Tool(env, "nsq_to_http", "--topic=th_g", f"--nsqd-tcp-address={n.tcp_address}",
                f"--get={end.url}/g?data=%s&x=1")
    try:
        wait_for(lambda: len(end.requests) == 1, what="1 request")
        rc = tool.terminate()
    finally:
        tool.kill()
        end.close()
    r = end.requests[0]
    return {"exit": rc, "request": [r["method"], r["path"], r["body"]]}


# --- nsq_to_nsq / nsqtw to-nsq --------------------------------------------------------------


JSON_MESSAGES = [b'{"a":1,"b":"x","c":2.50}', b'{"a":2,"b":"y"}', b"notjson", b'{"b":"x","c":[1,1e3]}',
                 b'{"b":"x","a":{"z":1,"y":[true,null]}}']


def to_nsq_json_filter(env: Env) -> dict[str, Any]:
    """--require-json-field/value and --whitelist-json-field: only b == "x" passes, reduced to a and c."""
    src, dst = env.start_nsqd(), env.start_nsqd()
    publish(src.tcp_address, "tn_j", JSON_MESSAGES)
    tool = Tool(env, "nsq_to_nsq", "--topic=tn_j", f"--nsqd-tcp-address={src.tcp_address}",
                f"--destination-nsqd-tcp-address={dst.tcp_address}", "--destination-topic=tn_out",
                "--whitelist-json-field=a", "--whitelist-json-field=c", "--require-json-field=b",
                "--require-json-value=x")

    def settled() -> bool:  # every message through the channel: just made, it is empty before the topic's copy
        c = channel(src.http_address, "tn_j", "nsq_to_nsq")
        return (bool(c) and c["message_count"] == len(JSON_MESSAGES) and c["depth"] == 0
                and c["in_flight_count"] == 0)
    try:
        wait_for(settled, what="source drained")
        rc = tool.terminate()
    finally:
        tool.kill()
    count = stats(dst.http_address, "tn_out").get("message_count", 0)
    return {"exit": rc, "received": sorted(read_topic(dst.tcp_address, "tn_out", count)),
            "errors": sorted(tool.error_lines())}


def to_nsq_round_robin(env: Env) -> dict[str, Any]:
    """Round-robin over two destinations: every message exactly once, split 2 and 2."""
    src, d1, d2 = env.start_nsqd(), env.start_nsqd(), env.start_nsqd()
    publish(src.tcp_address, "tn_rr", [b"r1", b"r2", b"r3", b"r4"])
    tool = Tool(env, "nsq_to_nsq", "--topic=tn_rr", f"--nsqd-tcp-address={src.tcp_address}",
                f"--destination-nsqd-tcp-address={d1.tcp_address}",
                f"--destination-nsqd-tcp-address={d2.tcp_address}", "--mode=round-robin")

    def settled() -> bool:  # every message through the channel: just made, it is empty before the topic's copy
        c = channel(src.http_address, "tn_rr", "nsq_to_nsq")
        return bool(c) and c["message_count"] == 4 and c["depth"] == 0 and c["in_flight_count"] == 0
    try:
        wait_for(settled, what="source drained")
        rc = tool.terminate()
    finally:
        tool.kill()
    got = [read_topic(d.tcp_address, "tn_rr", stats(d.http_address, "tn_rr").get("message_count", 0))
           for d in (d1, d2)]
    return {"exit": rc, "counts": sorted(len(g) for g in got), "bodies": sorted(b for g in got for b in g)}


SCENARIOS: dict[str, Callable[[Env], dict[str, Any]]] = {
    f.__name__: f for f in (pub_lines, pub_delimiter, tail_n, tail_print_topic, stat_table, stat_missing_channel,
                            to_file_plain, to_file_gzip_rotate, to_file_work_dir, to_http_post_round_robin,
                            to_http_get, to_nsq_json_filter, to_nsq_round_robin)
}


def reference(name: str) -> dict[str, Any]:
    with open(os.path.join(REFERENCE, name + ".json")) as f:
        data: dict[str, Any] = json.load(f)
    return data


def flag_table(usage: str) -> list[list[str]]:
    """``[name, argument, default]`` of each flag in a Go ``PrintDefaults`` listing."""
    rows: list[list[str]] = []
    for line in usage.splitlines():
        m = re.match(r"^  -(\S+)(?: (\S+))?$", line)
        if m:
            rows.append([m.group(1), m.group(2) or "", ""])
        elif rows and line.startswith("    \t"):
            d = re.search(r"\(default (.*)\)$", line)
            rows[-1][2] = d.group(1) if d else ""
    return rows


def help_tables(tool: Callable[[str], list[str]], env: dict[str, str]) -> dict[str, list[list[str]]]:
    """Each tool's flags from its ``-h`` output."""
    out = {}
    for name in SUBCOMMAND:
        r = subprocess.run([*tool(name), "-h"], capture_output=True, env=env, timeout=30)
        out[name] = flag_table(r.stderr.decode())
    return out
