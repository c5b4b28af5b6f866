"""nsqd's command-line flags and TOML config file, resolved into one options object.

Every flag of Go nsqd v1.3.0 is here with the same name, default and unit, so
an existing ``nsqd`` command line or ``--config`` file works unchanged.  Values
are resolved like nsqd does (command line, then config file, then default) and
checked where nsqd checks them, so a bad start fails at once with one clear
line instead of deep inside the service.

Durations are float seconds; sizes and counts are ints; repeatable flags are
tuples.  :data:`FLAGS` describes every flag for the docs and ``/config``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import sys
import tomllib
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from twisted.python import usage

__all__ = [
    "ACTIVE",
    "FLAGS",
    "FLAGS_BY_NAME",
    "FLAGS_BY_TOML_KEY",
    "NOT_YET_ACTIVE",
    "NSQTW_FLAGS",
    "TLS_MIN_VERSIONS",
    "TLS_NOT_REQUIRED",
    "TLS_REQUIRED",
    "TLS_REQUIRED_EXCEPT_HTTP",
    "NSQD_FLAGS",
    "Flag",
    "FlagSet",
    "GoFlagsTwistdOptions",
    "HelpRequested",
    "NSQDOptions",
    "NSQDTwistdOptions",
    "OptionsError",
    "defaults",
    "format_duration",
    "make_flag",
    "node_id_for_hostname",
    "parse_args",
    "parse_duration",
    "usage_text",
]

ACTIVE = "active"
NOT_YET_ACTIVE = "accepted, not yet active"

#: ``tls_required`` values, as nsqd numbers them.
TLS_NOT_REQUIRED = 0
TLS_REQUIRED = 1
TLS_REQUIRED_EXCEPT_HTTP = 2

#: ``--tls-min-version`` names and the TLS protocol numbers nsqd stores
#: (the same numbers as :class:`ssl.TLSVersion`).
TLS_MIN_VERSIONS: Mapping[str, int] = {
    "ssl3.0": 0x0300,
    "tls1.0": 0x0301,
    "tls1.1": 0x0302,
    "tls1.2": 0x0303,
    "tls1.3": 0x0304,
}
_TLS_VERSION_NAMES = {v: k for k, v in TLS_MIN_VERSIONS.items()}

_LOG_LEVELS = ("debug", "info", "warn", "error", "fatal")
_TLS_CLIENT_AUTH_POLICIES = ("", "require", "require-verify")
_AUTH_METHODS = ("get", "post")

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


class OptionsError(Exception):
    """A flag or config value nsqd would refuse; ``str()`` is one line for the user."""


class HelpRequested(Exception):
    """``-h``/``--help`` was given: the caller prints :func:`usage_text` and exits 0."""


# --- durations (Go's time.ParseDuration and Duration.String) -----------------

_NS = 1
_US = 1000 * _NS
_MS = 1000 * _US
_S = 1000 * _MS
_MIN = 60 * _S
_H = 60 * _MIN

_UNITS = {
    "ns": _NS,
    "us": _US,
    "\u00b5s": _US,  # micro sign
    "\u03bcs": _US,  # Greek small letter mu
    "ms": _MS,
    "s": _S,
    "m": _MIN,
    "h": _H,
}


def _quote(text: str) -> str:
    """Double-quote like Go's ``%q`` so error lines match nsqd's."""
    return json.dumps(text, ensure_ascii=False)


def parse_duration_ns(text: str) -> int:
    """Parse a Go duration string into integer nanoseconds.

    Kept exact (no floats) so values round-trip and overflow is caught the way
    Go catches it: the result must fit in a signed 64-bit count of nanoseconds.
    """
    orig = text
    bad = ValueError("time: invalid duration " + _quote(orig))
    s = text
    neg = False
    if s and s[0] in "+-":
        neg = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise bad
    total = 0
    while s:
        if not (s[0] == "." or s[0].isascii() and s[0].isdigit()):
            raise bad
        i = 0
        while i < len(s) and s[i].isascii() and s[i].isdigit():
            i += 1
        pre = i > 0
        whole = int(s[:i]) if pre else 0
        s = s[i:]
        frac = 0
        scale = 1
        post = False
        if s and s[0] == ".":
            s = s[1:]
            i = 0
            while i < len(s) and s[i].isascii() and s[i].isdigit():
                i += 1
            post = i > 0
            digits = s[:i]
            s = s[i:]
            # Go keeps fraction digits only while they fit in 63 bits.
            for d in digits:
                if frac * 10 + int(d) > _INT64_MAX:
                    break
                frac = frac * 10 + int(d)
                scale *= 10
        if not pre and not post:
            raise bad
        i = 0
        while i < len(s) and not (s[i] == "." or s[i].isascii() and s[i].isdigit()):
            i += 1
        if i == 0:
            raise ValueError("time: missing unit in duration " + _quote(orig))
        unit_name = s[:i]
        s = s[i:]
        unit = _UNITS.get(unit_name)
        if unit is None:
            raise ValueError(
                f"time: unknown unit {_quote(unit_name)} in duration {_quote(orig)}"
            )
        if whole > (1 << 63) // unit:
            raise bad
        value = whole * unit
        if frac:
            value += int(frac * (unit / scale))
            if value > 1 << 63:
                raise bad
        total += value
        if total > 1 << 63:
            raise bad
    if neg:
        return -total
    if total > _INT64_MAX:
        raise bad
    return total


def parse_duration(text: str) -> float:
    """Parse a Go duration (``300ms``, ``1m30s``, ``1.5h``, ``-2s``) into float seconds.

    Raises :class:`ValueError` for anything Go's ``time.ParseDuration`` rejects,
    including a bare number other than ``0``.
    """
    return parse_duration_ns(text) / _S


def _fmt_frac(value: int, prec: int) -> tuple[str, int]:
    """Split ``value`` at ``prec`` decimal digits; the fraction loses trailing zeros."""
    whole, frac = divmod(value, 10**prec)
    digits = str(frac).rjust(prec, "0").rstrip("0") if prec else ""
    return ("." + digits if digits else ""), whole


def format_duration_ns(ns: int) -> str:
    """Format integer nanoseconds as Go's ``Duration.String()`` does."""
    if ns == 0:
        return "0s"
    neg = ns < 0
    u = -ns if neg else ns
    if u < _S:
        if u < _US:
            frac, whole, unit = "", u, "ns"
        elif u < _MS:
            frac, whole = _fmt_frac(u, 3)
            unit = "\u00b5s"
        else:
            frac, whole = _fmt_frac(u, 6)
            unit = "ms"
        out = f"{whole}{frac}{unit}"
    else:
        frac, secs = _fmt_frac(u, 9)
        out = f"{secs % 60}{frac}s"
        mins = secs // 60
        if mins:
            out = f"{mins % 60}m{out}"
            hours = mins // 60
            if hours:
                out = f"{hours}h{out}"
    return "-" + out if neg else out


