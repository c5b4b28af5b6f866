"""IDENTIFY: what a V2 client may ask for, checked as nsqd checks it, and nsqd's answer.

Sans-IO: these functions take the decoded body and the node's options and
return values or raise nsqd's error; the protocol applies the result
(timers, the TLS and compression upgrade) and writes the frames.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol

from nsqtw import NSQD_VERSION
from nsqtw._go.json import go_loads
from nsqtw.errors import NSQError, fatal

__all__ = ["DEFAULT_DEFLATE_LEVEL", "DEFAULT_OUTPUT_BUFFER_SIZE", "Negotiated", "decode_identify",
           "apply_settings", "negotiate"]

#: nsqd's defaults for a client that does not IDENTIFY them
DEFAULT_OUTPUT_BUFFER_SIZE = 16 * 1024
DEFAULT_DEFLATE_LEVEL = 6

_STR = ("client_id", "hostname", "user_agent", "short_id", "long_id")
_BOOL = ("feature_negotiation", "tls_v1", "snappy", "deflate")
_INT = ("heartbeat_interval", "output_buffer_size", "output_buffer_timeout",
        "sample_rate", "msg_timeout", "deflate_level")
_KNOWN = _STR + _BOOL + _INT


class Settings(Protocol):
    """The per-client settings IDENTIFY may change (the V2 connection holds them)."""

    heartbeat_interval: float
    output_buffer_size: int
    output_buffer_timeout: float
    sample_rate: int
    msg_timeout: float


_SURROGATE = re.compile("[\ud800-\udfff]")


def _without_lone_surrogates(text: str) -> str:
    """Go's JSON decoder turns an unpaired ``\\ud800``-``\\udfff`` escape into U+FFFD; so do we.

    Python keeps it as a lone surrogate, which no UTF-8 encoder accepts: the
    client's fields would break ``/stats?format=text`` for as long as it stays.
    """
    if _SURROGATE.search(text) is None:  # C speed: a client_id may be megabytes long
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def decode_identify(body: bytes) -> dict[str, Any]:
    """IDENTIFY's fields with the types nsqd's decoder insists on (ValueError otherwise).

    Only the fields nsqd knows are kept, as Go decodes into its struct: the
    rest (possibly nested thousands deep) is dropped here, so logging the
    result can never recurse through a client's structure.
    """
    raw = go_loads(body)
    if not isinstance(raw, dict):
        raise ValueError("not an object")
    data = {key: raw[key] for key in _KNOWN if key in raw}
    for key in _STR:
        if data.get(key) is not None:
            if not isinstance(data[key], str):
                raise ValueError(key)
            data[key] = _without_lone_surrogates(data[key])
    for key in _BOOL:
        if data.get(key) is not None and not isinstance(data[key], bool):
            raise ValueError(key)
    for key in _INT:
        v = data.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise ValueError(key)
    return data


def apply_settings(client: Settings, data: dict[str, Any], o: Any) -> None:
    """Apply heartbeat, output buffer, sample rate and msg timeout as nsqd validates them."""

    def bad(what: str, value: int) -> NSQError:
        return fatal("E_BAD_BODY", f"IDENTIFY {what} ({value}) is invalid")

    hb = data.get("heartbeat_interval") or 0
    if hb == -1:
        client.heartbeat_interval = 0
    elif hb == 0:
        pass
    elif 1000 <= hb <= int(o.max_heartbeat_interval * 1000):
        client.heartbeat_interval = hb / 1000.0
    else:
        raise bad("heartbeat interval", hb)

    timeout = data.get("output_buffer_timeout") or 0
    if timeout == -1:
        client.output_buffer_timeout = 0.0
    elif timeout == 0:
        pass
    elif (int(o.min_output_buffer_timeout * 1000) <= timeout
          <= int(o.max_output_buffer_timeout * 1000)):
        client.output_buffer_timeout = timeout / 1000.0
    else:
        raise bad("output buffer timeout", timeout)

    size = data.get("output_buffer_size") or 0
    if size == -1:
        client.output_buffer_size = 1
        client.output_buffer_timeout = 0.0
    elif size == 0:
        pass
    elif 64 <= size <= o.max_output_buffer_size:
        client.output_buffer_size = size
    else:
        raise bad("output buffer size", size)

    rate = data.get("sample_rate") or 0
    if rate < 0 or rate > 99:
        raise bad("sample rate", rate)
    client.sample_rate = rate

    mt = data.get("msg_timeout") or 0
    if mt == 0:
        pass
    elif 1000 <= mt <= int(o.max_msg_timeout * 1000):
        client.msg_timeout = mt / 1000.0
    else:
        raise bad("msg timeout", mt)


@dataclass(frozen=True)
class Negotiated:
    """What feature negotiation agreed: the upgrades to make and nsqd's JSON answer."""

    tls_v1: bool
    snappy: bool
    deflate: bool
    deflate_level: int
    answer: bytes


def negotiate(data: dict[str, Any], o: Any, client: Settings, *, tls_available: bool,
              upgraded_tls: bool, compressed: bool, auth_required: bool) -> Negotiated:
    """The features to turn on (a connection is upgraded once) and nsqd's IDENTIFY answer."""
    tls_v1 = tls_available and bool(data.get("tls_v1")) and not upgraded_tls
    deflate = bool(o.deflate and data.get("deflate")) and not compressed
    snappy = bool(o.snappy and data.get("snappy")) and not compressed
    deflate_level = DEFAULT_DEFLATE_LEVEL
    if deflate and (data.get("deflate_level") or 0) > 0:
        deflate_level = data["deflate_level"]
    deflate_level = min(deflate_level, o.max_deflate_level)
    if deflate and snappy:
        raise fatal("E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")
    response = {
        "max_rdy_count": o.max_rdy_count,
        "version": NSQD_VERSION,
        "max_msg_timeout": int(o.max_msg_timeout * 1000),
        "msg_timeout": int(client.msg_timeout * 1000),
        "tls_v1": tls_v1,
        "deflate": deflate,
        "deflate_level": deflate_level,
        "max_deflate_level": o.max_deflate_level,
        "snappy": snappy,
        "sample_rate": client.sample_rate,
        "auth_required": auth_required,
        "output_buffer_size": client.output_buffer_size,
        "output_buffer_timeout": int(client.output_buffer_timeout * 1000),
    }
    return Negotiated(tls_v1, snappy, deflate, deflate_level,
                      json.dumps(response, separators=(",", ":")).encode())
