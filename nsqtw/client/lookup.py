"""Asking nsqlookupd (and nsqd's HTTP API) with treq: who produces a topic, which topics exist.

Answers are read in both shapes NSQ has used: v1.x's plain JSON and the
older ``{"status_code": 200, "data": {...}}`` envelope, as go-nsq's
``apiRequestNegotiateV1`` does.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import treq
from twisted.internet.defer import Deferred

from nsqtw.net.listen import join_host_port

__all__ = ["HTTPError", "get_json", "join_host_port", "lookup_producers", "lookup_url"]

_ACCEPT: dict[bytes | str, bytes | str] = {b"Accept": b"application/vnd.nsq; version=1.0"}


class HTTPError(Exception):
    """An HTTP answer other than 200, or a body that is not the expected JSON."""


def lookup_url(address: str, path: str, **query: str) -> str:
    """``address`` (``host:port`` or a URL) with ``path`` when it has none, plus ``query``."""
    url = address if "://" in address else "http://" + address
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query) + list(query.items())
    return urlunsplit((parts.scheme, parts.netloc, parts.path if parts.path not in ("", "/") else path,
                       urlencode(pairs), ""))


def get_json(reactor: Any, url: str, timeout: float) -> Deferred[Any]:
    """GET ``url`` and fire with its JSON (unwrapped from the pre-1.0 envelope)."""
    d: Deferred[Any] = treq.get(url, headers=_ACCEPT, timeout=timeout, reactor=reactor, persistent=False)

    def read(response: Any) -> Deferred[Any]:
        def decode(body: bytes) -> Any:
            if response.code != 200:
                raise HTTPError(f"got response {response.code} {response.phrase.decode('latin-1')}"
                                f" {body[:200]!r}")
            try:
                data = json.loads(body)
            except ValueError as e:
                raise HTTPError(f"invalid JSON from {url}: {e}") from None
            if isinstance(data, dict) and "status_code" in data and "data" in data:
                data = data["data"]
            return data
        got: Deferred[Any] = treq.content(response).addCallback(decode)
        return got

    d.addCallback(read)
    return d


def lookup_producers(reactor: Any, lookupd_address: str, topic: str, timeout: float) -> Deferred[list[str]]:
    """The TCP addresses (``broadcast_address:tcp_port``) of the nsqd nodes lookupd lists for ``topic``."""
    d = get_json(reactor, lookup_url(lookupd_address, "/lookup", topic=topic), timeout)

    def addresses(data: Any) -> list[str]:
        producers = data.get("producers") or [] if isinstance(data, dict) else []
        return [join_host_port(str(p["broadcast_address"]), int(p["tcp_port"])) for p in producers]

    d.addCallback(addresses)
    return d
