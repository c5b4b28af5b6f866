"""nsqlookupd's flags and TOML config file, with the same Go flag machinery as nsqd's.

Every flag of Go nsqlookupd v1.3.0 with its name, default and unit; the
parsing, ``--config`` merge and ``--help`` come from :class:`nsqtw._go.flags.FlagSet`.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from nsqtw._go.flags import (
    ACTIVE,
    FlagSet,
    GoFlagsTwistdOptions,
    OptionsError,
    make_flag,
)
from nsqtw.net.launch import refuse_running_pid_file

__all__ = ["LOOKUPD_FLAGS", "LookupdOptions", "LookupdTwistdOptions", "defaults", "parse_args"]

_HOSTNAME = socket.gethostname()


@dataclass(frozen=True)
class LookupdOptions:
    """Every nsqlookupd setting after resolution; durations are float seconds."""

    config: str = ""
    version: bool = False
    log_level: str = "info"
    log_prefix: str = "[nsqlookupd] "
    verbose: bool = False
    tcp_address: str = "0.0.0.0:4160"
    http_address: str = "0.0.0.0:4161"
    broadcast_address: str = _HOSTNAME
    inactive_producer_timeout: float = 300.0
    tombstone_lifetime: float = 45.0


def defaults(hostname: str | None = None) -> LookupdOptions:
    """nsqlookupd's defaults; ``broadcast_address`` is the hostname, looked up now."""
    return LookupdOptions(broadcast_address=socket.gethostname() if hostname is None else hostname)


def _validate(opts: LookupdOptions) -> None:
    # nsqlookupd would listen on a random port for an empty address; refuse it
    for name in ("tcp_address", "http_address"):
        if not getattr(opts, name):
            raise OptionsError(f"--{name.replace('_', '-')} must not be empty")


_BASE = LookupdOptions()


#: Every nsqlookupd v1.3.0 flag, in nsqlookupd's own order.
FLAGS = (
    make_flag("config", "string", "Path to a TOML config file.", ACTIVE, toml_key=None, base=_BASE),
    make_flag("version", "bool", "Print the version and exit.", ACTIVE, toml_key=None, base=_BASE),
    make_flag("log-level", "log-level",
              "Least severe messages to log: debug, info, warn, error or fatal (any case).",
              ACTIVE, base=_BASE),
    make_flag("log-prefix", "string", "Text put in front of every log line.", ACTIVE,
              base=_BASE),
    make_flag("verbose", "bool", "Deprecated and ignored, as in nsqlookupd; use --log-level.",
              ACTIVE, toml_key=None, base=_BASE),
    make_flag("tcp-address", "string", "<addr>:<port> for nsqd nodes (V1 lookup protocol).",
              ACTIVE, base=_BASE),
    make_flag("http-address", "string", "<addr>:<port> for the HTTP API.", ACTIVE, base=_BASE),
    make_flag("broadcast-address", "string",
              "Address of this nsqlookupd, told to nsqd nodes in the IDENTIFY answer. Defaults"
              " to the hostname.", ACTIVE, base=_BASE,
              default_text=f'the hostname ("{_HOSTNAME}" here)'),
    make_flag("inactive-producer-timeout", "duration",
              "How long a node stays in /lookup and /nodes after its last PING.", ACTIVE,
              base=_BASE),
    make_flag("tombstone-lifetime", "duration",
              "How long /topic/tombstone hides a node from /lookup of that topic.", ACTIVE,
              base=_BASE),
)

LOOKUPD_FLAGS = FlagSet("nsqlookupd", FLAGS, defaults, _validate)


def parse_args(argv: list[str], hostname: str | None = None) -> LookupdOptions:
    """Resolve nsqlookupd's options: command line, then ``--config`` file, then default."""
    opts: LookupdOptions = LOOKUPD_FLAGS.parse(argv, hostname)
    return opts


class LookupdTwistdOptions(GoFlagsTwistdOptions):
    """twistd's options for the nsqtw-lookupd plugin: nsqlookupd's flags."""

    synopsis = "[nsqlookupd flags]"
    flagset = LOOKUPD_FLAGS
    command = "nsqtw-lookupd"

    def postOptions(self) -> None:
        if not self.resolved.version:  # twistd's pid file, in one line (--version prints and exits)
            refuse_running_pid_file(getattr(self, "parent", None))

    @property
    def lookupd(self) -> LookupdOptions:
        opts: LookupdOptions = self.resolved
        return opts
