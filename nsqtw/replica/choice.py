"""Which node holds a topic's copies: the nodes lookupd knows, those that replicate, one per topic.

Every :data:`POLL_INTERVAL` (every second while no candidate is known) a
node reads ``GET /nodes`` from each nsqlookupd it registers with and asks
each node it has not asked yet ``GET /replication``: Go nsqd and nsqtw with
``--replicas=1`` answer 404 and are never chosen. Among the candidates (not
this node: not its address, not its incarnation) a topic's replica is the
highest rendezvous score ``hash(owner, topic, candidate)``: the same answer
on every poll, spread evenly, and a candidate that leaves moves only its own
topics. A candidate whose link failed is set aside for a while
(:meth:`Choice.set_aside`), so the next score down is taken.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

from twisted.internet.defer import Deferred, DeferredList, ensureDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall

from nsqtw.log import Logger

__all__ = ["Candidate", "Choice", "POLL_INTERVAL", "http_get", "rendezvous"]

#: seconds between reads of lookupd's /nodes once a candidate is known
POLL_INTERVAL: Final = 15.0
#: seconds an HTTP ask of a lookupd or a node may take
ASK_TIMEOUT: Final = 2.0


@dataclass(frozen=True)
class Candidate:
    """A node that answered ``GET /replication``: where to reach it and who it is."""

    address: str  # host:http_port, as lookupd gives it: the node's name in rendezvous scores
    host: str
    http_port: int
    incarnation: str


def rendezvous(owner: str, topic: str, candidate: str) -> int:
    """The score of ``candidate`` for ``owner``'s ``topic`` (highest wins)."""
    digest = hashlib.blake2b(f"{owner}\0{topic}\0{candidate}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


_CLIENTS: dict[int, Any] = {}


async def http_get(reactor: Any, url: str, timeout: float = ASK_TIMEOUT) -> tuple[int, bytes]:
    """One GET: its status and body (treq, imported here: a node without replication never loads
    twisted.web.client), through a pool that logs nothing per connection."""
    client = _CLIENTS.get(id(reactor))
    if client is None:
        from treq.client import HTTPClient
        from twisted.web.client import Agent, HTTPConnectionPool

        from nsqtw.net.twisted_privates import quiet_pool

        pool = HTTPConnectionPool(reactor, persistent=False)
        quiet_pool(pool)
        client = _CLIENTS[id(reactor)] = HTTPClient(Agent(reactor, connectTimeout=timeout, pool=pool))
    d = client.get(url)
    d.addCallback(lambda response: response.content().addCallback(lambda body: (int(response.code), bytes(body))))
    d.addTimeout(timeout, reactor)
    result: tuple[int, bytes] = await d
    return result


class Choice:
    """The candidates known now, kept up to date from lookupd."""

    log = Logger()

    def __init__(self, reactor: Any, own_address: Callable[[], str], own_incarnation: str,
                 lookupd_addresses: Callable[[], list[str]],
                 get: Callable[[Any, str], Deferred[tuple[int, bytes]]] | None = None) -> None:
        self.reactor = reactor
        self.clock: IReactorTime = reactor
        self.own_address = own_address
        self.own_incarnation = own_incarnation
        self.lookupd_addresses = lookupd_addresses
        self._get = get or (lambda r, url: ensureDeferred(http_get(r, url)))
        #: address -> candidate, for nodes in lookupd's last answer that replicate
        self.candidates: dict[str, Candidate] = {}
        #: address -> False for nodes that answered they do not replicate (not asked again)
        self._not_replicating: set[str] = set()
        #: address -> until when it is not chosen (its link failed)
        self._aside: dict[str, float] = {}
        self._loop = LoopingCall(self.poll)
        self._loop.clock = reactor
        self._polling: Deferred[Any] | None = None
        self._poll_later: Any = None
        #: told when the candidates changed
        self.changed: Callable[[], None] = lambda: None
        #: told after each read of lookupd that one answered: the ``/replication`` answers of the
        #: nodes that replicate asked in it (every node, at the first), by address, and the nodes
        #: that did not answer (a start's hold ends by them)
        self.answered: Callable[[dict[str, dict[str, Any]], list[str]], None] = lambda answers, failed: None

    def start(self) -> None:
        self._loop.start(POLL_INTERVAL, now=True)

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()
        if self._poll_later is not None and self._poll_later.active():
            self._poll_later.cancel()

    def best(self, owner: str, topic: str) -> Candidate | None:
        now = self.clock.seconds()
        best: Candidate | None = None
        score = -1
        for address, candidate in self.candidates.items():
            until = self._aside.get(address)
            if until is not None:
                if until > now:
                    continue
                del self._aside[address]
            s = rendezvous(owner, topic, address)
            if s > score:
                best, score = candidate, s
        return best

    def set_aside(self, address: str, seconds: float) -> None:
        """Choose ``address`` for nothing during ``seconds`` (its link failed), and look again soon."""
        self._aside[address] = self.clock.seconds() + seconds
        self.poll_soon()

    def poll_soon(self, delay: float = 1.0) -> None:
        if self._poll_later is None or not self._poll_later.active():
            self._poll_later = self.clock.callLater(delay, self.poll)

    def poll(self) -> Deferred[Any] | None:
        if self._polling is not None:
            return None
        self._polling = ensureDeferred(self._poll())
        self._polling.addErrback(lambda f: self.log.failure("REPLICATION: reading lookupd failed", f))
        self._polling.addBoth(self._polled)
        return self._polling

    def _polled(self, _: object) -> None:
        self._polling = None
        if not self.candidates:
            self.poll_soon()

    async def _poll(self) -> None:
        seen: dict[str, tuple[str, int]] = {}
        answered = False
        for lookupd in self.lookupd_addresses():
            try:
                code, body = await self._get(self.reactor, f"http://{lookupd}/nodes")
                nodes = json.loads(body).get("producers") if code == 200 else None
            except Exception as e:  # noqa: BLE001 - a lookupd down or wrong: the others, or the last answer
                self.log.debug("REPLICATION: lookupd {lookupd} /nodes - {error}", lookupd=lookupd, error=e)
                continue
            if not isinstance(nodes, list):
                continue
            answered = True
            for node in nodes:
                if not isinstance(node, dict):
                    continue
                host = str(node.get("broadcast_address") or "")
                port = node.get("http_port")
                if host and isinstance(port, int):
                    seen[f"{host}:{port}"] = (host, port)
        if not answered:
            return  # keep what the last answer said (lookupd down changes nothing here)
        own = self.own_address()
        before = set(self.candidates)
        for address in list(self.candidates):
            if address not in seen:
                del self.candidates[address]
        self._not_replicating &= set(seen)
        asks = [(address, host, port) for address, (host, port) in seen.items()
                if address != own and address not in self.candidates and address not in self._not_replicating]
        results = await DeferredList([self._get(self.reactor, f"http://{address}/replication?owner={quote(own)}")
                                      for address, _, _ in asks], consumeErrors=True)
        answers: dict[str, dict[str, Any]] = {}
        failed: list[str] = []
        for (address, host, port), (ok, result) in zip(asks, results, strict=True):
            if not ok:
                failed.append(address)
                continue  # down now: asked again at the next poll
            code, body = result
            if code != 200:
                self._not_replicating.add(address)
                continue
            try:
                info = json.loads(body)
                incarnation = str(info["incarnation"])
            except (ValueError, KeyError, TypeError):
                self._not_replicating.add(address)
                continue
            if incarnation == self.own_incarnation:
                self._not_replicating.add(address)  # this node, under another name
                continue
            self.candidates[address] = Candidate(address, host, port, incarnation)
            answers[address] = info
        self.answered(answers, failed)
        if set(self.candidates) != before:
            self.log.info("REPLICATION: candidates {candidates}", candidates=sorted(self.candidates) or "none")
            self.changed()
