"""nsqtw-bench: every mode runs against a live daemon and prints its result line (not a timed test)."""

from __future__ import annotations

import os
import re
import shlex
import socket
import struct
import subprocess
import sys
import threading

import pytest

from tests.daemon import ROOT

LINE = re.compile(r"duration: \S+ - [\d.]+mb/s - ([\d.]+)ops/s - [\d.]+us/op")


def bench(*args: str) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-m", "nsqtw.tools.bench", *args], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_writer_then_reader(nsqd) -> None:
    """The writer publishes and the reader consumes, each printing bench_writer's line."""
    w = bench("writer", f"--nsqd-tcp-address={nsqd.tcp_address}", "--runfor=1s", "--workers=1",
              "--batch-size=50", "--size=100")
    m = LINE.search(w)
    assert m and float(m.group(1)) > 0, w
    r = bench("reader", f"--nsqd-tcp-address={nsqd.tcp_address}", "--runfor=1s", "--workers=1",
              f"--daemon-pid={nsqd.proc.pid}")
    m = LINE.search(r)
    assert m and float(m.group(1)) > 0, r
    cpu = re.search(r"\[reader\] daemon CPU: ([\d.]+)s - ([\d.]+)us/msg", r)
    assert cpu and float(cpu.group(1)) > 0 and float(cpu.group(2)) > 0, r


def test_single_message_round_trips_and_go_flags(nsqd) -> None:
    """Batch size 1 works, and Go's single-dash flags are accepted."""
    out = bench("writer", f"-nsqd-tcp-address={nsqd.tcp_address}", "-runfor=1s", "-workers=1",
                "-batch-size=1", "-topic=single")
    assert LINE.search(out), out


def test_concurrent_single_publishers_durable(daemon_factory) -> None:
    """Several one-message (PUB) publishers against --durable-delivery: all their messages land."""
    import json
    import urllib.request

    d = daemon_factory("--durable-delivery")
    out = bench("writer", f"--nsqd-tcp-address={d.tcp_address}", "--runfor=1s", "--workers=3",
                "--pub", "--topic=dur")
    m = LINE.search(out)
    assert m, out
    with urllib.request.urlopen(f"http://{d.http_address}/stats?format=json&topic=dur") as r:
        [topic] = json.load(r)["topics"]
    # every PUB answered OK is counted (the line's ops/s is count / runfor)
    assert topic["message_count"] == round(float(m.group(1))) > 0, (topic, out)


def test_latency_mode(nsqd) -> None:
    """The latency mode publishes at a fixed rate and reports percentiles of everything it sent."""
    out = bench("latency", f"--nsqd-tcp-address={nsqd.tcp_address}", "--runfor=1s", "--rate=200")
    m = re.search(r"sent (\d+) - received (\d+) - p50 [\d.]+ms - p99 [\d.]+ms - p999 [\d.]+ms", out)
    assert m and int(m.group(1)) > 0 and m.group(1) == m.group(2), out


