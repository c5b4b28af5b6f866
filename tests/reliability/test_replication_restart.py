"""``--replicas=2`` logs that outlive their process: real processes on loopback (port 0), kill -9.

What is checked (docs/replication.md; :meth:`nsqtw.replica.service.ReplicationService.recover`),
every node with ``--replicas=2 --durable-delivery``:

- **a replica restarted on its disk** (kill -9, then started again on its ports and data directory)
  holds its owner's copies again, read back from its standby logs: when the owner's machine is lost
  right after (before it ever links to the replica again), the replica takes over and a consumer
  through lookupd receives every unfinished message. (A node used to remove its standby logs as it
  started: they were lost.)
- **an owner restarted on its disk** reads its own log back: when its replica is lost after that,
  the next node is sent every unfinished message, those published before the restart included, and
  delivers them all when the owner is lost in turn. (The own log used to start empty: the new
  replica got only what was published after the restart.)
- **messages finished while the replica was away** (kill -9, FINs sent meanwhile, then the replica
  back on its disk): the owner links again, sends its own log (empty) and ``SYNCED``, and the replica
  lets go of what it held: the owner lost, the replica takes over nothing, and no consumer receives
  those messages again.

The cluster, its probes and the consumer through lookupd are in :mod:`tests.reliability.cluster`; the
helpers shared with the other replication faults in :mod:`tests.reliability.test_replication_faults`.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import Daemon, LookupdDaemon
from tests.reliability.cluster import (
    CHANNEL,
    TOPIC,
    Cluster,
    LookupdConsumer,
    address_of,
    consume_through_lookupd,
    depth,
    finish_some,
    held_for,
    in_sync,
    lose,
    post,
    publish_all,
    publish_and_finish,
    replication_log,
    start_nodes,
    stats,
    topic_stats,
    wait_for,
)

TIMEOUT = 3.0
FLAGS = ("--replicas=2", "--durable-delivery", f"--replica-timeout={TIMEOUT:g}s")
PLAIN = ("--replicas=2", f"--replica-timeout={TIMEOUT:g}s")
#: the pre-restart consumer's max_in_flight (finish_some's): the bound on messages delivered twice
#: (FINs of a process's last moments may not reach its journal; here the test lets them settle)
MAX_IN_FLIGHT = 50
#: what a start logs once it read logs back (nsqtw/replica/service.py, ``recover``)
READ_BACK = re.compile(r"REPLICATION: (?P<standbys>\d+) standby log\(s\) and (?P<owns>\d+) own log\(s\) of a"
                       r" previous run read back \((?P<messages>\d+) unfinished messages\)")


# -- helpers ------------------------------------------------------------------------------------------


def make_topic(owner: Daemon) -> dict[str, Any]:
    """``TOPIC`` and ``CHANNEL`` made on the owner; its replica in step (/stats ``replica``)."""
    post(owner.http_address, f"/topic/create?topic={TOPIC}")
    post(owner.http_address, f"/channel/create?topic={TOPIC}&channel={CHANNEL}")
    return dict(wait_for(f"a replica of {TOPIC} in step on the owner", lambda: in_sync(owner), 30))


def restart(node: Daemon, graceful: bool = False) -> re.Match[str]:
    """kill -9 (``graceful``: SIGTERM), started again on its ports and data directory: what it logged
    of the logs it read back."""
    mark = len(node.read_output())
    if graceful:
        assert node.stop() == 0
    else:
        node.kill()
    node.start(tcp=node.tcp_address, http=node.http_address, timeout=40)
    m = READ_BACK.search(node.read_output()[mark:])
    assert m is not None, f"no logs read back at the restart:\n{node.read_output()[mark:][-3000:]}"
    return m


def standby_of(replica: Daemon, owner: Daemon, topic: str = TOPIC) -> list[dict[str, Any]]:
    """The replica's /stats ``standby`` entries of the owner's topic."""
    return [s for s in stats(replica).get("standby") or []
            if s["owner"] == address_of(owner) and s["topic"] == topic]


def clients_of(node: Daemon, topic: str = TOPIC, channel: str = CHANNEL) -> int:
    t = topic_stats(node, topic) or {}
    return sum(len(c.get("clients") or ()) for c in t.get("channels", []) if c["channel_name"] == channel)


def settle() -> None:
    """FINs travel to the replica unanswered, and journal entries reach the disk a tenth of a second
    after them: a moment for both before a kill -9 (a FIN lost there may only be delivered twice)."""
    time.sleep(1.0)


def delivered(consumer: LookupdConsumer, bodies: list[bytes], finished: set[bytes]) -> Counter[bytes]:
    """What the consumer received, checked: only published bodies, each at most twice, and finished
    ones again no more than a consumer's in flight. Returns the counts."""
    time.sleep(1.0)  # a late second copy would show now
    got = Counter(consumer.bodies())
    assert set(got) <= set(bodies), sorted(set(got) - set(bodies))[:5]
    assert max(got.values(), default=0) <= 2, got.most_common(3)
    again = len(finished & set(got))
    twice = sum(1 for n in got.values() if n > 1)
    assert again + twice <= MAX_IN_FLIGHT, (again, twice)
    return got


