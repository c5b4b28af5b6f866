"""The connector's options: parsed and checked once, with errors that name the option."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from nsqtw.names import is_valid_channel_name, is_valid_topic_name
from nsqtw.spark.client import ConnectSettings, split_address

#: nsqd's defaults for --max-msg-size and --max-body-size.
DEFAULT_MAX_MSG_SIZE = 1024 * 1024
DEFAULT_MAX_BODY_SIZE = 5 * 1024 * 1024
#: messages a reader holds at once; with 100-byte messages about 30 MB in the driver. A steady
#: stream's batches take about half of it each (the other half arrives while Spark runs a batch),
#: and Spark's fixed cost per batch (tens of milliseconds of planning and checkpoint writes) is
#: spread over those: 64 connections of nsqd's default --max-rdy-count (2500)
DEFAULT_MAX_IN_FLIGHT = 160000
#: message bytes a reader holds at once before it stops asking for more (RDY 0)
DEFAULT_MAX_BYTES_IN_FLIGHT = 256 * 1024 * 1024


class NSQOptionError(ValueError):
    """A missing or invalid option of the ``nsq`` data source."""


_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no", "")


def _get(options: Mapping[str, str], key: str) -> str | None:
    # Spark hands options over case-insensitively; accept either spelling here too
    value = options.get(key)
    if value is None:
        for k, v in options.items():
            if k.lower() == key:
                return str(v)
    return None if value is None else str(value)


def _int(options: Mapping[str, str], key: str, default: int, minimum: int = 1) -> int:
    raw = _get(options, key)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise NSQOptionError(f"option {key}: {raw!r} is not an integer") from None
    if value < minimum:
        raise NSQOptionError(f"option {key}: {value} is below the minimum {minimum}")
    return value


def _bool(options: Mapping[str, str], key: str) -> bool:
    raw = (_get(options, key) or "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise NSQOptionError(f"option {key}: {raw!r} is not true or false")


def _list(options: Mapping[str, str], key: str) -> tuple[str, ...]:
    raw = _get(options, key) or ""
    return tuple(a.strip() for a in raw.split(",") if a.strip())


def _name(options: Mapping[str, str], key: str, required: bool) -> str:
    value = (_get(options, key) or "").strip()
    if not value:
        if required:
            raise NSQOptionError(f"option {key} is required")
        return ""
    check = is_valid_topic_name if key == "topic" else is_valid_channel_name
    if not check(value):
        raise NSQOptionError(
            f"option {key}: {value!r} is not a valid NSQ name (1-64 characters of "
            "[.a-zA-Z0-9_-], optionally ending in #ephemeral)")
    return value


def lookupd_url(address: str) -> str:
    """``host:port`` or ``http(s)://host:port[/]`` as a base URL without a trailing slash."""
    if address.startswith(("http://", "https://")):
        base = address.rstrip("/")
        split_address(base.split("://", 1)[1].split("/", 1)[0])
        return base
    split_address(address)
    return "http://" + address


