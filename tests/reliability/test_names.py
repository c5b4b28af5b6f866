"""Topic and channel names can never reach outside the data path.

Names with slashes, NUL, other bytes outside nsqd's ``[.a-zA-Z0-9_-]`` (and
``#ephemeral``) or over 64 characters are refused over TCP and HTTP before
any topic, channel or file exists. ``.`` and ``..`` are valid nsqd names
(Go nsqd accepts them too); their files are ``...diskqueue.*`` inside the
data path, like every other name's.
"""

from __future__ import annotations

import json
import os
import struct
import urllib.parse
import urllib.request

import pytest

from tests.rawclient import FRAME_ERROR, Client, subscribe
from tests.reliability.conftest import assert_no_traceback, files_under, http_raw, status_of

BAD_NAMES = [b"../escape", b"../../tmp/escape", b"a/b", b"/abs", b"..\\escape", b"x\x00y", b"\x00",
             b"a" * 65, b"t:c", b"", b" ", b"t\n", b"caf\xc3\xa9", b"\xff", b"~", b"$HOME", b"a#ephemeral#ephemeral",
             b"#ephemeral", b"..%2Fescape"]


def _stats_names(d) -> set[str]:
    with urllib.request.urlopen(f"http://{d.http_address}/stats?format=json", timeout=10) as r:
        topics = json.load(r)["topics"]
    return {t["topic_name"] for t in topics} | {f'{t["topic_name"]}:{c["channel_name"]}'
                                                for t in topics for c in t["channels"]}


@pytest.fixture
def daemon_and_tree(tmp_path, daemon_factory):
    d = daemon_factory(data_path=str(tmp_path / "data"))
    return d, str(tmp_path)


def test_bad_names_refused_over_tcp_before_any_file(daemon_and_tree) -> None:
    """PUB, MPUB, DPUB and SUB with an escaping or invalid name: nsqd's error, and no file anywhere."""
    d, tree = daemon_and_tree
    before = files_under(tree)
    for name in BAD_NAMES:
        if b"\n" in name or b" " in name:
            continue  # cannot be one argument on a V2 command line
        for line, code in [(b"PUB %s\n" % name + struct.pack(">i", 1) + b"x", b"E_BAD_TOPIC"),
                           (b"MPUB %s\n" % name + struct.pack(">iii", 9, 1, 1) + b"x", b"E_BAD_TOPIC"),
                           (b"DPUB %s 10\n" % name + struct.pack(">i", 1) + b"x", b"E_BAD_TOPIC"),
                           (b"SUB %s c\n" % name, b"E_BAD_TOPIC"),
                           (b"SUB t %s\n" % name, b"E_BAD_CHANNEL")]:
            c = Client(d.tcp_address)
            c.send(line)
            frames = c.wait_closed(5)
            assert len(frames) == 1 and frames[0][0] == FRAME_ERROR, (line, frames)
            assert frames[0][1].split(b" ")[0] in (code, b"E_INVALID"), (line, frames)
    assert files_under(tree) == before
    assert _stats_names(d) == set()
    assert_no_traceback(d)


def test_bad_names_refused_over_http_before_any_file(daemon_and_tree) -> None:
    """Every HTTP route that takes a topic or channel answers 400 for a bad one; no file, no topic."""
    d, tree = daemon_and_tree
    before = files_under(tree)
    for name in BAD_NAMES:
        q = urllib.parse.quote(name, safe="")
        if name == b"..%2Fescape":
            q = "..%2Fescape"  # decoded once by the query parser: "../escape"
        for path in [f"/pub?topic={q}", f"/mpub?topic={q}", f"/topic/create?topic={q}",
                     f"/channel/create?topic={q}&channel=c", f"/channel/create?topic=t&channel={q}",
                     f"/topic/pause?topic={q}", f"/topic/empty?topic={q}", f"/topic/delete?topic={q}"]:
            response = http_raw(d.http_address, b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                                b"Connection: close\r\nContent-Length: 1\r\n\r\nx")
            status = status_of(response)
            if path.startswith(("/topic/delete", "/topic/pause", "/topic/empty")):
                assert status in (400, 404), (path, response)  # nsqd looks these up: TOPIC_NOT_FOUND
            else:
                assert status == 400, (path, response)
    assert files_under(tree) == before
    assert _stats_names(d) == set()  # /channel/create checks both names before creating either
    assert_no_traceback(d)


def test_dot_names_stay_inside_the_data_path(tmp_path, daemon_factory) -> None:
    """``.`` and ``..`` are valid nsqd names: they work, and their files are inside the data path.

    Through the disk queues (``--mem-queue-size=0``): a queue whose messages never reached the
    disk writes no file at the stop, so in memory there would be nothing to look at."""
    d, tree = daemon_factory("--mem-queue-size=0", data_path=str(tmp_path / "data")), str(tmp_path)
    before = files_under(tree)
    for topic, channel in [("..", ".."), (".", "."), ("...", "..")]:
        c = subscribe(d.tcp_address, topic, channel, rdy=1)
        Client(d.tcp_address).pub(topic, b"dots")
        m = c.message()
        assert m.body == b"dots"
        c.fin(m)
    d.stop()
    new = files_under(tree) - before
    data = os.path.join(tree, "data")
    assert new and all(os.path.realpath(os.path.join(tree, f)).startswith(data + os.sep) for f in new), new
    assert {f for f in new if "diskqueue" in f} >= {"data/...diskqueue.meta.dat", "data/..:...diskqueue.meta.dat",
                                                     "data/..diskqueue.meta.dat", "data/.:..diskqueue.meta.dat"}