def format_duration(seconds: float) -> str:
    """Format float seconds as Go prints a duration: ``1m0s``, ``250ms``, ``0s``, ``1h0m0s``."""
    return format_duration_ns(round(seconds * _S))


# --- the options object -------------------------------------------------------


def node_id_for_hostname(hostname: str) -> int:
    """nsqd's default ``--node-id``: crc32 (IEEE) of the md5 digest of the hostname, mod 1024."""
    digest = hashlib.md5(hostname.encode("utf-8", "surrogateescape")).digest()
    return zlib.crc32(digest) % 1024


def _hostname() -> str:
    return socket.gethostname()


_HOSTNAME = _hostname()


@dataclass(frozen=True)
class NSQDOptions:
    """Every nsqd setting after resolution; immutable so it can be shared freely.

    Attribute names are the flag names with ``-`` turned into ``_``.  Durations
    are float seconds.
    """

    # basic
    config: str = ""
    version: bool = False
    log_level: str = "info"
    log_prefix: str = "[nsqd] "
    verbose: bool = False
    node_id: int = node_id_for_hostname(_HOSTNAME)
    worker_id: bool = False
    https_address: str = "0.0.0.0:4152"
    http_address: str = "0.0.0.0:4151"
    tcp_address: str = "0.0.0.0:4150"
    auth_http_address: tuple[str, ...] = ()
    auth_http_request_method: str = "get"
    broadcast_address: str = _HOSTNAME
    broadcast_tcp_port: int = 0
    broadcast_http_port: int = 0
    lookupd_tcp_address: tuple[str, ...] = ()
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    # disk queue
    data_path: str = ""
    mem_queue_size: int = 10000
    max_bytes_per_file: int = 100 * 1024 * 1024
    sync_every: int = 2500
    sync_timeout: float = 2.0
    queue_scan_worker_pool_max: int = 4
    queue_scan_selection_count: int = 20
    # messages and commands
    msg_timeout: float = 60.0
    max_msg_timeout: float = 15 * 60.0
    max_msg_size: int = 1024 * 1024
    max_req_timeout: float = 3600.0
    max_body_size: int = 5 * 1024 * 1024
    # limits on what a client may ask for in IDENTIFY
    max_heartbeat_interval: float = 60.0
    max_rdy_count: int = 2500
    max_output_buffer_size: int = 64 * 1024
    max_output_buffer_timeout: float = 30.0
    min_output_buffer_timeout: float = 0.025
    output_buffer_timeout: float = 0.25
    max_channel_consumers: int = 0
    # statsd
    statsd_address: str = ""
    statsd_interval: float = 60.0
    statsd_mem_stats: bool = True
    statsd_prefix: str = "nsq.%s"
    statsd_udp_packet_size: int = 508
    statsd_exclude_ephemeral: bool = False
    # end-to-end latency
    e2e_processing_latency_percentile: tuple[float, ...] = ()
    e2e_processing_latency_window_time: float = 600.0
    # TLS
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_auth_policy: str = ""
    tls_root_ca_file: str = ""
    tls_required: int = TLS_NOT_REQUIRED
    tls_min_version: int = TLS_MIN_VERSIONS["tls1.0"]
    # compression
    deflate: bool = True
    max_deflate_level: int = 6
    snappy: bool = True
    # nsqtw only
    durable_delivery: bool = False
    # nsqd settings that have no flag (fixed in nsqd too); not parsed
    client_timeout: float = 60.0
    queue_scan_interval: float = 0.1
    queue_scan_refresh_interval: float = 5.0
    queue_scan_dirty_percent: float = 0.25

    @property
    def resolved_data_path(self) -> str:
        """Absolute data directory: ``--data-path``, or the working directory when empty (as nsqd)."""
        return os.path.abspath(self.data_path or os.getcwd())

    @property
    def tls_min_version_name(self) -> str:
        """``--tls-min-version`` as its flag spelling (``tls1.0``...)."""
        return _TLS_VERSION_NAMES.get(self.tls_min_version, str(self.tls_min_version))

    @property
    def tls_enabled(self) -> bool:
        """nsqd offers TLS only when it has a certificate and key."""
        return bool(self.tls_cert or self.tls_key)


