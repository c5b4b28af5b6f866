"""DiskQueue against a data dir Go nsqd v1.3.0 wrote: same records, same depths, same metadata bytes."""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
import tempfile

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.storage.diskqueue import DiskQueue
from nsqtw.storage.executor import SynchronousDiskExecutor
from nsqtw.storage.segments import nsqd_msg_size_limits

REFERENCE = os.path.join(os.path.dirname(__file__), "..", "reference")
DATADIR = os.path.join(REFERENCE, "nsqd-1.3.0-datadir")
#: the Go run used --max-bytes-per-file=400 and the default --max-msg-size
MAX_BYTES_PER_FILE = 400
MIN_SIZE, MAX_SIZE = nsqd_msg_size_limits(1024 * 1024)


def decode(record: bytes) -> tuple[int, int, bytes, bytes]:
    """nsqd's disk encoding: 8-byte ns timestamp, 2-byte attempts, 16-byte hex ID, body."""
    ts, attempts = struct.unpack_from(">qH", record)
    return ts, attempts, record[10:26], record[26:]


class ReferenceDataDirTests(SynchronousTestCase):
    def setUp(self) -> None:
        with open(DATADIR + ".json") as f:
            self.about = json.load(f)
        self.bodies = [b.encode() for b in self.about["bodies"]]
        # not mktemp(): under pytest that would litter the working directory
        parent = tempfile.mkdtemp(prefix="nsqtw-datadir-")
        self.addCleanup(shutil.rmtree, parent, True)
        self.path = os.path.join(parent, "data")
        shutil.copytree(DATADIR, self.path)
        os.chmod(self.path, 0o755)
        for name in os.listdir(self.path):
            os.chmod(os.path.join(self.path, name), stat.S_IRUSR | stat.S_IWUSR)
        self.clock = Clock()

    def open(self, name: str, max_bytes: int = MAX_BYTES_PER_FILE) -> DiskQueue:
        q = DiskQueue(name, self.path, max_bytes, MIN_SIZE, MAX_SIZE, 2500, 2.0, self.clock,
                      SynchronousDiskExecutor())
        self.addCleanup(q.close)
        return q

    def meta(self, name: str) -> bytes:
        with open(os.path.join(self.path, f"{name}.diskqueue.meta.dat"), "rb") as f:
            return f.read()

    def original(self, name: str) -> bytes:
        with open(os.path.join(DATADIR, name), "rb") as f:
            return f.read()

    def test_files_are_what_the_json_lists(self) -> None:
        """The copy holds exactly the files the description lists."""
        self.assertEqual(sorted(os.listdir(self.path)), sorted(self.about["files"]))

    def check_messages(self, records: list[bytes]) -> None:
        self.assertEqual([decode(r)[3] for r in records], self.bodies)
        timestamps = [decode(r)[0] for r in records]
        self.assertEqual(timestamps, sorted(timestamps))
        for ts, attempts, msg_id, _ in map(decode, records):
            self.assertEqual(attempts, 0)
            self.assertGreater(ts, 0)
            int(msg_id, 16)
            self.assertEqual(len(msg_id), 16)

    def test_channels_read_every_message(self) -> None:
        """Both channels hold all 20 messages, in order; depth matches their metadata."""
        for name in ("ref:c", "ref:paused_c"):
            q = self.open(name)
            self.assertEqual(q.depth(), 20)
            records = q.read(100)
            self.check_messages(records)
            self.assertEqual(q.depth(), 0)
            self.assertIsNone(q.health())
            self.successResultOf(q.close())
            self.assertEqual(self.meta(name), b"0\n1,400\n1,400\n")
            self.assertFalse(os.path.exists(os.path.join(self.path, f"{name}.diskqueue.000000.dat")))

    def test_untouched_metadata_is_byte_identical(self) -> None:
        """Opening and closing without reading writes back exactly what Go wrote."""
        for name in ("ref:c", "ref:paused_c", "ref", "paused_t", "paused_t:pc"):
            q = self.open(name)
            self.successResultOf(q.close())
            self.assertEqual(self.meta(name), self.original(f"{name}.diskqueue.meta.dat"), name)
        self.assertEqual(sorted(os.listdir(self.path)), sorted(self.about["files"]))

    def test_partial_reads_write_go_metadata(self) -> None:
        """After partial reads the metadata is what go-diskqueue writes at the same point."""
        cases = [(5, b"15\n0,200\n1,400\n", True),
                 (10, b"10\n1,0\n1,400\n", False),
                 (12, b"8\n1,80\n1,400\n", False)]
        for count, expected, first_segment_kept in cases:
            self.setUp()
            q = self.open("ref:paused_c")
            records = q.read(count)
            self.assertEqual([decode(r)[3] for r in records], self.bodies[:count])
            self.assertEqual(q.depth(), 20 - count)
            self.successResultOf(q.close())
            self.assertEqual(self.meta("ref:paused_c"), expected)
            self.assertEqual(
                os.path.exists(os.path.join(self.path, "ref:paused_c.diskqueue.000000.dat")), first_segment_kept)
            q = self.open("ref:paused_c")
            self.assertEqual(q.depth(), 20 - count)
            self.assertEqual([decode(r)[3] for r in q.read(100)], self.bodies[count:])

    def test_topic_with_bad_segment(self) -> None:
        """The topic (first segment renamed .bad by Go) is fully read; new writes roll on from 1,400."""
        q = self.open("ref")
        self.assertEqual(q.depth(), 0)
        self.assertEqual(q.read(10), [])
        record = self.original("ref:c.diskqueue.000000.dat")[4:40]
        q.put(record)
        self.clock.advance(0)
        self.assertEqual(q.read(10), [record])
        self.assertIsNone(q.health())
        self.successResultOf(q.close())
        self.assertEqual(self.meta("ref"), b"0\n2,40\n2,40\n")
        names = sorted(n for n in os.listdir(self.path) if n.startswith("ref."))
        self.assertEqual(names, ["ref.diskqueue.000000.dat.bad", "ref.diskqueue.000002.dat",
                                 "ref.diskqueue.meta.dat"])
        with open(os.path.join(self.path, "ref.diskqueue.000000.dat.bad"), "rb") as f:
            self.assertEqual(f.read(), self.original("ref.diskqueue.000000.dat.bad"))

    def test_rewriting_the_records_reproduces_go_files(self) -> None:
        """Writing the same 20 records into a fresh queue gives byte-identical segments and metadata."""
        q = self.open("ref:c")
        records = q.read(100)
        fresh = self.open("copy")
        fresh.put_many(records)
        self.successResultOf(fresh.close())
        for suffix in ("000000.dat", "000001.dat", "meta.dat"):
            with open(os.path.join(self.path, f"copy.diskqueue.{suffix}"), "rb") as f:
                self.assertEqual(f.read(), self.original(f"ref:c.diskqueue.{suffix}"), suffix)
