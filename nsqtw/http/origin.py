"""nsqtw: whether a request that changes state came from a web page it must not obey, as pure functions.

A browser says where a request comes from: ``Origin`` (sent with every
``POST``, ``PUT`` and ``DELETE``, same-origin ones included) and
``Sec-Fetch-Site`` (``same-origin``, ``same-site``, ``cross-site``, or
``none`` for what the user typed). curl, NSQ's clients and tools send
neither. nsqd uses :func:`browser_refusal`; nsqadmin, which serves pages of
its own, also asks :meth:`ServedHosts.serves` of the ``Host`` a request
names, so that a page whose name was rebound to the admin's address (DNS
rebinding: its requests are same-origin, with a matching ``Origin``) is
refused too. It imports neither Twisted nor Klein.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

__all__ = ["CROSS_ORIGIN", "HOST_NOT_ALLOWED", "UNCHECKED_METHODS", "ServedHosts", "browser_refusal",
           "host_name", "is_origin", "origin_of"]

#: the ``message`` of the 403 a refused browser request gets (nsqd and nsqadmin)
CROSS_ORIGIN = "CROSS_ORIGIN_REQUEST"
#: the ``message`` of nsqadmin's 403 to a state-changing request for a Host it does not serve
HOST_NOT_ALLOWED = "HOST_NOT_ALLOWED"
#: methods that change nothing (``OPTIONS`` is answered by the router with ``Allow`` only): never checked
UNCHECKED_METHODS = frozenset({b"GET", b"HEAD", b"OPTIONS"})


def origin_of(url: str) -> str:
    """A URL's origin as browsers write it in ``Origin``: scheme://host[:port], lower case, no default port."""
    try:
        parts = urlsplit(url.strip().lower())
        port = parts.port
    except ValueError:
        return ""
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return ""
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    if port is not None and port != {"http": 80, "https": 443}[parts.scheme]:
        host = f"{host}:{port}"
    return f"{parts.scheme}://{host}"


def is_origin(text: str) -> bool:
    """Whether ``text`` names an origin and nothing more: scheme://host[:port], a ``/`` at most after it."""
    parts = urlsplit(text.strip())
    return bool(origin_of(text)) and parts.path in ("", "/") and not parts.query and not parts.fragment \
        and not parts.username and not parts.password


def browser_refusal(origin: bytes | None, site: bytes | None, allowed: frozenset[str]) -> str | None:
    """nsqd's rule: why a state-changing request with these headers is refused, or None.

    nsqd serves no page that could send it one, so an ``Origin`` must be one
    of ``allowed`` (``--http-allow-origin``), whatever ``Sec-Fetch-Site``
    says: the node's own origin is no exception, since a page whose name
    was rebound to the node's address has it too. Without ``Origin`` (no
    browser sends a ``POST`` without it), a ``Sec-Fetch-Site`` other than
    ``none`` is refused as well. A request with neither header (curl, every
    NSQ client) is never refused; callers skip the call for it.
    """
    if origin is not None:
        if allowed and origin_of(origin.decode("latin-1")) in allowed:
            return None
        return "its Origin is not one --http-allow-origin names"
    if site is not None and site.strip().lower() != b"none":
        return "a browser marks it as sent by another page"
    return None


def host_name(host: str) -> str | None:
    """The name a ``Host`` header gives, as compared: lower case, without port, brackets or final dot.

    ``[::1]:4171`` gives ``::1``; None when the header is no host at all.
    """
    host = host.strip().lower()
    if host.startswith("["):
        name, sep, rest = host[1:].partition("]")
        if not sep or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
    else:
        name, sep, port = host.rpartition(":")
        if not sep:
            name = port
        elif ":" in name or not port.isdigit():
            return None  # IPv6 without brackets, or no port after the colon
    name = name.rstrip(".")
    if not name or any(c in name for c in " /\\@?#,"):
        return None
    return name


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class ServedHosts:
    """The names nsqadmin answers state-changing requests for (``--allow-host`` and its own).

    Always served: any IP address (a page whose address is a number cannot
    be rebound to another machine), ``localhost`` and its subdomains
    (browsers resolve them to loopback themselves). Then the given names:
    exact, ``.example.com`` for that domain and every name under it, or
    ``*`` for any host at all (ValueError for anything else). Ports are not
    compared, and one given with a name is ignored: a port forward or a
    proxy changes the port, never the name.
    """

    def __init__(self, names: Iterable[str]) -> None:
        exact: set[str] = set()
        suffixes: list[str] = []
        self.any = False
        for raw in names:
            given = raw.strip()
            if given == "*":
                self.any = True
                continue
            name = host_name(given.lstrip("."))
            if name is None:
                raise ValueError(f"not a host name: {raw!r}")
            exact.add(name)
            if given.startswith("."):
                suffixes.append("." + name)
        self.exact = frozenset(exact)
        self.suffixes = tuple(suffixes)

    def serves(self, host: str | None) -> bool:
        """Whether a request naming ``Host: host`` may change state (no ``Host`` at all: not a browser, yes)."""
        if host is None or self.any:
            return True
        name = host_name(host)
        if name is None:
            return False
        if name in self.exact or name == "localhost" or name.endswith(".localhost"):
            return True
        return name.endswith(self.suffixes) or _is_ip(name)