def defaults(hostname: str | None = None) -> NSQDOptions:
    """nsqd's defaults; ``node_id`` and ``broadcast_address`` come from ``hostname``.

    Without an argument the hostname is looked up now, as nsqd does at start.
    """
    host = _hostname() if hostname is None else hostname
    return NSQDOptions(node_id=node_id_for_hostname(host), broadcast_address=host)


# --- the flag table -----------------------------------------------------------


@dataclass(frozen=True)
class Flag:
    """One nsqd flag: what the parser, ``--help``, the docs and ``/config`` need to know."""

    name: str
    attribute: str
    default: Any
    kind: str
    help: str
    status: str
    #: key in the ``--config`` file (nsqd's ``cfg`` name); ``None``: not read from the file
    toml_key: str | None
    #: how the default reads in ``--help`` and the docs
    default_text: str

    @property
    def repeatable(self) -> bool:
        return self.kind in ("strings", "floats")

    @property
    def is_bool(self) -> bool:
        """Bool-like flags take no separate argument (``-flag`` means true)."""
        return self.kind in ("bool", "tls-required")


_BASE = NSQDOptions()


def _default_text(kind: str, value: Any) -> str:
    if kind == "duration":
        return format_duration(value)
    if kind == "bool":
        return "true" if value else "false"
    if kind in ("strings", "floats"):
        return ",".join(str(v) for v in value) if value else "(none)"
    if kind == "tls-required":
        return {0: "false", 1: "true", 2: "tcp-https"}[value]
    if kind == "tls-min-version":
        return _TLS_VERSION_NAMES[value]
    if kind == "string":
        return _quote(value)
    return str(value)


def _flag(
    name: str,
    kind: str,
    help: str,
    status: str = NOT_YET_ACTIVE,
    toml_key: str | None = "",
    default_text: str | None = None,
    base: Any = _BASE,
) -> Flag:
    """One flag record; its default is read from ``base`` (an options object)."""
    attribute = name.replace("-", "_")
    default = getattr(base, attribute)
    if toml_key == "":
        toml_key = attribute
    if default_text is None:
        default_text = _default_text(kind, default)
    return Flag(name, attribute, default, kind, help, status, toml_key, default_text)


_A = ACTIVE
_QUEUE_SCAN_NOTE = (
    " Accepted for compatibility; nsqtw keeps one timer per channel for the"
    " earliest in-flight or deferred deadline instead of sampling channels,"
    " so the value has no effect."
)

