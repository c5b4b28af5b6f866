"""/stats taken and encoded in slices: the same bytes as in one go, over several reactor turns."""

from __future__ import annotations

import json

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nsqtw._go.json import go_json
from nsqtw.observe.stats import format_text, run_in_slices, run_to_end, snapshot, text_steps
from nsqtw.observe.stats_json import stats_json_steps
from nsqtw.protocol.states import ClientState
from nsqtw.protocol.wire import encode_command
from tests.helpers import connect, make_nsqd, one_turn

HOSTILE = 'a<b>&c\u2028"\\\\b\udcff\x08\x0c\U0001f600'


def busy_node():
    nsqd, clock = make_nsqd(e2e_processing_latency_percentile=(1.0, 0.99, 0.5))
    for t in range(3):
        topic = nsqd.get_topic(f"t{t}")
        for c in range(4):
            topic.get_channel(f"c{c}")
    nsqd.get_topic("empty")
    for i in range(6):
        proto, _ = connect(nsqd, clock)
        body = json.dumps({"client_id": HOSTILE * (i + 1), "hostname": f"h{i}", "user_agent": HOSTILE}).encode()
        proto.dataReceived(encode_command(b"IDENTIFY", body=body))
        proto.dataReceived(f"SUB t{i % 3} c{i % 4}\n".encode())
    producer, _ = connect(nsqd, clock)
    producer.dataReceived(encode_command(b"PUB", b"t0", body=b"x"))
    return nsqd, clock


