"""Run tests/reliability/test_fault_matrix.py's scenarios against Go nsqd and print what each costs.

Usage: python benchmarks/fault_matrix_go.py --nsqd PATH [--runs N] [--only kill9,kill9-3s,full,full-1k,handoff,corrupt]
(--nsqd, Go's nsqd, is required; 2 runs). Needs root for the full-disk scenarios (a real
8 MiB tmpfs). Not a test: nothing here is asserted, every figure is printed, one JSON line per run,
for the "Go nsqd" column of the fault tables. Go's modes: its defaults and
``-mem-queue-size=0 -sync-every=1`` (it has no --durable-delivery). A failing fsync cannot be
injected into Go (its syscalls bypass libc, so no LD_PRELOAD): not run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.daemon import Daemon  # noqa: E402
from tests.rawclient import Client, Closed, subscribe  # noqa: E402
from tests.reliability.conftest import ping, wait_for  # noqa: E402
from tests.reliability.test_disk_faults import _filler, held_handoff, http_post  # noqa: E402
from tests.reliability.test_fault_matrix import Node, create, mpub_all  # noqa: E402

GO_MODES = {"default": (), "sync-every-1": ("-mem-queue-size=0", "-sync-every=1")}


class GoNsqd(Daemon):
    """Go's nsqd under tests.daemon.Daemon (it logs the same ``TCP: listening on`` lines)."""

    plugin = "nsqd"
    binary = "nsqd"  #: set from --nsqd

    def command(self, tcp: str, http: str) -> list[str]:
        return [self.binary, f"-tcp-address={tcp}", f"-http-address={http}",
                f"-data-path={self.data_path}", *self.args]


class GoNode(Node):
    """test_fault_matrix's Node (stats, drain, restart) around Go nsqd with Go flags."""

    def __init__(self, root: Path, *args: str) -> None:
        self.path = root / "data"
        self.path.mkdir(exist_ok=True)
        self.args = args
        self.daemon = self._start()

    def _start(self) -> Daemon:
        return GoNsqd(str(self.path), *self.args).start()

    def close(self) -> None:
        if self.daemon.proc is not None:
            self.daemon.stop()


class Tmpfs:
    """An 8 MiB tmpfs mounted on ``root``; ``fill()`` takes its last byte, ``make_room()`` frees it."""

    def __init__(self, root: Path) -> None:
        root.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(root)], check=True)
        self.root = root
        self.fill = _filler(str(root))

    def make_room(self) -> None:
        os.unlink(self.root / "filler")

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.root)], capture_output=True)


def depths(node: Node, topic: str) -> dict:
    """The topic's depth (not yet handed to its channels) and channel c's depth and backend_depth."""
    t = next(t for t in node.stats()["topics"] if t["topic_name"] == topic)
    c = node.channel_stats(topic, "c")
    return {"topic_depth": t["depth"], "channel_depth": c["depth"], "channel_backend_depth": c["backend_depth"]}


def errors(node: Node) -> list[str]:
    """The daemon's ERROR lines so far (the first five, shortened)."""
    lines = [line for line in node.daemon.read_output().splitlines() if "ERROR" in line]
    return [line.split("ERROR: ", 1)[-1][:160] for line in lines[:5]] + ([f"... {len(lines)} in all"] if lines else [])


def kill9(tmp: Path, mode: str, settle: float = 0.5) -> dict:
    """test_kill9; the kill comes ``settle`` s after the 50 are in flight (0.5 as in the test; with 3 s
    Go's 2 s -sync-timeout has written the channel queue's metadata first)."""
    node = GoNode(tmp, *GO_MODES[mode])
    try:
        create(node)
        bodies = [b"m-%05d" % i for i in range(12_000)]
        mpub_all(node, bodies)
        published = time.monotonic()
        consumer = subscribe(node.daemon.tcp_address, "t", "c", rdy=50)
        held = {m.body for m in consumer.messages(50, timeout=10)}
        wait_for(lambda: node.channel_stats("t", "c")["in_flight_count"] == 50, 10)
        time.sleep(settle)
        c = node.channel_stats("t", "c")
        killed_after = round(time.monotonic() - published, 2)
        node.restart(signal.SIGKILL)
        got = node.drain()
        got_set = set(got)
        return {"acknowledged": len(bodies), "depth": c["depth"], "backend_depth": c["backend_depth"],
                "in_flight": c["in_flight_count"], "kill_s_after_last_mpub": killed_after,
                "delivered": len(got), "delivered_unique": len(got_set),
                "lost": len(set(bodies) - got_set), "in_flight_lost": len(held - got_set),
                "errors_after_restart": errors(node)}
    finally:
        node.close()


def pinged(d: Daemon) -> str:
    status, text = ping(d)
    return f"{status} {text.decode(errors='replace')[:100]}"


def publish_one(address: str, body: bytes) -> str:
    """One PUB on its own connection: OK, the error's name, or none (no answer in 3 s)."""
    c = Client(address, timeout=3)
    try:
        c.cmd("PUB", "t", body=body)
        ftype, data = c.response(timeout=3)
    except (TimeoutError, Closed):
        return "none"
    finally:
        c.close()
    return "OK" if (ftype, data) == (0, b"OK") else data.split(b" ")[0].decode()


