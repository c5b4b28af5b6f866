"""SIGTERM while fsync fails (issue #15 item 5): the daemon exits within a bounded time.

With ``--durable-delivery`` the graceful stop used to wait for hand-offs
that wait for a journal fsync that never succeeds. Now the stop gives the
flush :data:`nsqtw.nsqd.service.STOP_FLUSH_TIMEOUT` seconds, then logs what
could not be flushed and exits; nothing acknowledged is lost (what was
fsynced before the fault comes back at the next start).
"""

from __future__ import annotations

import os
import signal
import time

from nsqtw.nsqd.service import STOP_FLUSH_TIMEOUT
from tests.daemon import Daemon
from tests.rawclient import Client, subscribe
from tests.reliability.faults import faulty_daemon_code
from tests.reliability.test_disk_faults import http_post


def test_sigterm_with_failing_fsync_exits_in_bounded_time(tmp_path) -> None:
    path = tmp_path / "data"
    path.mkdir()
    flag = str(tmp_path / "fsync-fails")
    args = ("--durable-delivery", "--mem-queue-size=0")
    d = Daemon(str(path), *args, code=faulty_daemon_code(), env={"NSQTW_TEST_FSYNC_FAIL_FLAG": flag})
    d.start()
    stopped = False
    try:
        assert http_post(d, "/topic/create?topic=t") == 200
        assert http_post(d, "/channel/create?topic=t&channel=c") == 200
        acked = [b"acked-%03d" % i for i in range(100)]
        c = Client(d.tcp_address)
        c.mpub("t", acked)
        assert c.response(timeout=10) == (0, b"OK")
        consumer = subscribe(d.tcp_address, "t", "c", rdy=10)
        held = consumer.messages(10, timeout=10)  # in flight, not FINed
        assert len(held) == 10
        open(flag, "w").close()
        # a publish that cannot be fsynced waits (no answer); the hand-off and FINs pile up
        late = Client(d.tcp_address)
        late.mpub("t", [b"late-%03d" % i for i in range(50)])
        for m in held[:5]:
            consumer.fin(m)
        time.sleep(2.5)  # failed retries
        started = time.monotonic()
        out_before = d.read_output()
        code = d.stop(signal.SIGTERM, timeout=STOP_FLUSH_TIMEOUT + 30)
        took = time.monotonic() - started
        stopped = True
        out = "".join(d.output)
        assert code == 0 and took < STOP_FLUSH_TIMEOUT + 10, (code, took, out[len(out_before) - 200:])
        assert "could not be flushed" in out, out[-3000:]
        assert "NSQ: stopped" in out
    finally:
        if not stopped:
            d.kill()
    # the fault gone, every acknowledged message is still there
    os.unlink(flag)
    d2 = Daemon(str(path), *args)
    d2.start()
    try:
        got = {m.body for m in subscribe(d2.tcp_address, "t", "c", rdy=200).drain()}
        assert set(acked) - {m.body for m in held[:5]} <= got, sorted(set(acked) - got)
    finally:
        d2.stop()
