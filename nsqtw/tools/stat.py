"""``nsqtw stat``: nsq_stat — poll one channel's stats across its nsqd nodes and print a table.

Every ``--interval`` it asks each nsqd (given directly, or found through
nsqlookupd) for the topic's ``/stats``, sums the channel over them and
prints a row in nsq_stat's layout: ingress and egress rates since the
previous poll, depth (total, memory, disk, in flight, deferred), requeued,
timed out, messages and clients. The header repeats every 25 rows. The
first poll only sets the baseline, as nsq_stat's; ``--count=N`` prints N
rows and exits.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from twisted.internet import task
from twisted.internet.defer import gatherResults

from nsqtw import __version__
from nsqtw._go.flags import ACTIVE, FlagSet, make_flag
from nsqtw.client import get_json
from nsqtw.client.lookup import join_host_port, lookup_url
from nsqtw.tools.common import ToolError, parse_flags, require, run_tool


@dataclass(frozen=True)
class StatOptions:
    channel: str = ""
    count: int = -1
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    interval: float = 2.0
    lookupd_http_address: tuple[str, ...] = ()
    nsqd_http_address: tuple[str, ...] = ()
    topic: str = ""
    version: bool = False


_B = StatOptions()
FLAGS = FlagSet("nsqtw stat", (
    make_flag("channel", "string", "Channel to report on.", ACTIVE, base=_B),
    make_flag("count", "int", "Print this many rows, then exit.", ACTIVE, base=_B, default_text="0"),
    make_flag("http-client-connect-timeout", "duration", "How long an HTTP connect may take.", ACTIVE, base=_B),
    make_flag("http-client-request-timeout", "duration", "How long an HTTP request may take.", ACTIVE, base=_B),
    make_flag("interval", "duration", "Time between polls (and rows).", ACTIVE, base=_B),
    make_flag("lookupd-http-address", "strings", "nsqlookupd HTTP address to discover nsqd nodes through (repeatable).",
              ACTIVE, base=_B),
    make_flag("nsqd-http-address", "strings", "nsqd HTTP address to poll (repeatable).", ACTIVE, base=_B),
    make_flag("topic", "string", "Topic of the channel.", ACTIVE, base=_B),
    make_flag("version", "bool", "Print the version and exit.", ACTIVE, base=_B),
), lambda hostname: StatOptions(), lambda opts: None)

_WIDTHS = (7, 7, 7, 7, 7, 5, 5, 7, 7, 12, 7)


def _columns(values: Sequence[Any], kind: str) -> str:
    """nsq_stat's ``%7s %7s | %7s %7s %7s %5s %5s | %7s %7s %12s %7s`` (or ``d``) layout."""
    cells = [f"{v:>{w}{kind}}" for v, w in zip(values, _WIDTHS, strict=True)]
    return " ".join(cells[:2]) + " | " + " ".join(cells[2:7]) + " | " + " ".join(cells[7:]) + "\n"


HEADER = ("------rate------+----------------depth----------------+--------------metadata---------------\n"
          + _columns(("ingress", "egress", "total", "mem", "disk", "inflt", "def", "req", "t-o", "msgs",
                      "clients"), "s"))

_FIELDS = ("depth", "memory_depth", "backend_depth", "in_flight_count", "deferred_count", "requeue_count",
           "timeout_count", "message_count", "client_count")


def row(current: dict[str, int], previous: dict[str, int], interval: float) -> str:
    """One line of the table: rates from the difference with the previous poll."""
    msgs = current["message_count"] - previous["message_count"]
    ingress = int(msgs / interval)
    egress = int((msgs - (current["depth"] - previous["depth"])) / interval)
    return _columns((ingress, egress, *(current[f] for f in _FIELDS)), "d")