#: Every nsqd v1.3.0 flag, in nsqd's own order.
FLAGS: tuple[Flag, ...] = (
    _flag("version", "bool", "Print the version and exit.", _A, toml_key=None),
    _flag(
        "config", "string", "Path to a TOML config file (see below).", _A, toml_key=None
    ),
    _flag(
        "log-level",
        "log-level",
        "Least severe messages to log: debug, info, warn, error or fatal (any case).",
        _A,
    ),
    _flag("log-prefix", "string", "Text put in front of every log line.", _A),
    _flag(
        "verbose",
        "bool",
        "Deprecated and ignored, as in nsqd; use --log-level.",
        _A,
        toml_key=None,
    ),
    _flag(
        "node-id",
        "int",
        "This node's part of every message ID, 0 to 1023; two nodes must not share"
        " it. Defaults to a hash of the hostname.",
        _A,
        toml_key="id",
        default_text=f"hash of the hostname ({_BASE.node_id} here)",
    ),
    _flag(
        "worker-id",
        "bool",
        "Deprecated and ignored, as in nsqd; use --node-id.",
        _A,
        toml_key=None,
    ),
    _flag(
        "https-address",
        "string",
        "<addr>:<port> for the HTTPS API (used only with --tls-cert/--tls-key); empty"
        " turns it off.",
        _A,
    ),
    _flag(
        "http-address",
        "string",
        "<addr>:<port> for the HTTP API; empty turns it off.",
        _A,
    ),
    _flag("tcp-address", "string", "<addr>:<port> for TCP (V2 protocol) clients.", _A),
    _flag(
        "auth-http-address",
        "strings",
        "<addr>:<port> or URL of an auth server to ask about AUTH secrets; give it"
        " more than once for several servers.",
        _A,
        toml_key="auth_http_addresses",
    ),
    _flag(
        "auth-http-request-method",
        "string",
        "HTTP method for auth server requests: get or post.",
        _A,
    ),
    _flag(
        "broadcast-address",
        "string",
        "Address this node announces to nsqlookupd. Defaults to the hostname.",
        _A,
        default_text=f"the hostname ({_quote(_HOSTNAME)} here)",
    ),
    _flag(
        "broadcast-tcp-port",
        "int",
        "TCP port announced to nsqlookupd; 0 means the port actually listened on.",
        _A,
    ),
    _flag(
        "broadcast-http-port",
        "int",
        "HTTP port announced to nsqlookupd; 0 means the port actually listened on.",
        _A,
    ),
    _flag(
        "lookupd-tcp-address",
        "strings",
        "nsqlookupd TCP address to register with; give it more than once for several.",
        _A,
        toml_key="nsqlookupd_tcp_addresses",
    ),
    _flag(
        "http-client-connect-timeout",
        "duration",
        "Connect timeout for outgoing HTTP requests (auth server, lookupd).",
        _A,
    ),
    _flag(
        "http-client-request-timeout",
        "duration",
        "Whole-request timeout for outgoing HTTP requests.",
        _A,
    ),
    _flag(
        "data-path",
        "string",
        "Directory for disk queues and the metadata file; empty means the working"
        " directory.",
        _A,
    ),
    _flag(
        "mem-queue-size",
        "int",
        "Messages kept in memory per topic and per channel before spilling to disk.",
        _A,
    ),
    _flag("max-bytes-per-file", "int", "Size at which a disk queue starts a new file.", _A),
    _flag("sync-every", "int", "Messages written to a disk queue between fsyncs.", _A),
    _flag("sync-timeout", "duration", "Longest time between disk queue fsyncs.", _A),
    _flag(
        "queue-scan-worker-pool-max",
        "int",
        "In nsqd, the most workers that scan channels for timed-out messages."
        + _QUEUE_SCAN_NOTE,
        _A,
    ),
    _flag(
        "queue-scan-selection-count",
        "int",
        "In nsqd, how many channels each scan samples for timed-out messages."
        + _QUEUE_SCAN_NOTE,
        _A,
    ),
    _flag(
        "msg-timeout",
        "duration",
        "How long a delivered message may stay unfinished before it is requeued,"
        " unless the client asks for another value.",
        _A,
    ),
    _flag(
        "max-msg-timeout",
        "duration",
        "Largest message timeout a client may ask for in IDENTIFY.",
        _A,
    ),
    _flag("max-msg-size", "int", "Largest single message body, in bytes.", _A),
    _flag("max-req-timeout", "duration", "Largest delay a REQ may ask for.", _A),
    _flag(
        "max-body-size",
        "int",
        "Largest command body (MPUB batch, IDENTIFY...), in bytes.",
        _A,
    ),
    _flag(
        "max-heartbeat-interval",
        "duration",
        "Largest heartbeat interval a client may ask for.",
        _A,
    ),
    _flag("max-rdy-count", "int", "Largest RDY count a client may set.", _A),
    _flag(
        "max-output-buffer-size",
        "int",
        "Largest output buffer a client may ask for, in bytes.",
        _A,
    ),
    _flag(
        "max-output-buffer-timeout",
        "duration",
        "Longest output flush delay a client may ask for.",
        _A,
    ),
    _flag(
        "min-output-buffer-timeout",
        "duration",
        "Shortest output flush delay a client may ask for.",
        _A,
    ),
    _flag(
        "output-buffer-timeout",
        "duration",
        "Output flush delay for clients that do not ask for one.",
        _A,
    ),
    _flag(
        "max-channel-consumers",
        "int",
        "Most consumers one channel accepts on this node; 0 means no limit.",
        _A,
    ),
    _flag(
        "statsd-address",
        "string",
        "UDP <addr>:<port> of a statsd server to push stats to.",
        _A,
    ),
    _flag("statsd-interval", "duration", "Time between statsd pushes.", _A),
    _flag("statsd-mem-stats", "bool", "Also push memory and GC figures to statsd.", _A),
    _flag(
        "statsd-prefix",
        "string",
        "Prefix of statsd keys; %s becomes this node's host and port.",
        _A,
    ),
    _flag("statsd-udp-packet-size", "int", "Largest statsd UDP packet, in bytes.", _A),
    _flag(
        "statsd-exclude-ephemeral",
        "bool",
        "Leave ephemeral topics and channels out of statsd.",
        _A,
    ),
    _flag(
        "e2e-processing-latency-percentile",
        "floats",
        "End-to-end processing latency percentile to track, in (0, 1]; repeat the"
        " flag or separate values with commas.",
        _A,
        toml_key="e2e_processing_latency_percentiles",
    ),
    _flag(
        "e2e-processing-latency-window-time",
        "duration",
        "Time window the latency percentiles are computed over.",
        _A,
    ),
    _flag("tls-cert", "string", "Path to the TLS certificate file.", _A),
    _flag("tls-key", "string", "Path to the TLS private key file.", _A),
    _flag(
        "tls-client-auth-policy",
        "string",
        "Client certificate policy: empty (none), require, or require-verify.",
        _A,
    ),
    _flag(
        "tls-root-ca-file",
        "string",
        "Path to the CA file used to check client certificates (and auth server"
        " certificates).",
        _A,
    ),
    _flag(
        "tls-required",
        "tls-required",
        "Require TLS: false, true, or tcp-https (TCP and HTTPS only, plain HTTP"
        " stays open). A bare flag means true; other values need =.",
        _A,
    ),
    _flag(
        "tls-min-version",
        "tls-min-version",
        "Oldest protocol version accepted: ssl3.0, tls1.0, tls1.1, tls1.2 or tls1.3.",
        _A,
    ),
    _flag("deflate", "bool", "Let clients negotiate deflate compression.", _A),
    _flag(
        "max-deflate-level",
        "int",
        "Highest deflate level, 1 to 9, a client may ask for (higher costs more CPU).",
        _A,
    ),
    _flag("snappy", "bool", "Let clients negotiate snappy compression.", _A),
    # nsqtw's own flags (not in nsqd)
    _flag(
        "durable-delivery",
        "bool",
        "nsqtw only: keep no message only in memory. PUB/MPUB/DPUB are answered"
        " after fsync, and in-flight, deferred and requeued messages survive kill -9"
        " (see docs/durability.md).",
        _A,
    ),
)

