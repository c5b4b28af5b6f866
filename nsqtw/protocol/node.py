"""What a V2 connection needs of the node it serves: the seam between the protocol and the core.

In one process the node is :class:`nsqtw.core.nsqd.NSQD` and a subscription
is its :class:`nsqtw.core.channel.Channel`. With ``--workers`` a connection
lives in a worker process and the core in another: there both are proxies
over the link between them (:mod:`nsqtw.workers.remote`), and what a
subscription cannot answer at once it answers later through
:meth:`V2Protocol.report_failed` and :meth:`V2Protocol.deliver_frames`.
These are structural types (``typing.Protocol``), so the core needs to know
nothing of them.
"""

from __future__ import annotations

from typing import Any, Protocol

from nsqtw.core.admission import Publisher

#: the channel a connection subscribed to, as its commands use it (defined with them, in the core)
from nsqtw.core.commands import Subscriber, Subscription

__all__ = ["Node", "Subscription"]


class Node(Subscriber, Publisher, Protocol):
    """The node a connection serves: options, TLS and AUTH, clients; subscribing and publishing
    as the core's commands (:mod:`nsqtw.core.commands`) and admission need them."""

    options: Any
    tls: Any
    auth: Any

    def new_client_id(self) -> int: ...

    def add_client(self, client_id: int, client: Any) -> None: ...

    def remove_client(self, client_id: int) -> None: ...
