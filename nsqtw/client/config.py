"""A client's settings, named and bounded as go-nsq's ``Config`` names them.

The command-line tools pass ``--consumer-opt=snappy,true`` and
``--producer-opt=max_in_flight,10`` through to :meth:`Config.set`, so the
option names, value syntax (Go durations such as ``"5s"``, or integer
milliseconds) and the ranges refused are go-nsq's. Durations are float
seconds here.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from dataclasses import dataclass, field
from typing import Any

from nsqtw import __version__
from nsqtw._go.duration import format_duration, parse_duration
from nsqtw._go.strconv import NumError, parse_bool, parse_float, parse_int

__all__ = ["Config", "ConfigError"]


class ConfigError(ValueError):
    """An unknown option, or a value go-nsq would refuse (``str()`` says which, as go-nsq does)."""


def _hostname() -> str:
    return socket.gethostname()


@dataclass
class Config:
    """Settings shared by :class:`~nsqtw.client.Producer` and :class:`~nsqtw.client.Consumer`."""

    #: close a connection that has been silent this long (heartbeats included)
    read_timeout: float = 60.0
    write_timeout: float = 1.0
    #: how long one TCP connect may take
    dial_timeout: float = 1.0
    lookupd_poll_interval: float = 60.0
    lookupd_poll_jitter: float = 0.3
    max_requeue_delay: float = 900.0
    #: a failed message is requeued with this delay times its attempts (up to max_requeue_delay)
    default_requeue_delay: float = 90.0
    #: ``exponential`` (multiplier * 2^level) or ``full_jitter`` (a random share of it)
    backoff_strategy: str = "exponential"
    backoff_multiplier: float = 1.0
    max_backoff_duration: float = 120.0
    #: messages delivered more often than this are given up (FINed); 0 never gives up
    max_attempts: int = 5
    low_rdy_idle_timeout: float = 10.0
    low_rdy_timeout: float = 30.0
    rdy_redistribute_interval: float = 5.0
    client_id: str = field(default_factory=lambda: _hostname().split(".")[0])
    hostname: str = field(default_factory=_hostname)
    user_agent: str = f"nsqtw/{__version__}"
    heartbeat_interval: float = 30.0
    sample_rate: int = 0
    tls_v1: bool = False
    tls_root_ca_file: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_insecure_skip_verify: bool = False
    deflate: bool = False
    deflate_level: int = 6
    snappy: bool = False
    output_buffer_size: int = 16384
    output_buffer_timeout: float = 0.25
    max_in_flight: int = 1
    #: nsqd's timeout for messages sent to this client; 0 keeps nsqd's --msg-timeout
    msg_timeout: float = 0.0
    auth_secret: str = ""

    def set(self, option: str, value: Any) -> None:
        """go-nsq's ``Config.Set``: coerce ``value`` (often a string) and check its range."""
        name = option.replace("-", "_")
        spec = _OPTIONS.get(name)
        if spec is None:
            raise ConfigError(f"invalid option {option}")
        kind, low, high = spec
        try:
            coerced = _coerce(kind, value)
        except (NumError, ValueError, TypeError) as e:
            raise ConfigError(f"failed to coerce option {option} ({value}) - {e}") from None
        if low is not None and coerced < low:
            raise ConfigError(f"invalid {option} ! {_show(kind, coerced)} < {_show(kind, low)}")
        if high is not None and coerced > high:
            raise ConfigError(f"invalid {option} ! {_show(kind, coerced)} > {_show(kind, high)}")
        setattr(self, name, coerced)

    def set_flag(self, text: str) -> None:
        """One ``--consumer-opt``/``--producer-opt`` value: ``key,value``, or ``key`` alone for true."""
        key, sep, value = text.partition(",")
        self.set(key, value if sep else True)

    def validate(self) -> None:
        """The checks go-nsq makes when a Consumer or Producer is created."""
        for name, (kind, low, high) in _OPTIONS.items():
            value = getattr(self, name)
            if low is not None and value < low:
                raise ConfigError(f"invalid {name} ! {_show(kind, value)} < {_show(kind, low)}")
            if high is not None and value > high:
                raise ConfigError(f"invalid {name} ! {_show(kind, value)} > {_show(kind, high)}")
        if self.heartbeat_interval > self.read_timeout:
            raise ConfigError(f"HeartbeatInterval {format_duration(self.heartbeat_interval)} must be less"
                              f" than ReadTimeout {format_duration(self.read_timeout)}")
        if self.backoff_strategy not in ("exponential", "full_jitter"):
            raise ConfigError(f"invalid backoff strategy {self.backoff_strategy!r}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert and tls_key must be given together")

    def copy(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)

    def identify_body(self) -> bytes:
        """The IDENTIFY JSON this client sends (feature negotiation on, as every current client)."""
        data: dict[str, Any] = {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "user_agent": self.user_agent,
            "feature_negotiation": True,
            "heartbeat_interval": _ms(self.heartbeat_interval) if self.heartbeat_interval > 0 else -1,
            "tls_v1": self.tls_v1,
            "deflate": self.deflate,
            "deflate_level": self.deflate_level,
            "snappy": self.snappy,
            "sample_rate": self.sample_rate,
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": _ms(self.output_buffer_timeout),
        }
        if self.msg_timeout > 0:
            data["msg_timeout"] = _ms(self.msg_timeout)
        return json.dumps(data).encode()


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