@dataclass(frozen=True)
class Endpoints:
    """Where the nsqds are: fixed TCP addresses or lookupd HTTP addresses."""

    nsqd_tcp_addresses: tuple[str, ...]
    lookupd_http_addresses: tuple[str, ...]
    lookupd_poll_interval: float
    connect: ConnectSettings

    @classmethod
    def parse(cls, options: Mapping[str, str], msg_timeout_ms: int = 0) -> Endpoints:
        nsqds = _list(options, "nsqd_tcp_addresses")
        lookupds = _list(options, "lookupd_http_addresses")
        if bool(nsqds) == bool(lookupds):
            raise NSQOptionError(
                "set exactly one of the options nsqd_tcp_addresses (HOST:PORT,...) and "
                "lookupd_http_addresses (HOST:PORT,...)")
        try:
            for a in nsqds:
                split_address(a)
            for a in lookupds:
                lookupd_url(a)
        except ValueError as e:
            raise NSQOptionError(f"option {'nsqd_tcp_addresses' if nsqds else 'lookupd_http_addresses'}: "
                                 f"{e}") from None
        tls = _bool(options, "tls")
        tls_files = {k: _get(options, k) for k in ("tls_ca_file", "tls_cert_file", "tls_key_file")}
        if not tls and any(tls_files.values()):
            raise NSQOptionError("options tls_ca_file/tls_cert_file/tls_key_file need tls=true")
        if bool(tls_files["tls_cert_file"]) != bool(tls_files["tls_key_file"]):
            raise NSQOptionError("options tls_cert_file and tls_key_file go together")
        connect = ConnectSettings(
            client_id=_get(options, "client_id") or "",
            msg_timeout_ms=msg_timeout_ms,
            connect_timeout=_int(options, "connect_timeout_ms", 10000) / 1000.0,
            tls=tls,
            tls_ca_file=tls_files["tls_ca_file"],
            tls_cert_file=tls_files["tls_cert_file"],
            tls_key_file=tls_files["tls_key_file"],
            tls_insecure_skip_verify=_bool(options, "tls_insecure_skip_verify"),
            auth_secret=_get(options, "auth_secret"),
        )
        poll = _int(options, "lookupd_poll_interval_ms", 60000, minimum=100) / 1000.0
        return cls(nsqds, lookupds, poll, connect)


@dataclass(frozen=True)
class ReaderOptions:
    """Options of ``spark.readStream.format("nsq")``."""

    endpoints: Endpoints
    topic: str
    channel: str
    max_messages_per_batch: int | None
    max_in_flight: int
    max_bytes_in_flight: int
    connections_per_nsqd: int   # 0: enough for max_in_flight under nsqd's --max-rdy-count
    num_partitions: int
    msg_timeout_ms: int
    drain_timeout: float
    replay_timeout: float

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReaderOptions:
        topic = _name(options, "topic", required=True)
        channel = _name(options, "channel", required=True)
        msg_timeout_ms = _int(options, "msg_timeout_ms", 0, minimum=1000)
        per_batch = _int(options, "max_messages_per_batch", 0)
        return cls(
            endpoints=Endpoints.parse(options, msg_timeout_ms),
            topic=topic,
            channel=channel,
            max_messages_per_batch=per_batch or None,
            max_in_flight=_int(options, "max_in_flight", DEFAULT_MAX_IN_FLIGHT),
            max_bytes_in_flight=_int(options, "max_bytes_in_flight", DEFAULT_MAX_BYTES_IN_FLIGHT),
            connections_per_nsqd=_int(options, "connections_per_nsqd", 0, minimum=0),
            num_partitions=_int(options, "num_partitions", os.cpu_count() or 1),
            msg_timeout_ms=msg_timeout_ms,
            drain_timeout=_int(options, "drain_timeout_ms", 2000, minimum=0) / 1000.0,
            replay_timeout=_int(options, "replay_timeout_ms", 30000, minimum=0) / 1000.0,
        )


@dataclass(frozen=True)
class WriterOptions:
    """Options of ``df.write.format("nsq")`` and ``writeStream.format("nsq")``."""

    endpoints: Endpoints
    topic: str
    max_msg_size: int
    max_body_size: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriterOptions:
        max_msg_size = _int(options, "max_msg_size", DEFAULT_MAX_MSG_SIZE)
        max_body_size = _int(options, "max_body_size", DEFAULT_MAX_BODY_SIZE)
        if max_body_size < max_msg_size + 8:
            raise NSQOptionError(
                f"option max_body_size ({max_body_size}) must exceed max_msg_size ({max_msg_size}) "
                "by at least 8 bytes, as in nsqd")
        return cls(
            endpoints=Endpoints.parse(options),
            topic=_name(options, "topic", required=False),
            max_msg_size=max_msg_size,
            max_body_size=max_body_size,
        )
