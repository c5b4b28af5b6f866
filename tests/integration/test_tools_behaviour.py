"""``nsqtw`` subcommands against live nsqtw: clean SIGTERM drains, time rotation, discovery, fan-out.

The drain tests send SIGTERM while messages are moving and then check the
promise of docs/tools.md on nsqd's side: whatever was written or forwarded
was FINed, whatever was not is back in the channel — nothing lost, nothing
twice.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import time
from typing import Any

import pytest

from tests.toolcases import (
    Env,
    HTTPRecorder,
    Tool,
    channel,
    nsqtw_tool,
    post,
    publish,
    read_topic,
    stats,
    tool_env,
    wait_for,
)


@pytest.fixture
def env(daemon_factory, tmp_path) -> Env:
    return Env(tool=nsqtw_tool, start_nsqd=daemon_factory, tmp=str(tmp_path), env=tool_env())


BODIES = [f"msg-{i:05d}".encode() for i in range(3000)]


def remaining(n: Any, topic: str, ch: str) -> list[str]:
    """The channel's messages still queued once the tool is gone (read, FINed)."""
    wait_for(lambda: channel(n.http_address, topic, ch).get("in_flight_count", 1) == 0,
             what="nothing in flight")
    depth = channel(n.http_address, topic, ch)["depth"]
    return read_topic(n.tcp_address, topic, depth, ch=ch)


def test_to_file_sigterm_drain(env: Env) -> None:
    """SIGTERM mid-stream: every line in the file was FINed, every other message is back in the channel."""
    n = env.start_nsqd()
    publish(n.tcp_address, "dr_f", BODIES)
    out = os.path.join(env.tmp, "out")
    tool = Tool(env, "nsq_to_file", "--topic=dr_f", f"--nsqd-tcp-address={n.tcp_address}", f"--output-dir={out}",
                "--max-in-flight=50", "--sync-interval=30s", "--gzip")
    wait_for(lambda: channel(n.http_address, "dr_f", "nsq_to_file").get("message_count", 0) > 200)
    assert tool.terminate() == 0
    written = []
    for name in sorted(os.listdir(out)):
        with gzip.open(os.path.join(out, name)) as f:
            written += f.read().decode().splitlines()
    left = remaining(n, "dr_f", "nsq_to_file")
    assert written and left, (len(written), len(left))
    assert sorted(written + left) == sorted(b.decode() for b in BODIES)


def test_to_http_sigterm_drain(env: Env) -> None:
    """SIGTERM while requests run: each message that reached the endpoint was FINed, the rest requeued."""
    n = env.start_nsqd()
    bodies = BODIES[:400]
    publish(n.tcp_address, "dr_h", bodies)
    end = HTTPRecorder()
    try:
        tool = Tool(env, "nsq_to_http", "--topic=dr_h", f"--nsqd-tcp-address={n.tcp_address}",
                    f"--post={end.url}/", "--status-every=0", "--max-in-flight=20", "-n", "5")
        wait_for(lambda: len(end.requests) > 30)
        assert tool.terminate() == 0
    finally:
        end.close()
    sent = [r["body"] for r in end.requests]
    left = remaining(n, "dr_h", "nsq_to_http")
    assert sent and left
    assert sorted(sent + left) == sorted(b.decode() for b in bodies)


def test_to_nsq_sigterm_drain(env: Env) -> None:
    """SIGTERM mid-copy: the source keeps exactly what the destination did not acknowledge."""
    src, dst = env.start_nsqd(), env.start_nsqd()
    publish(src.tcp_address, "dr_n", BODIES)
    tool = Tool(env, "nsq_to_nsq", "--topic=dr_n", f"--nsqd-tcp-address={src.tcp_address}",
                f"--destination-nsqd-tcp-address={dst.tcp_address}", "--max-in-flight=20")
    wait_for(lambda: stats(dst.http_address, "dr_n").get("message_count", 0) > 200)
    assert tool.terminate() == 0
    copied = read_topic(dst.tcp_address, "dr_n", stats(dst.http_address, "dr_n")["message_count"])
    left = remaining(src, "dr_n", "nsq_to_nsq")
    assert copied and left
    assert sorted(copied + left) == sorted(b.decode() for b in BODIES)