def took_over(b: Daemon, a: Daemon, timeout: float = TIMEOUT + 15) -> re.Match[str]:
    """B's log line that it took A's ``TOPIC`` over (the messages it handed in: group 1)."""
    return b.wait_output(rf"REPLICATION\({re.escape(address_of(a))}\): took over {TOPIC}: (\d+) messages", timeout)


def back_and_told(a: Daemon, b: Daemon) -> re.Match[str]:
    """A started again on its ports and data directory; B's log line that it told A of what it
    delivered meanwhile (how many: group 1)."""
    a.start(tcp=a.tcp_address, http=a.http_address, timeout=40)
    return b.wait_output(rf"REPLICATION\({re.escape(address_of(a))}\): back on its disk after its takeover here:"
                         r" told it of the (\d+) message\(s\)", 20)


def left_out(a: Daemon, b: Daemon, count: int) -> None:
    """A's consumer connected and A's channel empty: A left out the ``count`` messages B told it of
    (its /stats ``taken_elsewhere``), and B keeps no notes for it."""
    wait_for("A's consumer connected and A's channel empty (every message left out)",
             lambda: clients_of(a) > 0 and depth(a, TOPIC, in_flight=True) == 0, 30)
    assert stats(a)["taken_elsewhere"] == count and stats(b)["notes_waiting"] == 0


def a_pair_with_unfinished(cluster: Cluster, prefix: bytes) -> tuple[LookupdDaemon, Daemon, Daemon, list[bytes],
                                                                     set[bytes]]:
    """A lookupd and two nodes, A's ``TOPIC`` placed on B; 400 bodies published on A and 150 of them
    finished, settled: (lookupd, A, B, the bodies, the unfinished ones)."""
    lookupd = cluster.start_lookupd()
    a, b = start_nodes(cluster, FLAGS, FLAGS)
    assert make_topic(a)["peer"] == address_of(b)
    bodies = [b"%s-%04d" % (prefix, i) for i in range(400)]
    unfinished = publish_and_finish(a, b, TOPIC, bodies, 150)
    settle()
    return lookupd, a, b, bodies, unfinished


# -- the tests ----------------------------------------------------------------------------------------


def test_a_replica_restarted_on_its_disk_still_delivers_a_lost_owners_messages(
        cluster: Cluster, consumers: list[LookupdConsumer], tmp_path: Path) -> None:
    """Two nodes, so A's copies have nowhere to go but B. B is killed -9 and started again on its
    disk: it reads back its standby log of A's topic (the unfinished messages only: the FINs are in
    its journal). A's machine is lost at once, before A links to B again (A sets B aside for
    ``--replica-timeout`` after the link broke): B takes over what it read back, and a consumer
    through lookupd receives every unfinished message."""
    lookupd, a, b, bodies, unfinished = a_pair_with_unfinished(cluster, b"kept")
    finished = set(bodies) - unfinished

    a_mark = len(a.read_output())
    back = restart(b)
    lose(a)
    lost = time.monotonic()
    relinked = f"REPLICATION({address_of(b)}): link up" in a.read_output()[a_mark:]
    held = held_for(b, a, TOPIC)
    assert int(back["standbys"]) >= 1 and int(back["messages"]) == len(unfinished), (back[0], len(unfinished))
    assert held == len(unfinished), (held, len(unfinished), standby_of(b, a))

    took = took_over(b, a)
    consumer = consume_through_lookupd(tmp_path, consumers, lookupd, "consumer",
                                       lambda got: unfinished <= set(got), 30)
    missing = unfinished - set(consumer.bodies())
    assert not missing, (f"{len(missing)} of {len(unfinished)} unfinished messages lost: {sorted(missing)[:3]}; "
                         f"B read back {back[0]!r}\n{consumer.log()}\n{replication_log(b)}")
    got = delivered(consumer, bodies, finished)
    print(f"B read back {back['messages']} messages of {back['standbys']} standby log(s) "
          f"(A relinked to B first: {relinked}); took over {took[1]}; all {len(unfinished)} delivered "
          f"{time.monotonic() - lost:.1f} s after A was lost, {sum(got.values()) - len(got)} twice")


