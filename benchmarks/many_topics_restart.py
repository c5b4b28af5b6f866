"""A node with many topics, each holding a message: publish, graceful stop, restart; Go nsqd beside nsqtw.

Usage: python benchmarks/many_topics_restart.py TOPICS PATH/TO/GO/nsqd [--create-with=nsqtw|go]
       [--nofile=N]

One client PUBs one message to each of TOPICS new topics (pipelined, on one
connection), the node is stopped with SIGTERM, and each daemon is started
again on that data directory: the time from the start to the
``listening on`` lines and to the first ``/ping`` answered ``OK``, the
``*.bad`` segments it left, and the messages it holds (the depth its
``/stats`` reports). The data directory is made once (by nsqtw unless
``--create-with=go``: Go nsqd takes minutes to create tens of thousands of
topics) and copied for each daemon, so both restart on the same files.

``--nofile=N`` runs the restarts with that open-file limit (soft and hard;
setting a hard limit above the current one needs root); without it they
inherit this shell's. Both daemons raise their soft limit to the hard one.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nsqtw.tools.daemons import LISTEN_LINE, nsqtw_command  # noqa: E402


def spawn(cmd: list[str], data: str, nofile: int | None) -> tuple[subprocess.Popen[str], list[str]]:
    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    proc = subprocess.Popen(cmd + [f"--data-path={data}", "--tcp-address=127.0.0.1:0",
                                   "--http-address=127.0.0.1:0"],
                            cwd=data, env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, preexec_fn=limit)
    lines: list[str] = []

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)

    threading.Thread(target=drain, daemon=True).start()
    return proc, lines


def wait_listening(proc: subprocess.Popen[str], lines: list[str], timeout: float) -> dict[str, str] | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {m.group(1): m.group(2) for line in list(lines) if (m := LISTEN_LINE.search(line))}
        if {"TCP", "HTTP"} <= found.keys():
            return found
        if proc.poll() is not None:
            time.sleep(0.2)
            return None
        time.sleep(0.005)
    return None


def ping_ok(http: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{http}/ping", timeout=5) as r:
                if r.read() == b"OK":
                    return True
        except OSError:
            pass
        time.sleep(0.005)
    return False


def publish(tcp: str, topics: int) -> float:
    """One PUB to each of ``topics`` topics on one connection; the seconds until every OK came back."""
    host, port = tcp.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"  V2")
    started = time.monotonic()
    got = 0
    buf = b""

    def read_some() -> None:
        nonlocal buf, got
        buf += sock.recv(1 << 20)
        while len(buf) >= 8:
            size, kind = struct.unpack(">ii", buf[:8])
            if len(buf) < 4 + size:
                break
            body, buf = buf[8:4 + size], buf[4 + size:]
            if (kind, body) == (0, b"_heartbeat_"):  # Go takes minutes to create the topics
                sock.sendall(b"NOP\n")
                continue
            if (kind, body) != (0, b"OK"):
                raise RuntimeError(f"PUB answered {kind} {body!r}")
            got += 1

    sent = 0
    while sent < topics:
        chunk = b"".join(b"PUB t%06d\n" % i + struct.pack(">i", 5) + b"hello"
                         for i in range(sent, min(sent + 500, topics)))
        sock.sendall(chunk)
        sent = min(sent + 500, topics)
        while got < sent - 2000:
            read_some()
    while got < topics:
        read_some()
    elapsed = time.monotonic() - started
    sock.close()
    return elapsed


def stop(proc: subprocess.Popen[str], lines: list[str]) -> tuple[float, int, str]:
    """SIGTERM; (seconds to exit, exit status, what it said about flushing)."""
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(300)
    took = time.monotonic() - started
    time.sleep(0.2)
    unflushed = sum("could not be flushed" in line for line in lines)
    gave_up = sum("exiting anyway" in line for line in lines)
    return took, rc, f"{unflushed} 'could not be flushed' lines{', gave up waiting' if gave_up else ''}"


def depth(http: str) -> int:
    with urllib.request.urlopen(f"http://{http}/stats?format=json", timeout=60) as r:
        stats = json.loads(r.read())
    return sum(t["depth"] for t in stats["topics"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("topics", type=int)
    parser.add_argument("go")
    parser.add_argument("--create-with", choices=("nsqtw", "go"), default="nsqtw")
    parser.add_argument("--nofile", type=int)
    args = parser.parse_args()
    daemons = {"Go nsqd v1.3.0": [os.path.abspath(args.go)], "nsqtw": nsqtw_command()}
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"open-file limit here: soft {soft}, hard {hard}; restarts with "
          f"{args.nofile if args.nofile else hard} (each daemon raises its soft limit to its hard one)")
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        made = os.path.join(tmp, "made")
        os.makedirs(made)
        creator = "Go nsqd v1.3.0" if args.create_with == "go" else "nsqtw"
        proc, lines = spawn(daemons[creator], made, None)
        found = wait_listening(proc, lines, 60)
        assert found, "".join(lines)
        took = publish(found["TCP"], args.topics)
        stopped, rc, said = stop(proc, lines)
        print(f"{creator}: {args.topics} PUBs to new topics in {took:.1f}s; SIGTERM to exit {stopped:.2f}s,"
              f" exit status {rc}, {said}", flush=True)
        segments = len(glob.glob(os.path.join(made, "*.diskqueue.0*.dat")))
        metas = len(glob.glob(os.path.join(made, "*.diskqueue.meta.dat")))
        temps = len(glob.glob(os.path.join(made, "*.tmp")))
        print(f"data directory: {segments} segments, {metas} metadata files, {temps} temporary files", flush=True)
        for name, cmd in daemons.items():
            data = os.path.join(tmp, name.split()[0] + "-restart")
            shutil.copytree(made, data)
            started = time.monotonic()
            proc, lines = spawn(cmd, data, args.nofile)
            found = wait_listening(proc, lines, 600)
            listening = time.monotonic() - started
            if found is None:
                fatal = [line.strip() for line in lines if "FATAL" in line or "too many" in line.lower()][:3]
                print(f"{name}: did not start ({listening:.1f}s): {fatal}", flush=True)
                proc.kill()
                proc.wait()
            else:
                ok = ping_ok(found["HTTP"], 600)
                pinged = time.monotonic() - started
                held = depth(found["HTTP"])
                stopped, rc, said = stop(proc, lines)
                print(f"{name}: listening after {listening:.2f}s, /ping {'OK' if ok else 'not OK'} after"
                      f" {pinged:.2f}s; depth {held} of {args.topics}; SIGTERM to exit {stopped:.2f}s, exit"
                      f" status {rc}, {said}", flush=True)
            bad = len(glob.glob(os.path.join(data, "*.bad")))
            errors = sum("too many open files" in line.lower() for line in lines)
            print(f"{name}: {bad} segments renamed *.bad, {errors} 'too many open files' lines", flush=True)
            shutil.rmtree(data)


if __name__ == "__main__":
    main()
