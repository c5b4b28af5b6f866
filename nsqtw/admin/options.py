"""nsqadmin's flags and TOML config file, with the same Go flag machinery as nsqd's.

Every flag of Go nsqadmin v1.3.0 with its name, default and unit (the
parsing, ``--config`` merge and ``--help`` come from
:class:`nsqtw._go.flags.FlagSet`), plus nsqtw's flags for the in-memory
history the pages chart, for the origins allowed to send actions and the hosts
they may be sent to. The start-up checks and their wording are
nsqadmin's ``New()``.
"""

from __future__ import annotations

import ipaddress
import posixpath
from dataclasses import dataclass
from urllib.parse import urlsplit

from nsqtw._go.flags import (
    ACTIVE,
    FlagSet,
    GoFlagsTwistdOptions,
    OptionsError,
    make_flag,
)
from nsqtw.http.origin import ServedHosts, is_origin, origin_of
from nsqtw.net.launch import refuse_running_pid_file

__all__ = ["ADMIN_FLAGS", "FLAGS", "AdminOptions", "AdminTwistdOptions", "defaults", "origin_of",
           "parse_args"]


@dataclass(frozen=True)
class AdminOptions:
    """Every nsqadmin setting after resolution; durations are float seconds."""

    config: str = ""
    version: bool = False
    log_level: str = "info"
    log_prefix: str = "[nsqadmin] "
    verbose: bool = False
    http_address: str = "0.0.0.0:4171"
    base_path: str = "/"
    dev_static_dir: str = ""
    graphite_url: str = ""
    proxy_graphite: bool = False
    statsd_prefix: str = "nsq.%s"
    statsd_counter_format: str = "stats.counters.%s.count"
    statsd_gauge_format: str = "stats.gauges.%s"
    statsd_interval: float = 60.0
    lookupd_http_address: tuple[str, ...] = ()
    nsqd_http_address: tuple[str, ...] = ()
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    http_client_tls_insecure_skip_verify: bool = False
    http_client_tls_root_ca_file: str = ""
    http_client_tls_cert: str = ""
    http_client_tls_key: str = ""
    allow_config_from_cidr: str = "127.0.0.1/8"
    notification_http_endpoint: str = ""
    acl_http_header: str = "X-Forwarded-User"
    admin_user: tuple[str, ...] = ()
    # nsqtw only: the history behind the pages' charts
    history_interval: float = 5.0
    history_window: float = 900.0
    # nsqtw only: pages of other origins allowed to send actions from a browser
    allow_origin: tuple[str, ...] = ()
    # nsqtw only: names besides its own the admin takes state-changing requests for
    allow_host: tuple[str, ...] = ()


def defaults(hostname: str | None = None) -> AdminOptions:
    """nsqadmin's defaults (nothing depends on the host)."""
    return AdminOptions()


def normalize_base_path(base: str) -> str:
    """nsqadmin's base path: rooted, cleaned, without a trailing slash (``/`` stays ``/``)."""
    return posixpath.normpath("/" + base.strip("/")) if base.strip("/") else "/"


def _validate(opts: AdminOptions) -> None:
    """nsqadmin's ``New()`` checks, in its order and wording (DNS checks are the tap's)."""
    if not opts.lookupd_http_address and not opts.nsqd_http_address:
        raise OptionsError("--nsqd-http-address or --lookupd-http-address required")
    if opts.lookupd_http_address and opts.nsqd_http_address:
        raise OptionsError("use --nsqd-http-address or --lookupd-http-address not both")
    if opts.http_client_tls_cert and not opts.http_client_tls_key:
        raise OptionsError("--http-client-tls-key must be specified with --http-client-tls-cert")
    if opts.http_client_tls_key and not opts.http_client_tls_cert:
        raise OptionsError("--http-client-tls-cert must be specified with --http-client-tls-key")
    if opts.graphite_url:
        parts = urlsplit(opts.graphite_url)
        if not parts.scheme or not parts.netloc:
            raise OptionsError(f"failed to parse --graphite-url ({opts.graphite_url})")
    if opts.allow_config_from_cidr:
        try:
            ipaddress.ip_network(opts.allow_config_from_cidr, strict=False)
        except ValueError:
            raise OptionsError(
                f"failed to parse --allow-config-from-cidr ({opts.allow_config_from_cidr})"
                f" - invalid CIDR address: {opts.allow_config_from_cidr}") from None
    if not opts.http_address:
        raise OptionsError("--http-address must not be empty")
    if opts.history_interval < 0 or opts.history_window < 0:
        raise OptionsError("--history-interval and --history-window must not be negative")
    for origin in opts.allow_origin:
        if not is_origin(origin):
            raise OptionsError(f"--allow-origin must be an origin, as scheme://host[:port] ({origin})")
    for host in opts.allow_host:
        try:
            ServedHosts([host])
        except ValueError:
            raise OptionsError(f"--allow-host must be a host name, .domain or * ({host})") from None


_BASE = AdminOptions()