@pytest.mark.parametrize("flags, graceful", [(FLAGS, False), (PLAIN, True)], ids=["durable-kill", "plain-stop"])
def test_an_owner_restarted_on_its_disk_copies_its_earlier_messages_to_a_new_replica(
        cluster: Cluster, consumers: list[LookupdConsumer], tmp_path: Path, flags: tuple[str, ...],
        graceful: bool) -> None:
    """Three nodes. A is started again on its disk after a kill -9 (with ``--durable-delivery``) or a
    stop (without): it reads back its own log of its topic (what is unfinished there). Its replica R
    is lost then: A places the topic on the third node X and sends it every unfinished message of its
    own log, those published before A's restart included; A lost in turn, X delivers them all to a
    consumer through lookupd. (Without ``--durable-delivery`` the own log used to start empty after a
    stop too: X got only what came after it.)"""
    lookupd = cluster.start_lookupd()
    a, b, c = start_nodes(cluster, flags, flags, flags)
    peer = make_topic(a)["peer"]
    replica, third = (b, c) if peer == address_of(b) else (c, b)
    assert peer == address_of(replica), (peer, address_of(b), address_of(c))

    early = [b"early-%04d" % i for i in range(400)]
    finished = set(early) - publish_and_finish(a, replica, TOPIC, early, 150)
    settle()

    mark = len(a.read_output())
    back = restart(a, graceful)
    assert int(back["owns"]) >= 1 and int(back["messages"]) == len(early) - len(finished), back[0]
    # neither peer took anything over: delivery starts once they said so, not after a fixed wait
    wait_for("A's hold ended as its peers said they took nothing over",
             lambda: "- no replica holds notes for this node" in a.read_output()[mark:], 20)
    wait_for("A, restarted, in step on R again",
             lambda: (in_sync(a) or {}).get("peer") == address_of(replica), 40)
    late = [b"late-%04d" % i for i in range(100)]
    publish_all(a, TOPIC, late)
    expected = (set(early) - finished) | set(late)

    lose(replica)
    moved = time.monotonic()
    wait_for("A's topic in step on the third node X",
             lambda: (in_sync(a) or {}).get("peer") == address_of(third), 30)
    wait_for("X holds every unfinished message of A's topic",
             lambda: held_for(third, a, TOPIC) >= len(expected), 20)
    on_third = time.monotonic() - moved

    lose(a)
    lost = time.monotonic()
    consumer = consume_through_lookupd(tmp_path, consumers, lookupd, "consumer",
                                       lambda got: expected <= set(got), 40)
    got = set(consumer.bodies())
    missing = expected - got
    assert not missing, (
        f"lost {len(missing)} of {len(expected)}: {len((set(early) - finished) - got)} published before A's "
        f"restart, {len(set(late) - got)} after; X's standby {stats(third).get('standby')}\n"
        f"{consumer.log()}\n{replication_log(a, third)}")
    counts = delivered(consumer, early + late, finished)
    print(f"A read back {back[0]!r}; on X {on_third:.1f} s after R was lost; all {len(expected)} unfinished "
          f"messages delivered {time.monotonic() - lost:.1f} s after A was lost, "
          f"{sum(counts.values()) - len(counts)} twice")


