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

import hashlib
import os
import socket
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial

from nsqtw._go.duration import format_duration
from nsqtw._go.flags import (
    ACTIVE,
    NO_EFFECT,
    TLS_MIN_VERSIONS,
    TLS_NOT_REQUIRED,
    TLS_VERSION_NAMES,
    Flag,
    FlagSet,
    GoFlagsTwistdOptions,
    OptionsError,
    make_flag,
)
from nsqtw._go.strconv import quote as _quote
from nsqtw.core.unwritten import DEFAULT_MAX_UNWRITTEN
from nsqtw.http.origin import is_origin
from nsqtw.net.busypoll import DEFAULT_LIMIT as DEFAULT_BUSY_POLL
from nsqtw.net.launch import refuse_running_pid_file
from nsqtw.replica.proof import SecretError, read_secret

__all__ = [
    "FLAGS",
    "FLAGS_BY_NAME",
    "FLAGS_BY_TOML_KEY",
    "NSQD_FLAGS",
    "NSQTW_FLAGS",
    "NSQDOptions",
    "NSQDTwistdOptions",
    "defaults",
    "node_id_for_hostname",
    "parse_args",
    "usage_text",
]

_TLS_CLIENT_AUTH_POLICIES = ("", "require", "require-verify")
_AUTH_METHODS = ("get", "post")

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
    disk_threads: int = 4
    max_unwritten_bytes: int = DEFAULT_MAX_UNWRITTEN
    metrics_per_client: bool = False
    busy_poll: float = DEFAULT_BUSY_POLL
    workers: int = 0  # chosen from the CPUs (nsqtw.nsqd.cpus)
    http_allow_origin: tuple[str, ...] = ()
    replicas: int = 1
    replica_timeout: float = 10.0
    replica_wait: float = 5.0
    replica_secret_file: str = ""
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
        return TLS_VERSION_NAMES.get(self.tls_min_version, str(self.tls_min_version))

    @property
    def tls_enabled(self) -> bool:
        """nsqd offers TLS only when it has a certificate and key."""
        return bool(self.tls_cert or self.tls_key)

    @property
    def needs_openssl(self) -> bool:
        """Whether this node can ever use pyOpenSSL: a server certificate, or trust for auth servers.

        Any ``--auth-http-address`` counts, even a plain ``http://`` one: an
        auth server's 403 answer may send nsqd to its ``https_port``.
        """
        return bool(self.tls_cert or self.tls_key or self.tls_root_ca_file or self.auth_http_address)


def defaults(hostname: str | None = None) -> NSQDOptions:
    """nsqd's defaults; ``node_id`` and ``broadcast_address`` come from ``hostname``.

    Without an argument the hostname is looked up now, as nsqd does at start.
    """
    host = _hostname() if hostname is None else hostname
    return NSQDOptions(node_id=node_id_for_hostname(host), broadcast_address=host)


# --- the flag table -----------------------------------------------------------


_BASE = NSQDOptions()
_flag = partial(make_flag, base=_BASE)


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
        "config", "string", "Path to a TOML config file; its keys are the TOML keys in docs/configuration.md.",
        _A, toml_key=None,
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
        NO_EFFECT,
    ),
    _flag(
        "queue-scan-selection-count",
        "int",
        "In nsqd, how many channels each scan samples for timed-out messages."
        + _QUEUE_SCAN_NOTE,
        NO_EFFECT,
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
    _flag(
        "disk-threads",
        "int",
        "nsqtw only: threads doing the disk work of every disk queue and journal (each queue keeps"
        " its own order); the thread count does not grow with topics and channels.",
        _A,
    ),
    _flag(
        "max-unwritten-bytes",
        "int",
        "nsqtw only: bytes of messages the node keeps in memory while its disk queues cannot"
        " write them (disk behind, full or failing), over all topics and channels; past it"
        " publishers wait (TCP is not read, HTTP answers 503 after 10s) and topics hold their"
        " hand-offs to channels (see docs/storage.md).",
        _A,
    ),
    _flag(
        "metrics-per-client",
        "bool",
        "nsqtw only: also export one series per connected client on /metrics (its RDY, in"
        " flight, message, FIN and REQ counts); off, series are per topic and channel only"
        " (see docs/metrics.md).",
        _A,
    ),
    _flag(
        "workers",
        "int",
        "nsqtw only: with more than 1, client connections are served by this many worker"
        " processes sharing the TCP address, beside the process that owns every topic and channel"
        " and serves HTTP; 1 serves everything in one process; 0 chooses from the CPUs this process"
        " may use: 1 below 8, else half of them, at most 8 (see docs/configuration.md).",
        _A,
    ),
    _flag(
        "busy-poll",
        "duration",
        "nsqtw only: while events arrive, and are handled, in less than this, the reactor looks"
        " for the next one this long before it sleeps, as Go's scheduler spins: quicker one-command"
        " round trips, at the cost of a busy core while traffic is brisk; 0 turns it off,"
        " at most 10ms (see docs/performance.md).",
        _A,
    ),
    _flag(
        "http-allow-origin",
        "strings",
        "nsqtw only: an origin (scheme://host[:port]) whose web pages may publish and change"
        " topics and channels over HTTP(S); every other request a browser marks as sent by a page"
        " (Origin, Sec-Fetch-Site) that would change state is refused with 403. Requests without"
        " those headers (curl, NSQ clients and tools) are not affected (see docs/http-api.md).",
        _A,
        toml_key="http_allow_origins",
    ),
    _flag(
        "replicas",
        "int",
        "nsqtw only: 2 answers a publish only once another nsqtw node with --replicas=2, found"
        " through nsqlookupd, holds a copy, and that node delivers the copies if this one is lost;"
        " 1 (the default) replicates nothing (see docs/replication.md).",
        _A,
    ),
    _flag(
        "replica-timeout",
        "duration",
        "nsqtw only, with --replicas=2: a node silent this long (and its /ping failing) is lost: its"
        " replica delivers its copies (a third of it: a silent replica is replaced).",
        _A,
    ),
    _flag(
        "replica-wait",
        "duration",
        "nsqtw only, with --replicas=2: how long a publish waits for a replica's acknowledgement"
        " before it is refused (E_PUB_FAILED, HTTP 503 NO_REPLICA); the message stays queued here.",
        _A,
    ),
    _flag(
        "replica-secret-file",
        "string",
        "nsqtw only, with --replicas=2: a file holding the cluster's replica secret (the same on every"
        " node); a peer's replication link is taken only once it proves it knows it (see docs/replication.md).",
        _A,
    ),
)