#: Every nsqadmin v1.3.0 flag (in the order of its ``-help``), then nsqtw's own.
FLAGS = (
    make_flag("acl-http-header", "string",
              "HTTP header that names the authenticated user (set by a proxy in front)."
              " With --admin-user, only the named users may pause, empty, delete or tombstone.",
              ACTIVE, base=_BASE),
    make_flag("admin-user", "strings",
              "A user allowed to take actions (see --acl-http-header); none: everyone may.",
              ACTIVE, toml_key="admin_users", base=_BASE),
    make_flag("allow-config-from-cidr", "string",
              "CIDR of the clients allowed to use /config.", ACTIVE, base=_BASE),
    make_flag("base-path", "string", "URL path every page and API route lives under.",
              ACTIVE, base=_BASE),
    make_flag("config", "string", "Path to a TOML config file.", ACTIVE, toml_key=None,
              base=_BASE),
    make_flag("dev-static-dir", "string",
              "Serve the page assets from this directory instead of the package (development).",
              ACTIVE, base=_BASE),
    make_flag("graphite-url", "string",
              "Graphite's HTTP address: the pages add graphite's graphs and /api/graphite answers.",
              ACTIVE, base=_BASE),
    make_flag("http-address", "string", "<addr>:<port> for the pages and the API.", ACTIVE,
              base=_BASE),
    make_flag("http-client-connect-timeout", "duration",
              "How long a connection to nsqd, nsqlookupd or graphite may take.", ACTIVE,
              base=_BASE),
    make_flag("http-client-request-timeout", "duration",
              "How long one request to nsqd, nsqlookupd or graphite may take in all.", ACTIVE,
              base=_BASE),
    make_flag("http-client-tls-cert", "string",
              "Client certificate for https:// nodes.", ACTIVE, base=_BASE),
    make_flag("http-client-tls-insecure-skip-verify", "bool",
              "Do not verify the certificates of https:// nodes.", ACTIVE, base=_BASE),
    make_flag("http-client-tls-key", "string", "Key of --http-client-tls-cert.", ACTIVE,
              base=_BASE),
    make_flag("http-client-tls-root-ca-file", "string",
              "CAs trusted for https:// nodes (PEM).", ACTIVE, base=_BASE),
    make_flag("log-level", "log-level",
              "Least severe messages to log: debug, info, warn, error or fatal (any case).",
              ACTIVE, base=_BASE),
    make_flag("log-prefix", "string", "Text put in front of every log line.", ACTIVE,
              base=_BASE),
    make_flag("lookupd-http-address", "strings", "An nsqlookupd's HTTP address.", ACTIVE,
              toml_key="nsqlookupd_http_addresses", base=_BASE),
    make_flag("notification-http-endpoint", "string",
              "URL that receives a JSON POST for each admin action.", ACTIVE, base=_BASE),
    make_flag("nsqd-http-address", "strings",
              "An nsqd's HTTP address (instead of nsqlookupd).", ACTIVE,
              toml_key="nsqd_http_addresses", base=_BASE),
    make_flag("proxy-graphite", "bool",
              "Proxy the pages' requests to graphite through /render.", ACTIVE, base=_BASE),
    make_flag("statsd-counter-format", "string",
              "How statsd names counters (%s is the key); must match your statsd.", ACTIVE,
              base=_BASE),
    make_flag("statsd-gauge-format", "string",
              "How statsd names gauges (%s is the key); must match your statsd.", ACTIVE,
              base=_BASE),
    make_flag("statsd-interval", "duration",
              "The nodes' --statsd-interval (graphite rates are per this interval).", ACTIVE,
              base=_BASE),
    make_flag("statsd-prefix", "string",
              "The nodes' --statsd-prefix (%s is the host).", ACTIVE, base=_BASE),
    make_flag("verbose", "bool", "Deprecated and ignored, as in nsqadmin; use --log-level.",
              ACTIVE, toml_key=None, base=_BASE),
    make_flag("version", "bool", "Print the version and exit.", ACTIVE, toml_key=None,
              base=_BASE),
    make_flag("history-interval", "duration",
              "nsqtw: how often the admin polls every node's /stats for the pages' rate and"
              " depth charts (0: never).", ACTIVE, base=_BASE),
    make_flag("history-window", "duration",
              "nsqtw: how much chart history is kept in memory.", ACTIVE, base=_BASE),
    make_flag("allow-origin", "strings",
              "nsqtw: an origin (scheme://host[:port]) whose pages may send actions besides the"
              " admin's own, such as the address of a proxy in front that rewrites Host.",
              ACTIVE, toml_key="allow_origins", base=_BASE),
    make_flag("allow-host", "strings",
              "nsqtw: a name (admin.example, .example for every name under it, * for any) the admin"
              " takes actions for besides its addresses, localhost and its hostname: the Host"
              " browsers reach it by through DNS or a proxy that keeps Host.",
              ACTIVE, toml_key="allow_hosts", base=_BASE),
)

ADMIN_FLAGS = FlagSet("nsqadmin", FLAGS, defaults, _validate)


def parse_args(argv: list[str]) -> AdminOptions:
    """Resolve nsqadmin's options: command line, then ``--config`` file, then default."""
    opts: AdminOptions = ADMIN_FLAGS.parse(argv)
    return opts


class AdminTwistdOptions(GoFlagsTwistdOptions):
    """twistd's options for the nsqtw-admin plugin: nsqadmin's flags."""

    synopsis = "[nsqadmin flags]"
    flagset = ADMIN_FLAGS
    command = "nsqtw-admin"

    def postOptions(self) -> None:
        if not self.resolved.version:  # twistd's pid file, in one line (--version prints and exits)
            refuse_running_pid_file(getattr(self, "parent", None))

    @property
    def admin(self) -> AdminOptions:
        opts: AdminOptions = self.resolved
        return opts