#: option -> (kind, minimum, maximum), as go-nsq's struct tags
_OPTIONS: dict[str, tuple[str, Any, Any]] = {
    "read_timeout": ("duration", 0.1, 300.0),
    "write_timeout": ("duration", 0.1, 300.0),
    "dial_timeout": ("duration", None, None),
    "lookupd_poll_interval": ("duration", 0.01, 300.0),
    "lookupd_poll_jitter": ("float", 0.0, 1.0),
    "max_requeue_delay": ("duration", 0.0, 3600.0),
    "default_requeue_delay": ("duration", 0.0, 3600.0),
    "backoff_strategy": ("string", None, None),
    "backoff_multiplier": ("duration", 0.0, 3600.0),
    "max_backoff_duration": ("duration", 0.0, 3600.0),
    "max_attempts": ("int", 0, 65535),
    "low_rdy_idle_timeout": ("duration", 0.01, 300.0),
    "low_rdy_timeout": ("duration", 0.01, 300.0),
    "rdy_redistribute_interval": ("duration", 0.001, 5.0),
    "client_id": ("string", None, None),
    "hostname": ("string", None, None),
    "user_agent": ("string", None, None),
    "heartbeat_interval": ("duration", None, None),
    "sample_rate": ("int", 0, 99),
    "tls_v1": ("bool", None, None),
    "tls_root_ca_file": ("string", None, None),
    "tls_cert": ("string", None, None),
    "tls_key": ("string", None, None),
    "tls_insecure_skip_verify": ("bool", None, None),
    "deflate": ("bool", None, None),
    "deflate_level": ("int", 1, 9),
    "snappy": ("bool", None, None),
    "output_buffer_size": ("int", None, None),
    "output_buffer_timeout": ("duration", None, None),
    "max_in_flight": ("int", 0, None),
    "msg_timeout": ("duration", 0.0, None),
    "auth_secret": ("string", None, None),
}


def _coerce(kind: str, value: Any) -> Any:
    if kind == "duration":
        if isinstance(value, str):
            return parse_duration(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value / 1000.0  # go-nsq reads integers as milliseconds
        if isinstance(value, float):
            return value
        raise TypeError("invalid value type")
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            return parse_bool(value)
        if isinstance(value, int):
            return value != 0
        raise TypeError("invalid value type")
    if kind == "int":
        if isinstance(value, str):
            return parse_int(value, 10)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise TypeError("invalid value type")
    if kind == "float":
        if isinstance(value, str):
            return parse_float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise TypeError("invalid value type")
    return str(value)


def _show(kind: str, value: Any) -> str:
    return format_duration(value) if kind == "duration" else str(value)
