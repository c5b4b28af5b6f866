"""nsqd.dat kept in step with the node: coalesced writes, encoding off the reactor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from nsqtw import NSQD_VERSION
from nsqtw.storage.metadata import ENCODE_SLICE, MetadataStore, encode, encode_state, snapshot, write_state
from tests.helpers import make_nsqd

#: Go nsqd v1.3.0's answers and the data dir it wrote (tests/reference/README.md)
REFERENCE = Path(__file__).parent.parent / "reference"


class MetadataStoreTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.nsqd, self.clock = make_nsqd()
        self.jobs: list[tuple[object, tuple, Deferred]] = []

        def submit(fn, *args):
            d: Deferred = Deferred()
            self.jobs.append((fn, args, d))
            return d

        self.store = MetadataStore(self.nsqd, "/nonexistent", self.clock, submit)
        self.nsqd.metadata = self.store

    def test_a_storm_of_creates_costs_a_few_writes_of_the_latest_state(self) -> None:
        """10,000 topics created over many turns while writes are slow: at most one write in flight,
        one more after it, and that one holds every topic."""
        for i in range(100):
            for j in range(100):
                self.nsqd.get_topic(f"t{i}_{j}")
            self.clock.advance(0)
            self.assertLessEqual(len([j for j in self.jobs if not j[2].called]), 1)
        self.assertEqual(len(self.jobs), 1)  # the first write is still on the disk thread
        fn, args, d = self.jobs[0]
        self.assertIs(fn, write_state)
        d.callback(None)
        self.clock.advance(0)
        self.assertEqual(len(self.jobs), 2)  # one write for everything since
        _, (path, state), last = self.jobs[1]
        self.assertEqual(len(state), 10_000)
        last.callback(None)
        self.clock.advance(0)
        self.assertEqual(len(self.jobs), 2)
        self.assertEqual(self.store.writes, 2)

    def test_the_next_write_waits_as_long_as_the_last_took(self) -> None:
        """Changes during a write that took 0.3 s are written 0.3 s after it, not at once: every
        write encodes the whole node on a disk thread that holds the GIL, so back-to-back writes
        made creating 10,000 topics one request at a time quadratic. The pause is capped at 1 s."""
        self.nsqd.get_topic("a")
        self.clock.advance(0)
        self.assertEqual(len(self.jobs), 1)
        self.clock.advance(0.3)  # the write takes 0.3 s, and a change comes meanwhile
        self.nsqd.get_topic("b")
        self.jobs[0][2].callback(None)
        self.clock.advance(0.29)
        self.assertEqual(len(self.jobs), 1)
        self.clock.advance(0.02)
        self.assertEqual(len(self.jobs), 2)
        self.assertEqual(len(self.jobs[1][1][1]), 2)  # both topics
        self.clock.advance(5.0)  # a write that takes 5 s: the next waits 1 s
        self.nsqd.get_topic("c")
        self.jobs[1][2].callback(None)
        self.clock.advance(0.99)
        self.assertEqual(len(self.jobs), 2)
        self.clock.advance(0.02)
        self.assertEqual(len(self.jobs), 3)

    def test_encoding_is_what_it_was(self) -> None:
        """The snapshot encodes to the same sorted document as before (encoding moved, not changed)."""
        for name in ("b", "a", "c#ephemeral"):
            topic = self.nsqd.get_topic(name)
            topic.get_channel("z")
            topic.get_channel("y")
        self.nsqd.topics["b"].pause()
        doc = json.loads(encode_state(snapshot(self.nsqd)))
        self.assertEqual([t["name"] for t in doc["topics"]], ["a", "b"])
        self.assertEqual([c["name"] for c in doc["topics"][0]["channels"]], ["y", "z"])
        self.assertEqual(doc["topics"][1]["paused"], True)
        self.assertEqual(encode(self.nsqd), encode_state(snapshot(self.nsqd)))

    def test_encoding_is_json_dumps_byte_for_byte(self) -> None:
        """The document built a channel at a time is json.dumps' (compact) of the same document,
        for no topics, topics without channels, paused ones, names JSON escapes, and more
        channels than one slice; and Go nsqd's own nsqd.dat of the same state."""
        def dumped(state: Any) -> bytes:
            topics = [{"name": n, "paused": p, "channels": [{"name": c, "paused": q} for c, q in sorted(ch)]}
                      for n, p, ch in sorted(state)]
            return json.dumps({"topics": topics, "version": NSQD_VERSION}, separators=(",", ":")).encode()
        many = [(f"c{i}", i % 3 == 0) for i in range(ENCODE_SLICE * 2 + 7)]
        for state in ([], [("t", False, [])], [("b", True, [("z", True), ("y", False)]), ("a", False, many)],
                      [("q\"\u00e9\n", False, [("\u2603", True)])]):
            self.assertEqual(encode_state(state), dumped(state), state[:1])
        # Go writes its topics in map order, nsqtw sorted; otherwise the same bytes
        go = (REFERENCE / "nsqd-1.3.0-datadir" / "nsqd.dat").read_bytes()
        doc = json.loads(go)
        self.assertEqual(json.dumps(doc, separators=(",", ":")).encode(), go)
        doc["topics"].sort(key=lambda t: t["name"])
        doc["version"] = NSQD_VERSION
        state = [("ref", False, [("paused_c", True), ("c", False)]), ("paused_t", True, [("pc", False)])]
        self.assertEqual(encode_state(state), json.dumps(doc, separators=(",", ":")).encode())

    def test_encoding_lets_the_reactor_in_every_slice(self) -> None:
        """The encoding thread releases the GIL (time.sleep(0)) after every ENCODE_SLICE channels."""
        from nsqtw.storage import metadata

        sleeps: list[float] = []
        self.patch(metadata.time, "sleep", sleeps.append)
        encode_state([("a", False, [(f"c{i}", False) for i in range(ENCODE_SLICE + 1)]),
                      ("b", False, [(f"c{i}", False) for i in range(ENCODE_SLICE)])])
        self.assertEqual(sleeps, [0, 0])

    def test_failure_reaches_health_and_the_next_change_retries(self) -> None:
        self.nsqd.get_topic("x")
        self.clock.advance(0)
        self.jobs[0][2].errback(OSError(28, "No space left on device"))
        self.assertIn("failed to persist metadata", self.nsqd.health())
        self.nsqd.get_topic("y")
        self.clock.advance(0)
        self.jobs[1][2].callback(None)
        self.assertEqual(self.nsqd.health(), "OK")

    def test_failed_saves_keep_health_bad_until_a_retry_succeeds(self) -> None:
        """nsqd.dat that cannot be saved keeps the node unhealthy ("NOK - failed to persist metadata
        - ...") through every failed retry, and healthy again once a retry succeeds, with no
        other change to the node."""
        from nsqtw.storage.metadata import RETRY_INTERVAL

        self.nsqd.get_topic("x")
        self.clock.advance(0)
        for attempt in range(3):
            self.jobs[-1][2].errback(OSError(30, "Read-only file system"))
            self.assertTrue(self.nsqd.health().startswith("NOK - failed to persist metadata - "),
                            self.nsqd.health())
            self.clock.advance(RETRY_INTERVAL)
            self.assertEqual(len(self.jobs), attempt + 2)  # retried without a change
        self.jobs[-1][2].callback(None)
        self.assertEqual(self.nsqd.health(), "OK")

    def test_persist_fails_as_the_write_did(self) -> None:
        """persist()'s Deferred fails with the write's error (start-up stops on it), after the
        failure reached health."""
        d = self.store.persist()
        self.jobs[0][2].errback(OSError(30, "Read-only file system"))
        self.assertIn("Read-only file system", str(self.failureResultOf(d, OSError).value))
        self.assertFalse(self.nsqd.is_healthy())