class SliceEncodingTests(SynchronousTestCase):
    def test_json_in_pieces_is_go_json_of_the_snapshot(self) -> None:
        """/stats?format=json written straight is go_json of the dict snapshot, for every filter."""
        nsqd, _ = busy_node()
        nsqd.get_topic("t1").pause()
        nsqd.get_topic("t2").get_channel("c3").pause()
        for args in ((), ("t0",), ("t0", "c1"), ("t1", "c0"), ("nope",), ("t0", "nope"), ("", "c2")):
            for include_clients in (True, False):
                for include_mem in (True, False):
                    if include_mem:
                        # memory figures move between two calls; the rest of the text must not
                        whole = run_to_end(stats_json_steps(nsqd, *args, include_clients=include_clients))
                        self.assertIn(b'"memory":{"heap_objects":', whole)
                        continue
                    self.assertEqual(run_to_end(stats_json_steps(nsqd, *args, include_clients=include_clients,
                                                                 include_mem=False)),
                                     go_json(snapshot(nsqd, *args, include_clients=include_clients,
                                                      include_mem=False)), (args, include_clients))

    def test_text_in_pieces_is_the_whole(self) -> None:
        nsqd, clock = busy_node()
        snap = snapshot(nsqd)
        self.assertIn("a<b>&c\u2028", format_text(snap, clock.seconds()))
        self.assertEqual(run_to_end(text_steps(snap, clock.seconds())), format_text(snap, clock.seconds()))

    def test_slices_spread_over_turns(self) -> None:
        """With a tiny budget each step is its own turn: a turn per channel; the result is the same."""
        nsqd, _ = busy_node()
        clock = Clock()
        ticks = iter(range(10**6))
        d = run_in_slices(stats_json_steps(nsqd, include_mem=False), clock, budget=0.5, timer=lambda: next(ticks))
        turns = 0
        while not d.called:
            one_turn(clock)
            turns += 1
        self.assertGreaterEqual(turns, 12)
        self.assertEqual(self.successResultOf(d), go_json(snapshot(nsqd, include_mem=False)))


    def test_producers_are_looked_for_a_few_thousand_clients_per_step(self) -> None:
        """Finding the producers among tens of thousands of clients is spread over steps."""
        from types import SimpleNamespace

        from nsqtw.observe import stats as stats_module
        clients = {i: SimpleNamespace(pub_counts={"t": 1} if i % 1000 == 0 else {}) for i in range(5000)}
        steps = stats_module.producer_clients(SimpleNamespace(clients=clients))
        yields = 0
        while True:
            try:
                next(steps)
            except StopIteration as done:
                chosen = done.value
                break
            yields += 1
        self.assertEqual(yields, -(-5000 // stats_module._CLIENTS_PER_STEP))
        self.assertEqual(chosen, [clients[i] for i in range(0, 5000, 1000)])

    def test_one_channel_of_many_consumers_is_written_a_thousand_or_so_clients_a_step(self) -> None:
        """A channel of 3,000 consumers is not one step: its clients' texts are taken in bounded
        steps, and the answer is still Go's JSON of the snapshot."""
        from nsqtw.observe import stats as stats_module
        from nsqtw.observe import stats_json as module

        nsqd, clock = make_nsqd()
        for _ in range(3000):
            proto, _ = connect(nsqd, clock)
            proto.dataReceived(b"SUB t c\n")
        steps = stats_json_steps(nsqd, include_mem=False)
        yields = 0
        while True:
            try:
                next(steps)
            except StopIteration as done:
                body = done.value
                break
            yields += 1
        # the channel's clients' steps, one for the channel, then the producers' search
        producer_steps = -(-3000 // stats_module._CLIENTS_PER_STEP)
        self.assertEqual(yields, 3000 // module._TEXTS_PER_STEP + 1 + producer_steps)
        self.assertEqual(body, go_json(snapshot(nsqd, include_mem=False)))

    def test_template_is_the_fields_encoded_with_texts_in_their_slots(self) -> None:
        """A template fills JSON texts where the field function put its arguments, and refuses a
        function that does not show each argument once as a value."""
        from nsqtw._go.json import go_dumps
        from nsqtw.observe.stats_json import _Template

        def fields(a: object, b: object) -> dict[str, object]:
            return {"a{}": a, "b": [b, "}"]}

        self.assertEqual(_Template(fields, 2).fill('"x"', "[1]"), go_dumps(fields("x", [1])))
        with self.assertRaises(ValueError):
            _Template(lambda a, b: {"a": a, "b": a}, 2)


class ClientStatsTests(SynchronousTestCase):
    def test_go_stats_is_the_generic_layout(self) -> None:
        """V2Protocol.go_stats (one dict) equals the stats() copy reordered by Go's rules, for
        subscribers, producers, topic filters and an authenticated client."""
        import types

        from nsqtw.observe import stats as stats_module
        from nsqtw.protocol.auth import Authorization, AuthState

        nsqd, clock = busy_node()
        clients = list(nsqd.clients.values())
        authed = clients[0]
        authed.auth.state = AuthState(60, "alice", "https://id/alice", [Authorization(".*", [".*"], ["publish"])],
                                      clock.seconds() + 60)
        authed.pub_counts["t1"] = 3
        for client in clients:
            plain = types.SimpleNamespace(stats=client.stats, pub_counts=client.pub_counts)
            for topic_filter in ("", "t0", "t1"):
                self.assertEqual(list(client.go_stats(topic_filter).items()),
                                 list(stats_module._client_stats(plain, topic_filter).items()))


def _counting_builds(test: SynchronousTestCase) -> list[object]:
    """Patch ClientStats._make_stats_pieces to record each client whose text is made from scratch."""
    from nsqtw.protocol.client_stats import ClientStats

    built: list[object] = []
    make = ClientStats._make_stats_pieces

    def counting(self: ClientStats) -> tuple[str, str, str, str, str, str, str]:
        built.append(self)
        return make(self)

    test.patch(ClientStats, "_make_stats_pieces", counting)
    return built


class FirstStatsTests(SynchronousTestCase):
    """A client's /stats text is made when it subscribes or its identity changes, not by the
    first /stats after it (at 15,000 consumers that first /stats took several times the next)."""

    def test_text_is_made_at_sub_not_by_the_first_stats(self) -> None:
        nsqd, clock = make_nsqd()
        built = _counting_builds(self)
        protos = []
        for i in range(5):
            proto, _ = connect(nsqd, clock)
            body = json.dumps({"client_id": f"c{i}", "hostname": HOSTILE, "user_agent": "ua"}).encode()
            proto.dataReceived(encode_command(b"IDENTIFY", body=body))
            self.assertEqual(built, protos)  # not at IDENTIFY: a client not subscribed is not shown
            proto.dataReceived(b"SUB t c\nRDY 3\n")
            protos.append(proto)
        self.assertEqual(built, protos)  # once each, at SUB
        del built[:]
        texts = [proto.stats_json() for proto in protos]
        body = run_to_end(stats_json_steps(nsqd, include_mem=False))
        self.assertEqual(built, [])
        self.assertEqual(body, go_json(snapshot(nsqd, include_mem=False)))
        self.assertIn('"state":3,', texts[0])
        for proto, text in zip(protos, texts, strict=True):
            self.assertIs(proto.stats_json(), text)  # made before the first /stats, in its final state

    def test_a_shown_field_set_after_sub_remakes_the_text_then(self) -> None:
        from nsqtw._go.json import go_dumps

        nsqd, clock = make_nsqd()
        proto, _ = connect(nsqd, clock)
        proto.dataReceived(b"SUB t c\n")
        before = proto.stats_json()
        built = _counting_builds(self)
        proto.hostname = "renamed.example"
        self.assertEqual(built, [proto])  # at once, not at the next /stats
        del built[:]
        text = proto.stats_json()
        self.assertEqual(built, [])
        self.assertNotEqual(text, before)
        self.assertIn('"hostname":"renamed.example"', text)
        self.assertEqual(text, go_dumps(proto.go_stats()))
        self.assertEqual(run_to_end(stats_json_steps(nsqd, include_mem=False)),
                         go_json(snapshot(nsqd, include_mem=False)))

    def test_adopt_of_a_shown_client_makes_its_text_once(self) -> None:
        """A worker's client in the core: the identity its worker sends again (INFO) remakes the
        text once, not once per field."""
        from nsqtw._go.json import go_dumps
        from nsqtw.workers.peer import RemoteClient

        nsqd, clock = make_nsqd()
        proto, _ = connect(nsqd, clock)
        identity = proto.identity()
        remote = RemoteClient(None, 1, 99, identity)  # type: ignore[arg-type]
        built = _counting_builds(self)
        nsqd.subscribe("t", "c", remote)
        remote.state = ClientState.SUBSCRIBED
        remote.subscribed()  # as the worker's peer does once the SUB succeeded
        self.assertEqual(built, [remote])
        del built[:]
        remote.adopt(dict(identity, hostname="moved.example", user_agent="ua/2"))
        self.assertEqual(built, [remote])
        self.assertEqual(remote.stats_json(), go_dumps(remote.go_stats()))
        self.assertIn('"user_agent":"ua/2"', remote.stats_json())

    def test_an_idle_clients_text_is_kept_and_a_counter_change_remade(self) -> None:
        """Between two /stats an idle consumer's text is the same object; a moved counter, a new
        sample_rate or AUTH answer gives the new text (the snapshot's JSON)."""
        from nsqtw._go.json import go_dumps
        from nsqtw.protocol.auth import AuthState

        nsqd, clock = make_nsqd()
        proto, _ = connect(nsqd, clock)
        proto.dataReceived(b"SUB t c\nRDY 5\n")
        text = proto.stats_json()
        self.assertIs(proto.stats_json(), text)
        for name, value in (("ready_count", 7), ("in_flight_count", 2), ("message_count", 1000),
                            ("finish_count", 999), ("requeue_count", 1), ("sample_rate", 50)):
            setattr(proto, name, value)
            again = proto.stats_json()
            self.assertEqual(again, go_dumps(proto.go_stats()), name)
            self.assertNotEqual(again, text, name)
            text = again
        proto.auth.state = AuthState(60, "alice", "https://id/alice", [], clock.seconds() + 60)
        self.assertIn('"auth_identity":"alice"', proto.stats_json())
        self.assertEqual(proto.stats_json(), go_dumps(proto.go_stats()))


class BodyTests(SynchronousTestCase):
    def test_answer_is_written_in_pieces_of_tens_of_kib(self) -> None:
        """No piece of a big answer is much over _PIECE_CHARS (a 6 MB answer made whole at each
        level was a 6 MB block of fresh pages each time), and the pieces join to the texts."""
        from nsqtw.observe.stats_json import _PIECE_CHARS, _Body

        body = _Body()
        texts = [f"{i:05d}" * 80 for i in range(3000)]  # 400 characters each, as a consumer's
        body.write(["a", "b"])
        body.write(texts[:1000])
        body.write(["c"])
        body.write(texts[1000:])
        pieces = body.end()
        self.assertEqual(b"".join(pieces), ("ab" + "".join(texts[:1000]) + "c" + "".join(texts[1000:])).encode())
        self.assertGreater(len(pieces), 30)
        self.assertLessEqual(max(map(len, pieces)), _PIECE_CHARS + 400)
