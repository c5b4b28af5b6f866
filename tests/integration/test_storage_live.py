"""Durable queues against a real daemon: Go's data dir, restarts, kill -9."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request

from tests.daemon import Daemon
from tests.helpers import REFERENCE_DIR
from tests.rawclient import Client, subscribe


def http_json(daemon: Daemon, path: str) -> dict:
    with urllib.request.urlopen(f"http://{daemon.http_address}{path}") as r:
        return json.load(r)


def test_go_data_dir_opens_and_delivers(tmp_path, daemon_factory) -> None:
    """A data dir Go nsqd v1.3.0 left behind: every queued message is delivered, paused states kept."""
    data = tmp_path / "go"
    shutil.copytree(os.path.join(REFERENCE_DIR, "nsqd-1.3.0-datadir"), data)
    for f in data.iterdir():
        f.chmod(0o644)
    expected = json.load(open(os.path.join(REFERENCE_DIR, "nsqd-1.3.0-datadir.json")))["bodies"]
    d = daemon_factory("--mem-queue-size=0", "--max-bytes-per-file=400", data_path=str(data))
    c = subscribe(d.tcp_address, "ref", "c")
    got = c.messages(len(expected), fin=True)
    assert [m.body.decode() for m in got] == expected
    assert {m.attempts for m in got} == {1}
    c.close()
    d.stop()
    meta = json.loads((data / "nsqd.dat").read_text())
    paused = {(t["name"], c["name"]): c["paused"] for t in meta["topics"] for c in t["channels"]}
    assert paused == {("ref", "c"): False, ("ref", "paused_c"): True, ("paused_t", "pc"): False}
    assert {t["name"]: t["paused"] for t in meta["topics"]} == {"ref": False, "paused_t": True}
    # the paused channel still holds its 20 messages (depth kept in its metadata)
    assert (data / "ref:paused_c.diskqueue.meta.dat").read_text().split("\n")[0] == "20"


def test_corrupt_segment_is_set_aside(tmp_path, daemon_factory) -> None:
    """A corrupt segment is renamed .bad, the daemon keeps serving and stays healthy (as Go nsqd);
    /stats counts the segment set aside and the log has the ERROR."""
    data = tmp_path / "c"
    d = daemon_factory("--mem-queue-size=0", "--max-bytes-per-file=1000", data_path=str(data))
    pub = Client(d.tcp_address)
    for i in range(100):
        pub.pub("t", b"x%03d" % i)
    d.stop()
    first = data / "t.diskqueue.000000.dat"
    raw = bytearray(first.read_bytes())
    raw[0:4] = b"\x7f\xff\xff\xff"  # an impossible record size
    first.write_bytes(bytes(raw))
    d2 = daemon_factory("--mem-queue-size=0", "--max-bytes-per-file=1000", data_path=str(data))
    got = subscribe(d2.tcp_address, "t", "c", rdy=100).drain()
    assert got and len(got) < 100  # the later segments still deliver
    assert (data / "t.diskqueue.000000.dat.bad").exists()
    with urllib.request.urlopen(f"http://{d2.http_address}/ping") as r:
        assert (r.status, r.read()) == (200, b"OK")
    with urllib.request.urlopen(f"http://{d2.http_address}/stats?format=json") as r:
        stats = json.load(r)
    assert stats["health"] == "OK" and stats["segments_set_aside"] == 1
    # a /stats of one channel reads the node's count, kept as queues set segments aside
    with urllib.request.urlopen(f"http://{d2.http_address}/stats?format=json&topic=t&channel=c") as r:
        assert json.load(r)["segments_set_aside"] == 1
    d2.wait_output("saving bad file as")
    assert "#error" in d2.read_output()
    Client(d2.tcp_address).pub("t", b"still-works")


def test_pause_persisted_at_once(tmp_path, daemon_factory) -> None:
    """Pausing over HTTP rewrites nsqd.dat right away: the paused states survive even kill -9."""
    data = str(tmp_path / "p")
    d = daemon_factory(data_path=data)
    subscribe(d.tcp_address, "t", "c").close()
    for path in ("/topic/pause?topic=t", "/channel/pause?topic=t&channel=c"):
        urllib.request.urlopen(urllib.request.Request(f"http://{d.http_address}{path}", method="POST"))
    def both_paused_on_disk() -> bool:
        try:
            with open(os.path.join(data, "nsqd.dat")) as f:
                return f.read().count('"paused":true') == 2  # the topic and its channel
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not both_paused_on_disk():
        time.sleep(0.05)
    assert both_paused_on_disk()
    d.kill()
    d2 = daemon_factory(data_path=data)
    [topic] = http_json(d2, "/stats?format=json")["topics"]
    assert topic["paused"] is True
    assert [c["paused"] for c in topic["channels"]] == [True]