#: builds flag records for other programs' tables (nsqlookupd's)
make_flag = _flag
#: flags nsqtw adds to nsqd's
NSQTW_FLAGS = frozenset({"durable-delivery"})

FLAGS_BY_NAME: Mapping[str, Flag] = {f.name: f for f in FLAGS}
FLAGS_BY_TOML_KEY: Mapping[str, Flag] = {f.toml_key: f for f in FLAGS if f.toml_key}


# --- value parsing --------------------------------------------------------------

_PARSE = "parse error"
_RANGE = "value out of range"

_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


class _ValueError(Exception):
    """A value failed to parse; carries the reason for the caller to place in its message."""


def _go_bool(text: str) -> bool:
    """Go's ``strconv.ParseBool``."""
    if text in _GO_TRUE:
        return True
    if text in _GO_FALSE:
        return False
    raise _ValueError(_PARSE)


def _go_int(text: str) -> int:
    """Go's ``strconv.ParseInt(s, 0, 64)`` as the flag package uses it (0x, 0o, 0b, 0 prefixes)."""
    if not text.isascii() or any(c.isspace() for c in text):
        raise _ValueError(_PARSE)
    body = text[1:] if text[:1] in "+-" else text
    if not body or body[:1] == "_":
        raise _ValueError(_PARSE)
    try:
        if body[:2].lower() in ("0x", "0o", "0b"):
            value = int(body, 0)
        elif len(body) > 1 and body[0] == "0":
            value = int(body, 8)
        else:
            value = int(body, 10)
    except ValueError:
        raise _ValueError(_PARSE) from None
    if text[0] == "-":
        value = -value
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise _ValueError(_RANGE)
    return value