def test_tail_sigterm_drain(env: Env) -> None:
    """SIGTERM: every printed message was FINed, the others are still in the channel."""
    n = env.start_nsqd()
    publish(n.tcp_address, "dr_t", BODIES)
    tool = Tool(env, "nsq_tail", "--topic=dr_t", f"--nsqd-tcp-address={n.tcp_address}", "--channel=keep",
                "--max-in-flight=10")
    wait_for(lambda: tool.stdout.count(b"\n") > 100)
    assert tool.terminate() == 0
    printed = tool.stdout.decode().splitlines()
    left = remaining(n, "dr_t", "keep")
    assert sorted(printed + left) == sorted(b.decode() for b in BODIES)


def test_pub_sigterm_waits_for_answers(env: Env) -> None:
    """SIGTERM while stdin is still open: what was read is published and acknowledged, exit 0."""
    n = env.start_nsqd()
    proc = subprocess.Popen([*env.tool("to_nsq"), "--topic=dr_p", f"--nsqd-tcp-address={n.tcp_address}"],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=env.env, cwd=env.tmp)
    assert proc.stdin is not None
    proc.stdin.write(b"".join(b + b"\n" for b in BODIES[:500]))
    proc.stdin.flush()
    wait_for(lambda: stats(n.http_address, "dr_p").get("message_count", 0) == 500)
    proc.terminate()
    assert proc.wait(20) == 0
    proc.stdin.close()
    proc.stderr.close()  # type: ignore[union-attr]


def test_to_file_rotate_interval(env: Env) -> None:
    """--rotate-interval=1s: messages spread over 3s land in several revisions, none lost."""
    n = env.start_nsqd()
    out = os.path.join(env.tmp, "ri")
    tool = Tool(env, "nsq_to_file", "--topic=ri", f"--nsqd-tcp-address={n.tcp_address}", f"--output-dir={out}",
                "--rotate-interval=1s", "--sync-interval=200ms")
    sent = []
    for i in range(6):
        body = f"r{i}".encode()
        publish(n.tcp_address, "ri", [body])
        sent.append(body.decode())
        time.sleep(0.5)
    wait_for(lambda: channel(n.http_address, "ri", "nsq_to_file").get("message_count") == 6
             and channel(n.http_address, "ri", "nsq_to_file").get("in_flight_count") == 0)
    assert tool.terminate() == 0
    files = sorted(os.listdir(out))
    assert len(files) >= 3, files
    assert all("-00000" in f for f in files)
    lines = []
    for name in files:
        with open(os.path.join(out, name)) as f:
            lines += f.read().splitlines()
    assert lines == sent


def test_to_file_discovers_topics(env: Env, lookupd_factory, daemon_factory) -> None:
    """Without --topic it archives every topic lookupd knows that matches --topic-pattern."""
    lookupd = lookupd_factory("--broadcast-address=127.0.0.1")
    n = daemon_factory("--broadcast-address=127.0.0.1", f"--lookupd-tcp-address={lookupd.tcp_address}")
    publish(n.tcp_address, "keep_me", [b"k1"])
    publish(n.tcp_address, "skip_me", [b"s1"])
    out = os.path.join(env.tmp, "disc")
    tool = Tool(env, "nsq_to_file", f"--lookupd-http-address={lookupd.http_address}", "--topic-pattern=^keep",
                "--topic-refresh=300ms", f"--output-dir={out}", "--sync-interval=200ms")
    wait_for(lambda: channel(n.http_address, "keep_me", "nsq_to_file").get("in_flight_count") == 0
             and channel(n.http_address, "keep_me", "nsq_to_file").get("message_count") == 1)
    assert tool.terminate() == 0
    assert [f.split(".")[0] for f in os.listdir(out)] == ["keep_me"]
    assert channel(n.http_address, "skip_me", "nsq_to_file") == {}
    assert "skipping topic skip_me (doesn't match pattern ^keep)" in tool.stderr.decode()


