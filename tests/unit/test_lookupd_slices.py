"""nsqlookupd under a REGISTER flood: commands a slice per turn, cheap lookups, a disconnection in slices.

Socket-free (StringTransport, task.Clock; one ``_one_turn`` is one reactor
turn). The live flood with a ``/lookup`` bystander is in
tests/reliability/test_fairness.py.
"""

from __future__ import annotations

import itertools
import random

from twisted.trial.unittest import SynchronousTestCase

from nsqtw.lookupd.db import PeerInfo, Registration, RegistrationDB
from nsqtw.lookupd.lookupd import UNREGISTER_SLICE
from tests.helpers import make_lookupd
from tests.unit.test_http_api import _one_turn
from tests.unit.test_lookupd_protocol import frame, identified

OK = frame(b"OK")


class FloodSliceTests(SynchronousTestCase):
    """A connection's pipelined commands run a slice of time at a time, then wait for the next turn."""

    def test_a_pipelined_flood_is_answered_over_several_turns(self) -> None:
        """2,000 REGISTERs in one read, the clock 1 ms later at each look: a few dozen a turn, all answered in order."""
        lookupd, clock = make_lookupd()
        conn = identified(lookupd)
        ticks = itertools.count()
        conn.proto._now = lambda: next(ticks) * 0.001  # every look at the clock: 1 ms later
        conn.transport.clear()
        conn.proto.dataReceived(b"".join(b"REGISTER t%d c\n" % i for i in range(2000)))
        first = len(conn.transport.value()) // len(OK)
        self.assertGreater(first, 0)
        self.assertLess(first, 100)
        self.assertEqual(conn.transport.producerState, "paused")
        turns = 1
        while clock.getDelayedCalls() and turns < 1000:
            _one_turn(clock)
            turns += 1
        self.assertEqual(conn.transport.value(), OK * 2000)
        self.assertGreater(turns, 20)
        self.assertEqual(conn.transport.producerState, "producing")
        self.assertEqual({k.key for k in lookupd.db.find_registrations("topic", "*", "")},
                         {f"t{i}" for i in range(2000)})

    def test_an_error_part_way_comes_after_the_answers_before_it(self) -> None:
        """REGISTERs then a bad topic: the OKs, then nsqlookupd's error, then the close."""
        lookupd, _ = make_lookupd()
        conn = identified(lookupd)
        conn.proto._now = lambda: 0.0
        out = conn.send(b"REGISTER a\nREGISTER b\nREGISTER b!d\nREGISTER c\n")
        self.assertEqual(out, OK * 2 + frame(b"E_BAD_TOPIC REGISTER topic name 'b!d' is not valid"))
        self.assertTrue(conn.closed)

    def test_a_connection_closed_mid_flood_runs_nothing_more(self) -> None:
        """The connection closes while commands wait for the next turn: they are dropped, never answered."""
        lookupd, clock = make_lookupd()
        conn = identified(lookupd)
        ticks = itertools.count()
        conn.proto._now = lambda: next(ticks) * 0.001
        conn.proto.dataReceived(b"".join(b"REGISTER t%d\n" % i for i in range(500)))
        registered = len(lookupd.db.find_registrations("topic", "*", ""))
        self.assertLess(registered, 500)
        conn.close()
        conn.transport.clear()
        while clock.getDelayedCalls():
            _one_turn(clock)
        self.assertEqual(conn.transport.value(), b"")
        self.assertEqual(len(lookupd.db.find_registrations("topic", "*", "")), registered)


class DisconnectSliceTests(SynchronousTestCase):
    """A node with many registrations leaves them a slice per turn when its connection closes."""

    def test_registrations_are_dropped_over_several_turns(self) -> None:
        lookupd, clock = make_lookupd()
        conn = identified(lookupd)
        conn.proto._now = lambda: 0.0  # no slicing of the commands here
        conn.send(b"".join(b"REGISTER t%d c%d\n" % (i, i) for i in range(1500)))
        peer_id = conn.proto.peer.id
        self.assertEqual(len(lookupd.db.lookup_registrations(peer_id)), 3001)
        conn.close()
        left = [len(lookupd.db.lookup_registrations(peer_id))]
        self.assertEqual(lookupd.db.find_producers("client", "", ""), [])  # gone from /nodes at once
        while clock.getDelayedCalls():
            _one_turn(clock)
            left.append(len(lookupd.db.lookup_registrations(peer_id)))
        self.assertEqual(left, [3001 - UNREGISTER_SLICE * i for i in range(1, 6)] + [0])
        self.assertEqual(lookupd.db.find_producers("topic", "*", ""), [])
        self.assertEqual(len(lookupd.db.find_registrations("channel", "*", "*")), 1500)  # kept, as nsqlookupd


class IndexTests(SynchronousTestCase):
    """The DB's indexes answer as a scan of every registration would, whatever happened before."""

    def test_random_operations(self) -> None:
        rng = random.Random(37)
        db = RegistrationDB(make_lookupd()[1])
        peers = [PeerInfo(id=f"p{i}") for i in range(4)]
        topics = [f"t{i}" for i in range(5)]
        keys = [Registration("topic", t, "") for t in topics] + [
            Registration("channel", t, f"c{j}") for t in topics for j in range(3)] + [Registration("client", "", "")]
        for _ in range(3000):
            op = rng.randrange(4)
            k = rng.choice(keys)
            peer = rng.choice(peers)
            if op == 0:
                db.add_producer(k, peer)
            elif op == 1:
                db.remove_producer(k, peer.id)
            elif op == 2:
                db.remove_registration(k)
            else:
                db.add_registration(k)
            for t in topics:
                scan = [r for r in db.registrations if r.matches("channel", t, "*")]
                self.assertEqual(db.find_registrations("channel", t, "*"), scan)
                self.assertEqual(db.find_registrations("channel", t, "c1"), [r for r in scan if r.subkey == "c1"])
            for p in peers:
                mine = {r for r, producers in db.registrations.items() if p.id in producers}
                self.assertEqual(set(db.lookup_registrations(p.id)), mine)
                self.assertEqual(len(db.lookup_registrations(p.id)), len(mine))