def _decimal_int(text: str) -> int:
    """Go's ``strconv.ParseInt(s, 10, 64)``, used for integers written as strings in the file."""
    body = text[1:] if text[:1] in "+-" else text
    if not body or not body.isascii() or not body.isdigit():
        raise _ValueError(_PARSE)
    value = int(text, 10)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise _ValueError(_RANGE)
    return value


def _go_float(text: str) -> float:
    """Go's ``strconv.ParseFloat`` for the forms people write (no spaces, no ``_`` junk)."""
    if not text.isascii() or any(c.isspace() for c in text) or "_" in text:
        raise _ValueError(_PARSE)
    try:
        return float(text)
    except ValueError:
        raise _ValueError(_PARSE) from None


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError:
        raise _ValueError(_PARSE) from None


def _log_level(text: str) -> str:
    level = text.lower()
    if level not in _LOG_LEVELS:
        raise _ValueError(
            f"invalid log level {_quote(text)} (debug, info, warn, error, fatal)"
        )
    return level


def _tls_required(text: str) -> int:
    lowered = text.lower()
    if lowered == "tcp-https":
        return TLS_REQUIRED_EXCEPT_HTTP
    try:
        return TLS_REQUIRED if _go_bool(lowered) else TLS_NOT_REQUIRED
    except _ValueError:
        raise _ValueError("must be true, false or tcp-https") from None


def _tls_min_version(text: str) -> int | None:
    """Version number for a name; ``None`` for empty, which keeps the current value (as nsqd)."""
    lowered = text.lower()
    if lowered == "":
        return None
    try:
        return TLS_MIN_VERSIONS[lowered]
    except KeyError:
        raise _ValueError(
            f"unknown TLS version {_quote(text)} (ssl3.0, tls1.0, tls1.1, tls1.2 or tls1.3)"
        ) from None


def _floats(text: str) -> list[float]:
    return [_go_float(part) for part in text.split(",")]


_SCALAR_PARSERS: Mapping[str, Callable[[str], Any]] = {
    "bool": _go_bool,
    "int": _go_int,
    "string": str,
    "duration": _duration,
    "log-level": _log_level,
    "tls-required": _tls_required,
}


# --- command line -----------------------------------------------------------------


def _parse_command_line(argv: Sequence[str], by_name: Mapping[str, Flag],
                        program: str) -> dict[str, Any]:
    """Go ``flag`` package parsing: the flags given on the command line, by attribute.

    ``-flag value``, ``-flag=value``, ``--flag value`` and ``--flag=value`` all
    work; bool flags never take the next argument.  Unlike nsqd (which ignores
    them) positional arguments are an error, since they are always a mistake.
    """
    given: dict[str, Any] = {}
    args = list(argv)
    bare_bool = ""
    while args:
        arg = args.pop(0)
        if bare_bool and (len(arg) < 2 or arg[0] != "-"):
            raise OptionsError(
                f"unexpected argument {_quote(arg)}: a bool flag takes its value"
                f" with =, as in -{bare_bool}={arg}"
            )
        bare_bool = ""
        if len(arg) < 2 or arg[0] != "-":
            raise OptionsError(
                f"unexpected argument {_quote(arg)}: {program} takes only flags"
            )
        dashes = 2 if arg[1] == "-" else 1
        if dashes == 2 and len(arg) == 2:
            if args:
                raise OptionsError(
                    f"unexpected argument {_quote(args[0])}: {program} takes only flags"
                )
            break
        name = arg[dashes:]
        if not name or name[0] in "-=":
            raise OptionsError(f"bad flag syntax: {arg}")
        value: str | None = None
        if "=" in name:
            name, value = name.split("=", 1)
        flag = by_name.get(name)
        if flag is None:
            if name in ("h", "help"):
                raise HelpRequested()
            raise OptionsError(f"flag provided but not defined: -{name}")
        if flag.is_bool:
            text = "true" if value is None else value
            try:
                parsed = _SCALAR_PARSERS[flag.kind](text)
            except _ValueError as e:
                raise OptionsError(
                    f"invalid boolean value {_quote(text)} for -{name}: {e}"
                ) from None
            given[flag.attribute] = parsed
            if value is None:
                bare_bool = name
            continue
        if value is None:
            if not args:
                raise OptionsError(f"flag needs an argument: -{name}")
            value = args.pop(0)
        try:
            if flag.kind == "strings":
                given[flag.attribute] = given.get(flag.attribute, ()) + (value,)
            elif flag.kind == "floats":
                merged = list(given.get(flag.attribute, ())) + _floats(value)
                # nsqd keeps percentiles largest first
                given[flag.attribute] = tuple(sorted(merged, reverse=True))
            elif flag.kind == "tls-min-version":
                version = _tls_min_version(value)
                if version is not None:
                    given[flag.attribute] = version
            else:
                given[flag.attribute] = _SCALAR_PARSERS[flag.kind](value)
        except _ValueError as e:
            raise OptionsError(
                f"invalid value {_quote(value)} for flag -{name}: {e}"
            ) from None
    return given