def _fake_nsqd(script: list[tuple[bytes, bytes]], seen: list[bytes]) -> tuple[str, threading.Thread]:
    """One connection: wait for each expected bytes in turn, answer with its reply; keep what came."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(30)

    def serve() -> None:
        conn, _ = srv.accept()
        conn.settimeout(30)
        buf = b""
        try:
            for expect, reply in script:
                while expect not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                if reply:
                    conn.sendall(reply)
        finally:
            seen.append(buf)
            conn.close()
            srv.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"127.0.0.1:{srv.getsockname()[1]}", thread


def test_reader_answers_heartbeats_and_counts_only_messages() -> None:
    """The reader (an nsqtw.client Consumer) NOPs a heartbeat, FINs each message, counts messages only."""
    def frame(ftype: int, data: bytes) -> bytes:
        return struct.pack(">ii", len(data) + 4, ftype) + data

    msg = struct.pack(">qH", 1, 1) + b"0123456789abcdef" + b"body"
    seen: list[bytes] = []
    address, thread = _fake_nsqd([(b"IDENTIFY\n", b""), (b"}", frame(0, b"OK")),
                                  (b"SUB sub_bench ch\n", frame(0, b"OK")),
                                  (b"RDY 7\n", frame(0, b"_heartbeat_") + frame(2, msg)),
                                  (b"FIN 0123456789abcdef\n", b""), (b"NOP\n", b"")], seen)
    out = bench("reader", f"--nsqd-tcp-address={address}", "--runfor=1s", "--workers=1", "--rdy=7")
    thread.join(30)
    m = LINE.search(out)
    assert m and float(m.group(1)) == 1.0, out
    assert b"FIN 0123456789abcdef\n" in seen[0] and b"NOP\n" in seen[0], seen


def test_unreachable_daemon_is_an_error() -> None:
    """A worker that cannot connect makes nsqtw-bench fail with a message, not hang."""
    port = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{port.getsockname()[1]}"
    port.close()
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-m", "nsqtw.tools.bench", "writer", f"--nsqd-tcp-address={address}",
                          "--runfor=1s", "--workers=1"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "nsqtw-bench: 1 of 1 workers failed" in out.stderr, out


def test_latency_ignores_a_backlog_on_its_topic(nsqd) -> None:
    """Run after a writer on the same topic, latency counts only its own messages: sane figures."""
    bench("writer", f"--nsqd-tcp-address={nsqd.tcp_address}", "--runfor=1s", "--workers=1",
          "--batch-size=50", "--size=100", "--topic=shared_lat")
    out = bench("latency", f"--nsqd-tcp-address={nsqd.tcp_address}", "--runfor=1s", "--rate=200",
                "--topic=shared_lat")
    m = re.search(r"sent (\d+) - received (\d+) - p50 ([\d.]+)ms - p99 ([\d.]+)ms - p999 ([\d.]+)ms", out)
    assert m and int(m.group(1)) > 0 and m.group(1) == m.group(2), out
    # publish-to-receipt times of this run: well under the run's length, never the writer's garbage
    assert 0 <= float(m.group(3)) <= float(m.group(5)) < 11_000, out


def test_scale_mode_creates_connects_measures_and_cleans_up(daemon_factory) -> None:
    """``scale``: 20 topics x 5 channels x 2 subscribers, measured, then all deleted; the daemon's
    threads and open files come back to where they were (nothing left behind)."""
    import json
    import urllib.request

    d = daemon_factory()
    with urllib.request.urlopen(f"http://{d.http_address}/ping") as r:
        assert r.read() == b"OK"
    tasks_before = len(os.listdir(f"/proc/{d.pid}/task"))
    files_before = len(os.listdir(f"/proc/{d.pid}/fd"))
    out = bench("scale", f"--nsqd-tcp-address={d.tcp_address}", f"--nsqd-http-address={d.http_address}",
                "--topics=20", "--channels=5", "--clients=2", "--idle=1", f"--daemon-pid={d.pid}", "--json")
    result = json.loads(out)
    assert result["create_per_s"] > 0 and result["delete_per_s"] > 0 and result["connect_per_s"] > 0
    assert len(result["stats_ms"]) == 5 and result["stats_bytes"] > 20 * 5 * 2 * 300
    # 200 subscribers were connected: one socket each
    assert result["open_files"] >= files_before + 200
    assert result["threads"] <= tasks_before + 4  # the disk pool may have started its threads
    after = result["after_delete"]
    assert after["open_files"] <= files_before + 2, (files_before, after)
    assert after["threads"] == result["threads"], after
    with urllib.request.urlopen(f"http://{d.http_address}/stats?format=json") as r:
        assert json.load(r)["topics"] == []


GO_BIN = os.path.join(ROOT, "..", "shared", "anchor", "bin")
ROW = re.compile(r"^\| (?P<label>[^|]+) \| (?P<client>[^|]+) \| (?P<a>[^|]+) \| (?P<b>[^|]+)"
                 r" \| \*\*(?P<r>[\d.]+)×\*\* \|", re.M)


def _compare(go_nsqd: str, *args: str) -> tuple[str, str]:
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-m", "nsqtw.tools.bench", "compare", f"--go-nsqd={go_nsqd}",
                          "--runs=1", "--runfor=1s", *args], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout, out.stderr


def test_compare_measures_every_figure_on_both_daemons() -> None:
    """``nsqtw-bench compare`` starts both daemons fresh and gives every figure for each.

    Go nsqd is not needed: nsqtw itself stands in for it (a command line is accepted where
    the Go binary's path goes) and, with no Go bench tools, nsqtw-bench drives both.
    """
    from nsqtw.tools.daemons import nsqtw_command

    stand_in = " ".join(shlex.quote(a) for a in nsqtw_command())
    table, log = _compare(stand_in, "--go-bench-dir=", "--daemon-flag=--max-msg-size=2000000",
                          "--memory-messages=20000", "--nsqtw-flag=--busy-poll=0")
    rows = {m["label"]: m for m in ROW.finditer(table)}
    assert set(rows) == {"MPUB write", "read, RDY 2500", "one-message round trips (MPUB of 1)",
                         "PUB from one connection", "e2e latency p99", "RSS at idle, just started",
                         "memory per message held"}, table
    for label, row in rows.items():
        assert row["client"] == "nsqtw-bench"
        for cell in (row["a"], row["b"]):
            value = float(re.sub(r"[^\d.-]", "", cell.split("/s")[0].split(" ")[0]))
            assert value > 0, (label, cell)
        assert float(row["r"]) > 0
    # each load was run once per daemon, each with the daemon's CPU per message
    assert len(re.findall(r"^run 1/1 (Go|nsqtw) .* µs/msg$", log, re.M)) == 10, log
    assert "--max-msg-size=2000000" in table  # the flags both daemons got are in the header
    # a flag only for nsqtw (an A/B of its own features) goes to nsqtw's command line alone
    go_line, ours_line = re.search(r"daemons: (.*) \| (.*); flags:", table).groups()  # type: ignore[union-attr]
    assert ours_line.endswith(" --busy-poll=0") and "--busy-poll" not in go_line, table
    # and whether nsqtw ran its compiled speed-ups, as this interpreter would
    from nsqtw.core.message import SPEEDUPS
    assert f"nsqtw's compiled speed-ups: {'yes' if SPEEDUPS else 'no'}" in table


@pytest.mark.skipif(not os.access(os.path.join(GO_BIN, "nsqd"), os.X_OK),
                    reason="Go nsqd v1.3.0 (../shared/anchor/bin) is not on this machine")
def test_compare_with_go_nsqd_and_its_bench_tools() -> None:
    """Against the real Go nsqd, with Go's bench_writer/bench_reader as a second client; given
    by a relative path, as docs/performance.md's commands do (each daemon runs in a scratch dir)."""
    table, _ = _compare(os.path.relpath(os.path.join(GO_BIN, "nsqd")), "--measures=write,read,round_trip")
    clients = {(m["label"], m["client"]) for m in ROW.finditer(table)}
    assert clients == {(label, client) for label in ("MPUB write", "read, RDY 2500",
                                                     "one-message round trips (MPUB of 1)")
                       for client in ("Go bench", "nsqtw-bench")}, table


def test_fanout_mode_measures_copies_and_the_bystander(daemon_factory) -> None:
    """``fanout``: for each channel count and mode, a topic with that many channels gets every copy,
    the copy rate and the bystander's /ping and PUB latencies are given, and the topic is deleted."""
    import json
    import urllib.request

    d = daemon_factory()
    out = bench("fanout", f"--nsqd-tcp-address={d.tcp_address}", f"--nsqd-http-address={d.http_address}",
                "--channels=3,20", "--mode=pub,mpub", "--messages=40", "--batch-size=7", "--size=10", "--json")
    results = [json.loads(line) for line in out.splitlines()]
    assert [(r["channels"], r["mode"], r["messages"]) for r in results] == [
        (3, "pub", 40), (3, "mpub", 40), (20, "pub", 40), (20, "mpub", 40)]
    for r in results:
        assert r["copies_per_s"] > 0 and r["seconds"] > 0, r
        assert 0 < r["ping_p50_ms"] <= r["ping_max_ms"] and 0 < r["pub_p50_ms"] <= r["pub_max_ms"], r
    with urllib.request.urlopen(f"http://{d.http_address}/stats?format=json") as r:
        assert json.load(r)["topics"] == []  # its topics deleted


def test_compare_fanout_on_both_daemons() -> None:
    """``compare --measures=fanout``: both daemons fresh for each channel count and mode, one table row each."""
    from nsqtw.tools.daemons import nsqtw_command

    stand_in = " ".join(shlex.quote(a) for a in nsqtw_command())
    table, log = _compare(stand_in, "--measures=fanout", "--fanout-channels=4", "--fanout-modes=pub,mpub",
                          "--fanout-copies=80", "--batch-size=5", "--size=10")
    rows = re.findall(r"^\| 4 \| (PUB|MPUB) \| 20 \| ([\d,]+) \| ([\d,]+) \| \*\*[\d.]+×\*\* \| .* ms \| .* ms \|$",
                      table, re.M)
    assert [r[0] for r in rows] == ["PUB", "MPUB"], table
    assert all(int(a.replace(",", "")) > 0 and int(b.replace(",", "")) > 0 for _, a, b in rows), table
    assert len(re.findall(r"^run 1/1 (Go|nsqtw) +fanout: 4 channels", log, re.M)) == 4, log
    assert "MPUB write" not in table  # only the figures asked for
