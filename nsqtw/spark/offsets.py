"""Offsets of the streaming source, and the sets of message ids they carry.

An offset is ``{"seq": n, "ids": {address: "<encoded ids>"}}``: ``seq``
numbers batches' messages in the consumer's process and continues from
whatever offset Spark shows it first (a restart resumes from the
checkpoint); ``ids`` lists the messages of the batch that ends at that
offset, per nsqd (:func:`~nsqtw.spark.blocks.encode_ids`). ``unfinished``
and ``missed`` (:class:`Offset`) carry what a later process must know of
the batches before it. How the consumer uses them is
:mod:`nsqtw.spark.consumer`'s story; the id sets here are numpy arrays per
nsqd address.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nsqtw.spark.blocks import Block, decode_ids, encode_ids

__all__ = ["Offset", "ids_of", "minus", "union"]


@dataclass(frozen=True)
class Offset:
    """A position in this source: the last sequence number and the ids of its batch.

    ``unfinished`` lists, per nsqd, messages of earlier batches that Spark
    committed but whose FIN could not go out (their connection was lost), so
    that a process started from this offset still FINs them on sight when
    nsqd redelivers them. ``missed`` lists messages of the batch before this
    one that its replay did not get back from nsqd in time: that batch was
    committed without them, so they are not to be dropped as committed. Both
    are written only when there are some.
    """

    seq: int
    ids: dict[str, str] = field(default_factory=dict)
    unfinished: dict[str, str] = field(default_factory=dict)
    missed: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any) -> Offset:
        try:
            seq = int(data["seq"])
            ids, unfinished, missed = ({str(k): str(v) for k, v in (data.get(name) or {}).items()}
                                       for name in ("ids", "unfinished", "missed"))
        except (TypeError, KeyError, ValueError, AttributeError):
            raise ValueError(f"not an nsq offset: {data!r}") from None
        return cls(seq, ids, unfinished, missed)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"seq": self.seq, "ids": self.ids}
        if self.unfinished:
            out["unfinished"] = self.unfinished
        if self.missed:
            out["missed"] = self.missed
        return out

    def id_arrays(self) -> dict[str, np.ndarray]:
        """The batch's message ids per nsqd address."""
        return {address: decode_ids(text) for address, text in self.ids.items()}

    def unfinished_arrays(self) -> dict[str, np.ndarray]:
        """Committed messages of earlier batches never FINed, per nsqd address."""
        return {address: decode_ids(text) for address, text in self.unfinished.items()}

    def missed_arrays(self) -> dict[str, np.ndarray]:
        """Messages of the previous batch that were committed without being written, per nsqd address."""
        return {address: decode_ids(text) for address, text in self.missed.items()}

    def count(self) -> int:
        return sum(len(a) for a in self.id_arrays().values())


def ids_of(batch: list[Block]) -> dict[str, str]:
    """The ids of a batch's messages per nsqd address, encoded as an offset lists them."""
    ids: dict[str, list[np.ndarray]] = {}
    for b in batch:
        ids.setdefault(b.conn.address, []).append(b.ids)
    return {address: encode_ids(np.concatenate(v)) for address, v in sorted(ids.items())}


def union(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Ids per nsqd address in ``a`` or ``b``."""
    out = dict(a)
    for address, ids in b.items():
        old = out.get(address)
        out[address] = ids if old is None else np.union1d(old, ids)
    return out


def minus(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Ids per nsqd address in ``a`` and not in ``b``."""
    return {address: ids if address not in b else np.setdiff1d(ids, b[address]) for address, ids in a.items()}