def test_to_http_multicast(env: Env) -> None:
    """--mode=multicast (fan-out): every endpoint gets every message."""
    n = env.start_nsqd()
    ends = [HTTPRecorder(), HTTPRecorder()]
    publish(n.tcp_address, "mc", [b"a", b"b", b"c"])
    try:
        tool = Tool(env, "nsq_to_http", "--topic=mc", f"--nsqd-tcp-address={n.tcp_address}",
                    *(f"--post={e.url}/" for e in ends), "--mode=multicast")
        wait_for(lambda: all(len(e.requests) == 3 for e in ends))
        assert tool.terminate() == 0
    finally:
        for e in ends:
            e.close()
    assert [sorted(r["body"] for r in e.requests) for e in ends] == [["a", "b", "c"]] * 2


def test_to_http_failure_requeues(env: Env) -> None:
    """An endpoint answering 500 gets the message again later; nothing is FINed until it says 200."""
    n = env.start_nsqd()
    end = HTTPRecorder()
    publish(n.tcp_address, "fail", [b"x"])
    calls: list[int] = []
    original = end.server.RequestHandlerClass.record  # type: ignore[attr-defined]

    def record(self: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        original(self)
    end.server.RequestHandlerClass.record = record  # type: ignore[attr-defined]
    try:
        tool = Tool(env, "nsq_to_http", "--topic=fail", f"--nsqd-tcp-address={n.tcp_address}",
                    f"--post={end.url}/", "--consumer-opt=default_requeue_delay,100ms",
                    "--consumer-opt=backoff_multiplier,100ms")
        wait_for(lambda: len(end.requests) == 1, timeout=15)
        assert tool.terminate() == 0
    finally:
        end.close()
    c = channel(n.http_address, "fail", "nsq_to_http")
    assert (c["requeue_count"], c["depth"], len(calls)) == (1, 0, 2)


def test_stat_through_lookupd(env: Env, lookupd_factory, daemon_factory) -> None:
    """--lookupd-http-address finds the node; the row sums its channel."""
    lookupd = lookupd_factory("--broadcast-address=127.0.0.1")
    n = daemon_factory("--broadcast-address=127.0.0.1", f"--lookupd-tcp-address={lookupd.tcp_address}")
    publish(n.tcp_address, "sl", [b"1", b"2"])
    post(n.http_address, "/channel/create?topic=sl&channel=c")
    wait_for(lambda: channel(n.http_address, "sl", "c").get("depth") == 2)
    time.sleep(0.3)  # registration reaches lookupd
    tool = Tool(env, "nsq_stat", "--topic=sl", "--channel=c", f"--lookupd-http-address={lookupd.http_address}",
                "--count=1", "--interval=200ms")
    assert tool.wait() == 0
    rows = tool.stdout.decode().splitlines()
    assert rows[2].split() == ["0", "0", "|", "2", "2", "0", "0", "0", "|", "0", "0", "2", "0"]


def test_usage_and_errors(env: Env) -> None:
    """Go's usage on a bad flag (status 2) and Go's one-line refusals (status 1)."""
    tool = Tool(env, "nsq_tail", "--nope")
    assert tool.wait() == 2
    err = tool.stderr.decode()
    assert err.startswith("flag provided but not defined: -nope\nUsage of nsqtw tail:\n  -channel string\n")
    tool = Tool(env, "nsq_to_http", "--topic=t", "--nsqd-tcp-address=127.0.0.1:1", "--post=http://x",
                "--get=http://x/%s")
    assert tool.wait() == 1
    assert tool.stderr.decode().split(" ", 2)[2] == "use --get or --post not both\n"