def test_messages_finished_while_a_replica_was_away_are_let_go(
        cluster: Cluster, consumers: list[LookupdConsumer], tmp_path: Path) -> None:
    """Two nodes. B, A's replica, is killed -9 holding every message of A's topic; meanwhile a
    consumer on A finishes them all (the FINs reach no replica). B starts again on its disk and reads
    them back; A links to B again, its own log empty, and says ``SYNCED``: B lets go of every message
    held from before the link. A lost then, B takes over nothing, and a consumer through lookupd
    receives none of them again."""
    lookupd = cluster.start_lookupd()
    # a longer timeout: B, back, asks A which topics it holds there once A stays silent for it, and A
    # may not have linked to B again yet (it sets a failed replica aside for the timeout too)
    flags = (*FLAGS[:-1], f"--replica-timeout={2 * TIMEOUT:g}s")
    a, b = start_nodes(cluster, flags, flags)
    assert make_topic(a)["peer"] == address_of(b)

    bodies = [b"done-%04d" % i for i in range(300)]
    publish_all(a, TOPIC, bodies)
    wait_for("B holds every message of A's topic", lambda: held_for(b, a, TOPIC) == len(bodies), 20)

    mark = len(b.read_output())
    b.kill()
    finished = finish_some(a, TOPIC, len(bodies))
    assert finished == set(bodies)
    settle()
    b.start(tcp=b.tcp_address, http=b.http_address, timeout=40)
    back = READ_BACK.search(b.read_output()[mark:])
    assert back is not None and int(back["messages"]) == len(bodies), (back, b.read_output()[mark:][-3000:])

    wait_for("A in step on B again", lambda: (in_sync(a) or {}).get("peer") == address_of(b), 30)
    wait_for("B lets go of what A finished while B was away (its standby of A's topic: 0 messages)",
             lambda: (s := standby_of(b, a)) and all(int(x["messages"]) == 0 for x in s), 20)
    let_go = b.wait_output(rf"REPLICATION\({re.escape(address_of(a))}\): (\d+) message\(s\) of {TOPIC} it finished"
                           r" while its link was down let go of", 10)
    assert int(let_go[1]) == len(bodies), (let_go[0], replication_log(b))

    lose(a)
    took = took_over(b, a, 2 * TIMEOUT + 15)
    assert int(took[1]) == 0, (took[0], replication_log(b))
    # a consumer through lookupd, on B's channel for a few seconds: nothing comes
    consumer = consume_through_lookupd(tmp_path, consumers, lookupd, "consumer",
                                       lambda got: bool(got) or clients_of(b) > 0, 20)
    assert clients_of(b) > 0, f"the consumer never reached B\n{consumer.log()}"
    time.sleep(3.0)
    got = consumer.bodies()
    assert not got, (f"{len(got)} messages finished on A delivered again by B: {sorted(set(got))[:3]}\n"
                     f"{replication_log(b)}")
    print(f"B read back {back['messages']} messages; let go of {let_go[1]} on SYNCED; took over {took[1]}; "
          f"nothing delivered again")


def test_an_owner_back_on_its_disk_after_a_takeover_delivers_none_of_what_its_replica_did(
        cluster: Cluster, consumers: list[LookupdConsumer], tmp_path: Path) -> None:
    """Two nodes. A is killed -9 with unfinished messages and stays away past ``--replica-timeout``:
    B takes over and a consumer through lookupd receives them all from B. A is started again on its
    disk, which still holds every one of them: B tells it what it delivered (its notes), A leaves
    those out, and its channel empties with no message delivered twice beyond what was in flight at
    the kill. (Without the notes A delivered every unfinished message a second time.)"""
    lookupd, a, b, bodies, unfinished = a_pair_with_unfinished(cluster, b"back")
    finished = set(bodies) - unfinished

    a.kill()
    took = took_over(b, a)
    assert int(took[1]) == len(unfinished), (took[0], replication_log(b))
    assert stats(b)["notes_waiting"] == len(unfinished)
    consumer = consume_through_lookupd(tmp_path, consumers, lookupd, "consumer",
                                       lambda got: unfinished <= set(got), 30)
    assert unfinished <= set(consumer.bodies()), f"{consumer.log()}\n{replication_log(b)}"

    mark = len(a.read_output())
    told = back_and_told(a, b)
    assert int(told[1]) == len(unfinished), told[0]
    left_out(a, b, len(unfinished))
    assert re.search(r"delivery released [\d.]+s after the start - the replicas' notes came",
                     a.read_output()[mark:]), replication_log(a)
    got = delivered(consumer, bodies, finished)
    from_a = [r for r in consumer.records() if r[2].decode() == a.tcp_address]
    print(f"B took over {took[1]}, told A of {told[1]} once A was back; {len(from_a)} delivered by A after its"
          f" return, {sum(got.values()) - len(got)} twice")


