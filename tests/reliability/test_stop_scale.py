"""A graceful stop of a node with thousands of topics, a message in each: on time, and no false alarm.

With 30,000 such topics on a healthy disk the stop used to take 15 to 75 s
(two fsyncs per queue), gave up at 10 s and logged thousands of "could not
be flushed" lines for records that were on disk. The same shape, smaller
so it takes seconds, with each fsync made 10 ms slower (as 30,000 queues'
fsyncs are, in total, on a real disk): two fsyncs per queue would take 15 s
here. The stop exits 0 with no such line, and a restart holds every
message. (At 30,000, by hand: benchmarks/many_topics_restart.py, docs/storage.md.)
"""

from __future__ import annotations

import glob
import json
import socket
import struct
import time
import urllib.request

from nsqtw.nsqd.service import STOP_FLUSH_TIMEOUT
from tests.daemon import Daemon
from tests.reliability.faults import faulty_daemon_code

TOPICS = 3000


def publish_one_to_each(address: str, topics: int) -> None:
    """One PUB to each of ``topics`` new topics, pipelined on one connection; every OK read."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"  V2" + b"".join(b"PUB t%05d\n" % i + struct.pack(">i", 5) + b"hello" for i in range(topics)))
        buf = b""
        oks = 0
        while oks < topics:
            buf += sock.recv(1 << 16)
            while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">i", buf[:4])[0]:
                size = struct.unpack(">i", buf[:4])[0]
                assert buf[4:4 + size] == b"\x00\x00\x00\x00OK", buf[:4 + size]
                buf = buf[4 + size:]
                oks += 1


def test_a_stop_with_thousands_of_topics_reports_nothing_false(tmp_path) -> None:
    """3,000 topics, a message each in memory, fsyncs of 10 ms: SIGTERM exits 0 within the deadline,
    logs no "could not be flushed" line, and after a restart every topic holds its message."""
    path = tmp_path / "data"
    path.mkdir()
    d = Daemon(str(path), code=faulty_daemon_code(), env={"NSQTW_TEST_FSYNC_DELAY": "0.01"}).start()
    try:
        publish_one_to_each(d.tcp_address, TOPICS)
        started = time.monotonic()
        code = d.stop(timeout=60)
        took = time.monotonic() - started
    finally:
        d.stop()
    out = "".join(d.output)
    assert code == 0, out[-3000:]
    assert "could not be flushed" not in out and "exiting anyway" not in out, out[-3000:]
    assert took < STOP_FLUSH_TIMEOUT, took
    assert len(glob.glob(str(path / "*.diskqueue.000000.dat"))) == TOPICS
    # the metadata of each, renamed into place after the syncfs; no temporary file left
    assert len(glob.glob(str(path / "*.diskqueue.meta.dat"))) == TOPICS
    assert glob.glob(str(path / "*.tmp")) == []

    again = Daemon(str(path)).start(timeout=60)
    try:
        with urllib.request.urlopen(f"http://{again.http_address}/stats?format=json", timeout=30) as r:
            depths = {t["topic_name"]: t["depth"] for t in json.loads(r.read())["topics"]}
    finally:
        again.stop()
    assert depths == {f"t{i:05d}": 1 for i in range(TOPICS)}
    assert glob.glob(str(path / "*.bad")) == []
