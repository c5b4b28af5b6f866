"""nsqd discovery through nsqlookupd's HTTP API (``/lookup`` and ``/nodes``), blocking."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("nsqtw.spark")


class LookupdUnavailable(Exception):
    """No lookupd answered."""


def _get_json(url: str, timeout: float) -> dict[str, Any] | None:
    """The decoded body, None for 404 (unknown topic); raises OSError/ValueError otherwise."""
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.nsq; version=1.0"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = json.loads(response.read())
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise
    if isinstance(data, dict) and "data" in data and "status_code" in data:
        data = data["data"]  # pre-1.0 lookupd wraps its answers
    if not isinstance(data, dict):
        raise ValueError(f"unexpected answer from {url}")
    return data


def producer_address(producer: dict[str, Any]) -> str:
    """The TCP address a client uses for one lookupd producer entry."""
    host = str(producer["broadcast_address"])
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{int(producer['tcp_port'])}"


def _ask(urls: Iterable[str], path: str, timeout: float) -> set[str]:
    found: set[str] = set()
    answered = 0
    errors = []
    for base in urls:
        url = base + path
        try:
            data = _get_json(url, timeout)
        except (OSError, ValueError) as e:
            errors.append(f"{url}: {e}")
            log.warning("lookupd query %s failed: %s", url, e)
            continue
        answered += 1
        for producer in (data or {}).get("producers") or []:
            try:
                found.add(producer_address(producer))
            except (KeyError, TypeError, ValueError):
                log.warning("lookupd %s: ignoring malformed producer %r", url, producer)
    if not answered:
        raise LookupdUnavailable("no lookupd answered: " + "; ".join(errors))
    return found


def lookup_topic(urls: Iterable[str], topic: str, timeout: float = 5.0) -> set[str]:
    """TCP addresses of the nsqds that have ``topic`` (empty while none has it)."""
    return _ask(urls, "/lookup?" + urllib.parse.urlencode({"topic": topic}), timeout)


def all_nodes(urls: Iterable[str], timeout: float = 5.0) -> set[str]:
    """TCP addresses of every nsqd registered with the lookupds."""
    return _ask(urls, "/nodes", timeout)