# --- config file ------------------------------------------------------------------


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _go_sprint(value: Any) -> str:
    """``fmt.Sprintf("%v", v)`` for the TOML scalars nsqd formats before re-parsing."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _coerce_config(flag: Flag, value: Any) -> Any:
    """Turn one TOML value into the attribute's type, as nsqd's option resolution does.

    Durations may be strings (``"60s"``) or integers, which nsqd reads as
    milliseconds; list flags take a TOML array or one comma-separated string.
    """
    kind = flag.kind
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            return _go_bool(value)
        raise _ValueError("want true or false")
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            if not _INT64_MIN <= value <= _INT64_MAX:
                raise _ValueError(_RANGE)
            return value
        if isinstance(value, str):
            return _decimal_int(value)
        raise _ValueError("want an integer")
    if kind == "string":
        if isinstance(value, str):
            return value
        raise _ValueError("want a string")
    if kind == "duration":
        if isinstance(value, str):
            return _duration(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value / 1000.0
        raise _ValueError('want a duration string like "60s" or integer milliseconds')
    if kind == "strings":
        if isinstance(value, str):
            return tuple(value.split(","))
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise _ValueError("want an array of strings")
    if kind == "floats":
        if isinstance(value, str):
            return tuple(_go_float(part.strip()) for part in value.split(","))
        if isinstance(value, list) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
        ):
            return tuple(float(v) for v in value)
        raise _ValueError("want an array of numbers")
    if kind == "log-level":
        return _log_level(_go_sprint(value))
    if kind == "tls-required":
        return _tls_required(_go_sprint(value))
    if kind == "tls-min-version":
        return _tls_min_version(_go_sprint(value))
    raise AssertionError(kind)  # pragma: no cover


def _load_config(path: str, by_toml_key: Mapping[str, Flag]) -> dict[str, Any]:
    """Read ``path`` as nsqd reads its ``--config``: known keys are used, others ignored."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        reason = e.strerror or str(e)
        raise OptionsError(f"failed to load config file {path} - {reason}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        reason = " ".join(str(e).split())
        raise OptionsError(f"failed to load config file {path} - {reason}") from None
    values: dict[str, Any] = {}
    for key, raw in data.items():
        flag = by_toml_key.get(key)
        if flag is None:
            continue
        try:
            value = _coerce_config(flag, raw)
        except _ValueError as e:
            raise OptionsError(
                f"config file {path}: invalid value {_describe(raw)} for {key}: {e}"
            ) from None
        if value is not None:
            values[flag.attribute] = value
    return values


# --- checks nsqd makes before it starts ---------------------------------------------


def _validate(opts: NSQDOptions) -> None:
    """Refuse combinations nsqd refuses at start, each with a one-line reason."""
    if not 0 <= opts.node_id < 1024:
        raise OptionsError(f"--node-id must be in [0,1024), got {opts.node_id}")
    if not 1 <= opts.max_deflate_level <= 9:
        raise OptionsError(
            f"--max-deflate-level must be in [1,9], got {opts.max_deflate_level}"
        )
    for name in ("broadcast_tcp_port", "broadcast_http_port"):
        port = getattr(opts, name)
        if not 0 <= port <= 65535:
            raise OptionsError(
                f"--{name.replace('_', '-')} must be in [0,65535], got {port}"
            )
    if opts.tls_client_auth_policy not in _TLS_CLIENT_AUTH_POLICIES:
        raise OptionsError(
            '--tls-client-auth-policy must be "", "require" or "require-verify", got '
            + _quote(opts.tls_client_auth_policy)
        )
    if opts.auth_http_request_method not in _AUTH_METHODS:
        raise OptionsError(
            f"--auth-http-request-method must be get or post, got {_quote(opts.auth_http_request_method)}"
        )
    for p in opts.e2e_processing_latency_percentile:
        if not 0 < p <= 1:
            raise OptionsError(
                f"--e2e-processing-latency-percentile values must be in (0,1], got {p}"
            )
    if bool(opts.tls_cert) != bool(opts.tls_key):
        raise OptionsError("--tls-cert and --tls-key must be given together")
    if opts.tls_required != TLS_NOT_REQUIRED and not opts.tls_cert:
        raise OptionsError(
            "cannot require TLS client connections without --tls-cert and --tls-key"
        )
    # nsqd spreads each statsd push over (interval - 1s) and crashes when that
    # is not positive; nsqtw sends at once for 1s and refuses shorter intervals.
    if opts.statsd_address and opts.statsd_interval < 1.0:
        raise OptionsError(
            f"--statsd-interval must be at least 1s, got {format_duration(opts.statsd_interval)}"
        )


class FlagSet:
    """One Go program's flags (nsqd's or nsqlookupd's) and how it resolves them.

    The Go flag syntax, the TOML ``--config`` merge and the ``--help`` listing
    are the same for every daemon nsqtw replaces; only the table, the
    defaults and the start-up checks differ.
    """

    def __init__(self, program: str, flags: tuple[Flag, ...],
                 defaults: Callable[[str | None], Any],
                 validate: Callable[[Any], None]) -> None:
        self.program = program
        self.flags = flags
        self.defaults = defaults
        self.validate = validate
        self.by_name: Mapping[str, Flag] = {f.name: f for f in flags}
        self.by_toml_key: Mapping[str, Flag] = {f.toml_key: f for f in flags if f.toml_key}

    def parse(self, argv: Sequence[str], hostname: str | None = None) -> Any:
        """Resolve options from ``argv``: command line, then ``--config`` file, then default.

        Raises :class:`OptionsError` (one line) for anything the Go program
        would refuse, and :class:`HelpRequested` for ``-h``/``--help``.
        """
        given = _parse_command_line(argv, self.by_name, self.program)
        base = self.defaults(hostname)
        from_file: dict[str, Any] = {}
        config_path = given.get("config", "")
        if config_path:
            from_file = _load_config(config_path, self.by_toml_key)
        opts = dataclasses.replace(base, **{**from_file, **given})
        self.validate(opts)
        return opts

    def usage(self, command: str) -> str:
        """The ``--help`` listing: every flag with its argument, meaning and default."""
        lines = [
            f"Usage: {command} [flags]",
            "",
            "Flags take Go syntax: -flag value, -flag=value, --flag value or --flag=value;",
            "a bool flag alone means true (--flag=false turns it off).",
            "Priority: command line, then the --config file, then the default.",
            "",
        ]
        for f in self.flags:
            lines.append(f"  --{f.name}{_KIND_ARG[f.kind]}")
            extra = " (repeatable)" if f.repeatable else ""
            lines.append(f"        {f.help}{extra} (default {f.default_text})")
        return "\n".join(lines) + "\n"


#: nsqd's flags
NSQD_FLAGS = FlagSet("nsqd", FLAGS, defaults, _validate)


def parse_args(argv: list[str], hostname: str | None = None) -> NSQDOptions:
    """Resolve nsqd's options from ``argv``: command line, then ``--config`` file, then default.

    Raises :class:`OptionsError` (one line) for anything nsqd would refuse, and
    :class:`HelpRequested` for ``-h``/``--help``.
    """
    opts: NSQDOptions = NSQD_FLAGS.parse(argv, hostname)
    return opts


# --- help and twistd ------------------------------------------------------------------

_KIND_ARG = {
    "bool": "",
    "int": " int",
    "string": " string",
    "duration": " duration",
    "strings": " value",
    "floats": " value",
    "log-level": " level",
    "tls-required": "",
    "tls-min-version": " version",
}


def usage_text(program: str = "twistd nsqtw") -> str:
    """nsqd's ``--help`` listing."""
    return NSQD_FLAGS.usage(program)


class GoFlagsTwistdOptions(usage.Options):
    """twistd's options for a plugin whose flags use Go syntax (see :class:`FlagSet`).

    twistd's getopt cannot read ``-mem-queue-size=5`` style flags, so
    :meth:`parseOptions` hands the arguments to :attr:`flagset` and keeps
    the result in :attr:`resolved`.
    """

    synopsis = "[flags]"
    #: the flag table; set by subclasses
    flagset: FlagSet
    #: the twistd plugin name, used in --help and error lines
    command = "nsqtw"

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.resolved: Any = self.flagset.defaults(None)

    def parseOptions(self, options: Sequence[str] | None = None) -> None:
        if options is None:
            options = sys.argv[1:]
        try:
            self.resolved = self.flagset.parse(list(options))
        except HelpRequested:
            sys.stdout.write(self.getUsage())
            raise SystemExit(0) from None
        except OptionsError as e:
            sys.stderr.write(f"{self.command}: {e}\n")
            raise SystemExit(1) from None
        for f in dataclasses.fields(self.resolved):
            self[f.name] = getattr(self.resolved, f.name)

    def getUsage(self, width: int | None = None) -> str:
        return self.flagset.usage(f"twistd {self.command}")


class NSQDTwistdOptions(GoFlagsTwistdOptions):
    """twistd's options for the nsqtw plugin: nsqd's flags, resolved into :attr:`nsqd`."""

    synopsis = "[nsqd flags]"
    flagset = NSQD_FLAGS

    @property
    def nsqd(self) -> NSQDOptions:
        opts: NSQDOptions = self.resolved
        return opts
