"""What a replica knows of one owner, and the incarnation that tells a data directory's nodes apart."""

from __future__ import annotations

import os
import secrets
from typing import Final

from nsqtw.replica.link import Link
from nsqtw.replica.standby import Standby
from nsqtw.storage.atomic import atomic_write

__all__ = ["INCARNATION_FILE", "OwnerState", "incarnation_of"]

#: the file in the data directory naming this directory's incarnation (made with it)
INCARNATION_FILE: Final = "nsqtw.incarnation"


def incarnation_of(data_path: str) -> str:
    """The data directory's incarnation: 64 random bits made with it, so a node that comes back
    without its data is told apart from one that comes back with it."""
    path = os.path.join(data_path, INCARNATION_FILE)
    try:
        with open(path, encoding="ascii") as f:
            value = f.read().strip()
        if len(value) == 16:
            return value
    except FileNotFoundError:
        pass
    value = secrets.token_hex(8)
    atomic_write(path, (value + "\n").encode("ascii"))
    return value


class OwnerState:
    """What the replica knows of one owner: its link, incarnation and standbys."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.link: Link | None = None
        self.incarnation = ""
        self.host = ""
        self.http_port = 0
        self.standbys: dict[str, Standby] = {}
        #: per topic, the standbys SNAP records filled (messages of before this node was its replica)
        self.parts: dict[str, list[Standby]] = {}
        self.silent_since: float | None = None
        self.probing = False
        #: while its link is down: when its /replication was last asked for its incarnation, and whether
        #: an answer is awaited
        self.asked = 0.0
        self.asking = False
        #: when the owner's process started, as its last HELLO said, and whether it stopped with a BYE
        self.started = 0.0
        self.said_bye = False
        #: its link now: when it came up, the topics it brought a record of, and whether the owner
        #: was asked which of its topics it places here (:meth:`ReplicationService._still_wanted`)
        self.linked_at = 0.0
        self.touched: set[str] = set()
        self.placement_asked = False
        #: after a takeover: TAKEN records of the owner's IDs handed in here, for its incarnation
        #: ``notes_for`` if it comes back on its disk (:mod:`nsqtw.replica.notice`); how many IDs
        #: they name, since when they are kept; whether they are being sent now, and when that was last tried
        self.notes: list[bytes] = []
        self.notes_for = ""
        self.noted = 0
        self.noted_since = 0.0
        self.noting = False
        self.noted_at = 0.0

    def held(self, topic: str) -> list[Standby]:
        """Every standby of the owner's topic: the one its PUBs go to, and those SNAPs made."""
        main = self.standbys.get(topic)
        return ([main] if main is not None else []) + self.parts.get(topic, [])

    def all_held(self) -> list[Standby]:
        """Every standby held for the owner, of every topic."""
        return [*self.standbys.values(), *(p for parts in self.parts.values() for p in parts)]