def test_a_replica_whose_disk_is_full_at_its_takeover_still_tells_the_owner_back_on_its_disk(
        cluster: Cluster, consumers: list[LookupdConsumer], tmp_path: Path) -> None:
    """B's disk is full by the time A is lost (a file replaced whole takes half its bytes, then
    ENOSPC: tests/reliability/faults.py): B's takeover delivers A's unfinished messages, its notes
    file cannot be written (logged, no part of it left on the disk), and the notes it keeps in
    memory still reach A once A is back on its disk: A delivers none of them again. (A real full
    tmpfs does not show it: the takeover itself frees the pages of the copies it hands in.)"""
    lookupd = cluster.start_lookupd()
    full = tmp_path / "disk-full"
    cluster.faults_of[2] = {"NSQTW_TEST_REPLACE_FULL_FLAG": str(full)}
    a, b = start_nodes(cluster, FLAGS, FLAGS)
    assert make_topic(a)["peer"] == address_of(b)
    bodies = [b"full-%04d" % i for i in range(400)]
    unfinished = publish_and_finish(a, b, TOPIC, bodies, 150)
    settle()
    full.touch()

    a.kill()
    took = took_over(b, a)
    assert int(took[1]) == len(unfinished), (took[0], replication_log(b))
    b.wait_output(rf"REPLICATION\({re.escape(address_of(a))}\): its notes file could not be written - .*"
                  r"No space left on device", 10)
    assert [p for p in os.listdir(b.data_path) if "taken" in p] == [], sorted(os.listdir(b.data_path))
    assert stats(b)["notes_waiting"] == len(unfinished)
    consumer = consume_through_lookupd(tmp_path, consumers, lookupd, "consumer",
                                       lambda got: unfinished <= set(got), 30)

    told = back_and_told(a, b)
    assert int(told[1]) == len(unfinished), told[0]
    left_out(a, b, len(unfinished))
    got = delivered(consumer, bodies, set(bodies) - unfinished)
    assert unfinished <= set(got)
    print(f"B took over {took[1]} on a full disk, told A of {told[1]} from memory; "
          f"{sum(got.values()) - len(got)} delivered twice")


def test_an_owner_back_with_a_topic_that_had_no_channel_delivers_none_of_what_its_replica_did(
        cluster: Cluster, consumers: list[LookupdConsumer], tmp_path: Path) -> None:
    """As above, for a topic with no channel yet: its messages wait in the topic on A and, copied, on
    B. A is lost; B takes them over into its topic, and a consumer that finds nodes through lookupd
    makes its channel there, receives them all and leaves. A is started again on its disk, still
    holding them, and told by B; a consumer that comes after that makes the channel on A (unless B's
    copy of its own topic made it there first) and receives none of them. (Such a topic used to
    deliver them all again.)"""
    lookupd = cluster.start_lookupd()
    a, b = start_nodes(cluster, FLAGS, FLAGS)
    post(a.http_address, f"/topic/create?topic={TOPIC}")
    assert dict(wait_for("a replica of the topic in step on A", lambda: in_sync(a), 30))["peer"] == address_of(b)
    bodies = [b"topic-%04d" % i for i in range(300)]
    publish_all(a, TOPIC, bodies)
    wait_for("B holds A's 300 messages", lambda: held_for(b, a, TOPIC) == len(bodies), 20)
    settle()

    a.kill()
    took = took_over(b, a)
    assert int(took[1]) == len(bodies), (took[0], replication_log(b))
    first = consume_through_lookupd(tmp_path, consumers, lookupd, "first",
                                    lambda got: set(bodies) <= set(got), 30)
    assert set(bodies) <= set(first.bodies()), f"{first.log()}\n{replication_log(b)}"
    first.stop()

    told = back_and_told(a, b)
    assert int(told[1]) == len(bodies), told[0]
    # still held on A, none delivered: in its topic, or in channel c if B's copy of its own topic t (which
    # the first consumer gave channel c, and which B places on A, its one peer) made c on A already
    held = topic_stats(a, TOPIC) or {}
    assert int(held.get("depth", 0)) + depth(a, TOPIC) == len(bodies), (held, replication_log(a, b))

    def all_left_out(got: list[bytes]) -> bool:
        """A's consumer connected, and A's topic and channel empty (past the start's hold)."""
        return (clients_of(a) > 0 and (topic_stats(a, TOPIC) or {}).get("depth") == 0
                and depth(a, TOPIC, in_flight=True) == 0)

    second = consume_through_lookupd(tmp_path, consumers, lookupd, "second", all_left_out, 30)
    assert all_left_out([]), (topic_stats(a, TOPIC), replication_log(a, b))
    time.sleep(1.0)  # a late delivery would show now
    sent = sum(int(cl["message_count"]) for c in (topic_stats(a, TOPIC) or {}).get("channels", [])
               for cl in c.get("clients") or ())
    again = second.bodies()
    assert (sent, again) == (0, []), (sent, len(again), replication_log(a, b))
    print(f"B took over {took[1]} of a topic without channels, told A of {told[1]}; A sent its consumer {sent}")