def aggregate(stats: list[Any], topic: str, channel: str) -> dict[str, int] | None:
    """The channel summed over the nodes' /stats answers (None when no node has it)."""
    total = dict.fromkeys(_FIELDS, 0)
    found = False
    for data in stats:
        for t in data.get("topics") or []:
            if t.get("topic_name") != topic:
                continue
            for c in t.get("channels") or []:
                if c.get("channel_name") != channel:
                    continue
                found = True
                clients = c.get("client_count", len(c.get("clients") or []))
                values = dict(c, memory_depth=c["depth"] - c["backend_depth"], client_count=clients)
                for f in _FIELDS:
                    total[f] += int(values[f])
    return total if found else None


async def producers(reactor: Any, opts: StatOptions, timeout: float) -> list[str]:
    """The HTTP addresses of the nsqd nodes that have the topic."""
    if opts.lookupd_http_address:
        answers = await gatherResults([get_json(reactor, lookup_url(a, "/lookup", topic=opts.topic), timeout)
                                       for a in opts.lookupd_http_address], consumeErrors=True)
        found = {join_host_port(str(p["broadcast_address"]), int(p["http_port"]))
                 for data in answers for p in (data.get("producers") or [])}
        return sorted(found)
    answers = await gatherResults([stats_of(reactor, a, opts.topic, timeout) for a in opts.nsqd_http_address],
                                  consumeErrors=True)
    return [a for a, data in zip(opts.nsqd_http_address, answers, strict=True)
            if any(t.get("topic_name") == opts.topic for t in data.get("topics") or [])]


def stats_of(reactor: Any, address: str, topic: str, timeout: float) -> Any:
    return get_json(reactor, lookup_url(address, "/stats", format="json", topic=topic), timeout)


async def stat(reactor: Any, opts: StatOptions, out: Any) -> int:
    require(bool(opts.topic and opts.channel), "--topic and --channel are required")
    require(opts.interval > 0, "--interval should be positive")
    require(opts.http_client_connect_timeout > 0, "--http-client-connect-timeout should be positive")
    require(opts.http_client_request_timeout > 0, "--http-client-request-timeout should be positive")
    require(opts.count == -1 or opts.count > 0, "--count should be positive")
    require(bool(opts.nsqd_http_address or opts.lookupd_http_address),
            "--nsqd-http-address or --lookupd-http-address required")
    require(not (opts.nsqd_http_address and opts.lookupd_http_address),
            "use --nsqd-http-address or --lookupd-http-address not both")
    for name, addresses in (("--nsqd-http-address", opts.nsqd_http_address),
                            ("--lookupd-http-address", opts.lookupd_http_address)):
        require(not any(a.startswith("http") for a in addresses),
                f"{name} error - address should not contain scheme")
    timeout = opts.http_client_request_timeout
    previous: dict[str, int] | None = None
    i = 0
    while opts.count == -1 or opts.count >= i:
        try:
            nodes = await producers(reactor, opts, timeout)
        except Exception as e:
            raise ToolError(f"ERROR: failed to get topic producers - {_reason(e)}") from None
        try:
            answers = await gatherResults([stats_of(reactor, a, opts.topic, timeout) for a in nodes],
                                          consumeErrors=True)
        except Exception as e:
            raise ToolError(f"ERROR: failed to get nsqd stats - {_reason(e)}") from None
        current = aggregate(answers, opts.topic, opts.channel)
        if current is None:
            raise ToolError(f"ERROR: failed to find channel({opts.channel}) in stats metadata"
                            f" for topic({opts.topic})")
        if i % 25 == 0:
            out.write(HEADER)
        if previous is not None:
            out.write(row(current, previous, opts.interval))
        out.flush()
        previous = current
        await task.deferLater(reactor, opts.interval)
        i += 1
    return 0


def _reason(e: Exception) -> str:
    inner = getattr(e, "subFailure", None)
    return inner.getErrorMessage() if inner is not None else str(e)


def main(argv: Sequence[str]) -> int:
    opts = parse_flags("nsqtw stat", FLAGS, argv)
    if opts.version:
        print(f"nsq_stat v{__version__} (nsqtw)")
        return 0
    return run_tool(lambda reactor: stat(reactor, opts, sys.stdout))