#: the longest ``--busy-poll`` accepted: a spin is CPU spent for latency, worth it only when short
MAX_BUSY_POLL = 0.01

#: the most ``--workers``: a process each, beyond any machine's use for one node
MAX_WORKERS = 256

#: flags nsqtw adds to nsqd's
NSQTW_FLAGS = frozenset({"durable-delivery", "disk-threads", "max-unwritten-bytes", "metrics-per-client",
                         "busy-poll", "workers", "http-allow-origin", "replicas", "replica-timeout",
                         "replica-wait", "replica-secret-file"})

FLAGS_BY_NAME: Mapping[str, Flag] = {f.name: f for f in FLAGS}
FLAGS_BY_TOML_KEY: Mapping[str, Flag] = {f.toml_key: f for f in FLAGS if f.toml_key}


# --- checks nsqd makes before it starts ---------------------------------------------


def _validate(opts: NSQDOptions) -> None:
    """Refuse combinations nsqd refuses at start, each with a one-line reason."""
    if not 0 <= opts.node_id < 1024:
        raise OptionsError(f"--node-id must be in [0,1024), got {opts.node_id}")
    if not 1 <= opts.disk_threads <= 256:
        raise OptionsError(f"--disk-threads must be in [1,256], got {opts.disk_threads}")
    if not 0 <= opts.workers <= MAX_WORKERS:
        raise OptionsError(f"--workers must be in [0,{MAX_WORKERS}] (0: chosen from the CPUs), got {opts.workers}")
    for origin in opts.http_allow_origin:
        if not is_origin(origin):
            raise OptionsError(f"--http-allow-origin must be an origin, as scheme://host[:port], got {_quote(origin)}")
    if opts.replicas not in (1, 2):
        raise OptionsError(f"--replicas must be 1 or 2, got {opts.replicas}")
    if opts.replica_timeout < 1.0:
        raise OptionsError(f"--replica-timeout must be at least 1s, got {format_duration(opts.replica_timeout)}")
    if opts.replica_wait <= 0:
        raise OptionsError(f"--replica-wait must be more than 0, got {format_duration(opts.replica_wait)}")
    if opts.replica_secret_file:
        try:
            read_secret(opts.replica_secret_file)
        except SecretError as e:
            raise OptionsError(str(e)) from None
    if not 0 <= opts.busy_poll <= MAX_BUSY_POLL:
        raise OptionsError(f"--busy-poll must be in [0,10ms], got {format_duration(opts.busy_poll)}")
    if opts.max_unwritten_bytes < opts.max_msg_size:
        raise OptionsError(f"--max-unwritten-bytes ({opts.max_unwritten_bytes}) must be at least"
                           f" --max-msg-size ({opts.max_msg_size})")
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


#: nsqd's flags
NSQD_FLAGS = FlagSet("nsqd", FLAGS, defaults, _validate)


def parse_args(argv: list[str], hostname: str | None = None) -> NSQDOptions:
    """Resolve nsqd's options from ``argv``: command line, then ``--config`` file, then default.

    Raises :class:`OptionsError` (one line) for anything nsqd would refuse, and
    :class:`HelpRequested` for ``-h``/``--help``.
    """
    opts: NSQDOptions = NSQD_FLAGS.parse(argv, hostname)
    return opts


def usage_text(program: str = "twistd nsqtw") -> str:
    """nsqd's ``--help`` listing."""
    return NSQD_FLAGS.usage(program)


class NSQDTwistdOptions(GoFlagsTwistdOptions):
    """twistd's options for the nsqtw plugin: nsqd's flags, resolved into :attr:`nsqd`."""

    synopsis = "[nsqd flags]"
    flagset = NSQD_FLAGS

    def postOptions(self) -> None:
        if not self.resolved.version:  # twistd's pid file, in one line (--version prints and exits)
            refuse_running_pid_file(getattr(self, "parent", None))

    @property
    def nsqd(self) -> NSQDOptions:
        opts: NSQDOptions = self.resolved
        return opts