def full_disk(tmp: Path, mode: str, size: int) -> dict:
    """test_full_disk on a real tmpfs; the 40 PUBs are ``size`` bytes (7 as in the test, or 1 KB:
    the tmpfs keeps the unused rest of a file's last page, 4 KiB at most, which takes small writes
    even after the filler took every free page)."""
    fs = Tmpfs(tmp / "fs")
    node = GoNode(fs.root, *GO_MODES[mode])
    try:
        create(node)
        before = [b"a-%05d" % i for i in range(11_000)]
        mpub_all(node, before)
        at_fill = depths(node, "t")
        fs.fill()
        answers: dict[str, int] = {}
        acked = []
        for i in range(40):
            body = (b"b-%05d" % i).ljust(size, b"b")
            answer = publish_one(node.daemon.tcp_address, body)
            answers[answer] = answers.get(answer, 0) + 1
            if answer == "OK":
                acked.append(body)
        wait_for(lambda: ping(node.daemon)[0] == 500, 15)
        during = pinged(node.daemon)
        fs.make_room()
        wait_for(lambda: ping(node.daemon) == (200, b"OK"), 15)
        after = pinged(node.daemon)
        got = set(node.drain())
        # Go sets its health only on a publish's write: one more PUB once the queue is drained
        after_pub = publish_one(node.daemon.tcp_address, b"after")
        return {"pub_size": size, "pre_published": len(before), **at_fill, "answers": answers, "ping_during": during,
                "ping_after_15s": after, "pub_after": after_pub, "ping_after_pub": pinged(node.daemon),
                "lost_pre_published": len(set(before) - got), "lost_answered_ok": len(set(acked) - got),
                "delivered": len(got), "errors": errors(node)}
    finally:
        node.close()
        fs.close()


def handoff(tmp: Path) -> dict:
    fs = Tmpfs(tmp / "fs")
    node = GoNode(fs.root, "-mem-queue-size=0")
    d = node.daemon
    try:
        bodies = held_handoff(d)
        at_fill = depths(node, "full")
        fs.fill()
        assert http_post(d, "/topic/unpause?topic=full") == 200
        went_nok = bool(wait_for(lambda: ping(d)[0] == 500, 15))
        time.sleep(2.5)
        during = pinged(d)
        fs.make_room()
        wait_for(lambda: ping(d) == (200, b"OK"), 15)
        after = pinged(d)
        consumer = subscribe(d.tcp_address, "full", "c", rdy=500)
        got = {m.body for m in consumer.drain()}
        consumer.close()
        left = depths(node, "full")
        return {"published": len(bodies), **at_fill, "after_drain": left, "went_nok": went_nok,
                "ping_during": during, "ping_after_15s": after,
                "delivered": len(got & set(bodies)), "lost": len(set(bodies) - got), "errors": errors(node)}
    finally:
        node.close()
        fs.close()


def corrupt(tmp: Path, mode: str) -> dict:
    node = GoNode(tmp, *GO_MODES[mode], "-max-bytes-per-file=1000")
    try:
        create(node)
        bodies = [b"m-%04d" % i for i in range(300)]
        mpub_all(node, bodies, batch=50)
        rc = node.daemon.stop()
        segments = sorted(node.path.glob("t:c.diskqueue.*.dat"))
        raw = bytearray(segments[1].read_bytes())
        raw[0:4] = b"\x7f\xff\xff\xff"
        segments[1].write_bytes(bytes(raw))
        node.daemon = node._start()
        got = node.drain()
        log = node.daemon.read_output()
        return {"stop_rc": rc, "segments": len(segments), "delivered": len(got),
                "lost": len(set(bodies) - set(got)), "bad_renamed": Path(f"{segments[1]}.bad").exists(),
                "ping": pinged(node.daemon), "last_delivered": bodies[-1] in got,
                "last_is_last": bool(got) and got[-1] == bodies[-1],
                "logged_bad_file": "saving bad file as" in log}
    finally:
        node.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nsqd", required=True, help="Go nsqd v1.3.0")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--only", default="kill9,kill9-3s,full,full-1k,handoff,corrupt")
    args = parser.parse_args()
    GoNsqd.binary = os.path.abspath(args.nsqd)
    only = args.only.split(",")
    scenarios = {"kill9": kill9, "kill9-3s": lambda tmp, mode: kill9(tmp, mode, 3.0),
                 "full": lambda tmp, mode: full_disk(tmp, mode, 7),
                 "full-1k": lambda tmp, mode: full_disk(tmp, mode, 1024), "corrupt": corrupt}
    cases = [(name, mode, fn) for name, fn in scenarios.items() if name in only for mode in GO_MODES]
    if "handoff" in only:
        cases.append(("handoff", "mem-queue-size-0", lambda tmp, _mode: handoff(tmp)))
    for name, mode, fn in cases:
        for run in range(1, args.runs + 1):
            with tempfile.TemporaryDirectory() as tmp:
                result = fn(Path(tmp), mode)
            print(json.dumps({"scenario": name, "mode": mode, "run": run, **result}), flush=True)


if __name__ == "__main__":
    main()
