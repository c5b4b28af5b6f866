"""Tests for nsqtw.nsqd.options: nsqd's flags, defaults, durations and config file."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import re
import shutil
import sys
import tempfile
import zlib

from twisted.trial.unittest import SynchronousTestCase

from nsqtw._go import flags
from nsqtw._go.duration import format_duration, parse_duration
from nsqtw._go.flags import OptionsError
from nsqtw.nsqd import cpus, options
from nsqtw.nsqd.options import (
    FLAGS,
    FLAGS_BY_NAME,
    NSQDOptions,
    NSQDTwistdOptions,
    defaults,
    node_id_for_hostname,
    parse_args,
)

# Go nsqd v1.3.0's defaults (nsqd/options.go NewOptions), in our units.
GO_DEFAULTS: dict[str, object] = {
    "config": "",
    "version": False,
    "log_level": "info",
    "log_prefix": "[nsqd] ",
    "verbose": False,
    "worker_id": False,
    "https_address": "0.0.0.0:4152",
    "http_address": "0.0.0.0:4151",
    "tcp_address": "0.0.0.0:4150",
    "auth_http_address": (),
    "auth_http_request_method": "get",
    "broadcast_tcp_port": 0,
    "broadcast_http_port": 0,
    "lookupd_tcp_address": (),
    "http_client_connect_timeout": 2.0,
    "http_client_request_timeout": 5.0,
    "data_path": "",
    "mem_queue_size": 10000,
    "max_bytes_per_file": 104857600,
    "sync_every": 2500,
    "sync_timeout": 2.0,
    "queue_scan_worker_pool_max": 4,
    "queue_scan_selection_count": 20,
    "msg_timeout": 60.0,
    "max_msg_timeout": 900.0,
    "max_msg_size": 1048576,
    "max_req_timeout": 3600.0,
    "max_body_size": 5242880,
    "max_heartbeat_interval": 60.0,
    "max_rdy_count": 2500,
    "max_output_buffer_size": 65536,
    "max_output_buffer_timeout": 30.0,
    "min_output_buffer_timeout": 0.025,
    "output_buffer_timeout": 0.25,
    "max_channel_consumers": 0,
    "statsd_address": "",
    "statsd_interval": 60.0,
    "statsd_mem_stats": True,
    "statsd_prefix": "nsq.%s",
    "statsd_udp_packet_size": 508,
    "statsd_exclude_ephemeral": False,
    "e2e_processing_latency_percentile": (),
    "e2e_processing_latency_window_time": 600.0,
    "tls_cert": "",
    "tls_key": "",
    "tls_client_auth_policy": "",
    "tls_root_ca_file": "",
    "tls_required": 0,
    "tls_min_version": 0x0301,
    "deflate": True,
    "max_deflate_level": 6,
    "snappy": True,
    "client_timeout": 60.0,
    "queue_scan_interval": 0.1,
    "queue_scan_refresh_interval": 5.0,
    "queue_scan_dirty_percent": 0.25,
}

# Every flag nsqd v1.3.0 defines (apps/nsqd/options.go).
GO_FLAG_NAMES = {
    "version", "config", "log-level", "log-prefix", "verbose", "node-id",
    "worker-id", "https-address", "http-address", "tcp-address",
    "auth-http-address", "auth-http-request-method", "broadcast-address",
    "broadcast-tcp-port", "broadcast-http-port", "lookupd-tcp-address",
    "http-client-connect-timeout", "http-client-request-timeout", "data-path",
    "mem-queue-size", "max-bytes-per-file", "sync-every", "sync-timeout",
    "queue-scan-worker-pool-max", "queue-scan-selection-count", "msg-timeout",
    "max-msg-timeout", "max-msg-size", "max-req-timeout", "max-body-size",
    "max-heartbeat-interval", "max-rdy-count", "max-output-buffer-size",
    "max-output-buffer-timeout", "min-output-buffer-timeout",
    "output-buffer-timeout", "max-channel-consumers", "statsd-address",
    "statsd-interval", "statsd-mem-stats", "statsd-prefix",
    "statsd-udp-packet-size", "statsd-exclude-ephemeral",
    "e2e-processing-latency-percentile", "e2e-processing-latency-window-time",
    "tls-cert", "tls-key", "tls-client-auth-policy", "tls-root-ca-file",
    "tls-required", "tls-min-version", "deflate", "max-deflate-level", "snappy",
}  # fmt: skip


def expected_node_id(hostname: str) -> int:
    return zlib.crc32(hashlib.md5(hostname.encode()).digest()) % 1024


class DefaultsTests(SynchronousTestCase):
    def test_every_default_matches_go(self) -> None:
        """Each attribute's default is Go nsqd's default, in our units."""
        opts = defaults("example.host")
        for name, want in GO_DEFAULTS.items():
            self.assertEqual(getattr(opts, name), want, name)

    def test_no_unchecked_attributes(self) -> None:
        """The default table covers every attribute but the hostname-derived two and nsqtw's own."""
        names = {f.name for f in dataclasses.fields(NSQDOptions)}
        self.assertEqual(names - set(GO_DEFAULTS),
                         {"node_id", "broadcast_address", "durable_delivery", "disk_threads",
                          "max_unwritten_bytes", "metrics_per_client", "busy_poll", "workers",
                          "http_allow_origin", "replicas", "replica_timeout", "replica_wait",
                          "replica_secret_file"})
        self.assertEqual(NSQDOptions().replica_secret_file, "")  # links not asked for proof (docs/replication.md)
        self.assertIs(NSQDOptions().durable_delivery, False)
        self.assertEqual(NSQDOptions().replicas, 1)  # docs/cluster.md, "Replication"
        self.assertEqual((NSQDOptions().replica_timeout, NSQDOptions().replica_wait), (10.0, 5.0))
        self.assertEqual(NSQDOptions().http_allow_origin, ())  # docs/http-api.md, "Requests from web pages"
        self.assertEqual(NSQDOptions().workers, 0)  # chosen from the CPUs (docs/configuration.md)
        self.assertEqual(NSQDOptions().busy_poll, 200e-6)  # docs/performance.md, "Busy polling"
        self.assertIs(NSQDOptions().metrics_per_client, False)
        self.assertEqual(NSQDOptions().disk_threads, 4)
        self.assertEqual(NSQDOptions().max_unwritten_bytes, 256 * 1024 * 1024)

    def test_hostname_defaults(self) -> None:
        """node_id is crc32(md5(hostname)) % 1024 and broadcast_address the hostname."""
        for host in ("example.host", "nsqd-1", "localhost", "ü.example"):
            opts = defaults(host)
            want = zlib.crc32(hashlib.md5(host.encode("utf-8")).digest()) % 1024
            self.assertEqual(opts.node_id, want)
            self.assertEqual(node_id_for_hostname(host), want)
            self.assertEqual(opts.broadcast_address, host)

    def test_defaults_use_real_hostname(self) -> None:
        """Without a hostname argument the machine's hostname is used."""
        import socket

        host = socket.gethostname()
        opts = defaults()
        self.assertEqual(opts.broadcast_address, host)
        self.assertEqual(opts.node_id, expected_node_id(host))
        self.assertEqual(parse_args([]), opts)

    def test_resolved_data_path(self) -> None:
        """An empty data path means the working directory; others become absolute."""
        self.assertEqual(defaults().resolved_data_path, os.getcwd())
        opts = parse_args(["--data-path=rel/dir"])
        self.assertEqual(opts.resolved_data_path, os.path.join(os.getcwd(), "rel/dir"))

    def test_options_are_frozen(self) -> None:
        """The options object cannot be changed after resolution."""
        with self.assertRaises(dataclasses.FrozenInstanceError):
            defaults().mem_queue_size = 1  # type: ignore[misc]


class FlagTableTests(SynchronousTestCase):
    def test_exactly_nsqds_flags(self) -> None:
        """FLAGS holds every nsqd v1.3.0 flag, and nothing more but nsqtw's own."""
        names = [f.name for f in FLAGS if f.name not in options.NSQTW_FLAGS]
        self.assertEqual(set(names), GO_FLAG_NAMES)
        self.assertEqual(len(names), len(GO_FLAG_NAMES))
        self.assertEqual(options.NSQTW_FLAGS, {"durable-delivery", "disk-threads", "max-unwritten-bytes",
                                               "metrics-per-client", "busy-poll", "workers",
                                               "http-allow-origin", "replicas", "replica-timeout",
                                               "replica-wait", "replica-secret-file"})

    def test_replica_secret_file_must_hold_a_secret(self) -> None:
        """--replica-secret-file (TOML replica_secret_file) names a readable, non-empty file of at most
        4096 bytes; anything else stops the start with one line that says why."""
        self.assertEqual(FLAGS_BY_NAME["replica-secret-file"].toml_key, "replica_secret_file")
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        good, empty, big = (os.path.join(d, n) for n in ("good", "empty", "big"))
        with open(good, "w") as f:
            f.write("s3cret\n")
        open(empty, "w").close()
        with open(big, "w") as f:
            f.write("x" * 4097)
        self.assertEqual(parse_args([f"--replica-secret-file={good}"]).replica_secret_file, good)
        for path, why in ((empty, "is empty"), (big, "is over 4096 bytes"),
                          (os.path.join(d, "missing"), "cannot be read: No such file or directory")):
            with self.assertRaises(OptionsError) as cm:
                parse_args([f"--replica-secret-file={path}"])
            self.assertEqual(str(cm.exception), f"--replica-secret-file {path!r} {why}")

    def test_records(self) -> None:
        """Each record names its attribute, default, status and TOML key consistently."""
        base = NSQDOptions()
        for f in FLAGS:
            self.assertEqual(f.attribute, f.name.replace("-", "_"))
            self.assertEqual(f.default, getattr(base, f.attribute))
            self.assertIn(f.status, (flags.ACTIVE, flags.NO_EFFECT))
            self.assertTrue(f.help)
            self.assertNotIn("\n", f.help)

    def test_toml_keys(self) -> None:
        """TOML keys follow nsqd's cfg tags; CLI-only flags are not read from the file."""
        keys = {f.name: f.toml_key for f in FLAGS}
        self.assertEqual(keys["lookupd-tcp-address"], "nsqlookupd_tcp_addresses")
        self.assertEqual(keys["auth-http-address"], "auth_http_addresses")
        self.assertEqual(
            keys["e2e-processing-latency-percentile"],
            "e2e_processing_latency_percentiles",
        )
        self.assertEqual(keys["node-id"], "id")
        self.assertEqual(keys["mem-queue-size"], "mem_queue_size")
        for name in ("config", "version", "verbose", "worker-id"):
            self.assertIsNone(keys[name])

    def test_disk_threads_flag(self) -> None:
        """--disk-threads takes 1 to 256 threads, on the command line and in the config file."""
        self.assertEqual(parse_args(["--disk-threads=2"]).disk_threads, 2)
        self.assertEqual(FLAGS_BY_NAME["disk-threads"].toml_key, "disk_threads")
        for bad in ("0", "257"):
            with self.assertRaises(OptionsError):
                parse_args([f"--disk-threads={bad}"])

    def test_workers_flag(self) -> None:
        """--workers is a count from 1 (one process) to 256, or 0 (the default: chosen from the CPUs);
        TOML key workers."""
        self.assertEqual(parse_args(["--workers=4"]).workers, 4)
        self.assertEqual(parse_args(["--workers=0"]).workers, 0)
        self.assertEqual(parse_args([]).workers, 0)
        self.assertEqual(FLAGS_BY_NAME["workers"].toml_key, "workers")
        for bad in ("-1", "257", "auto"):
            with self.assertRaises(OptionsError) as cm:
                parse_args([f"--workers={bad}"])
            self.assertIn("workers", str(cm.exception))

    def test_workers_chosen_from_the_cpus(self) -> None:
        """--workers=0: one process below 8 CPUs (2 cores: one process is ahead of Go on every
        load), half of them from 8, at most 8 (16 cores: 8 measured best); a count given stays."""
        self.assertEqual([cpus.auto_workers(n) for n in (1, 2, 4, 7, 8, 12, 16, 17, 64, 256)],
                         [1, 1, 1, 1, 4, 6, 8, 8, 8, 8])
        self.assertEqual(cpus.with_workers_resolved(NSQDOptions(), cpus=16).workers, 8)
        self.assertEqual(cpus.with_workers_resolved(NSQDOptions(), cpus=2).workers, 1)
        given = NSQDOptions(workers=3)
        self.assertIs(cpus.with_workers_resolved(given, cpus=16), given)
        if hasattr(os, "sched_getaffinity"):
            self.assertEqual(cpus.usable_cpus(), len(os.sched_getaffinity(0)))

    def test_busy_poll_flag(self) -> None:
        """--busy-poll is a Go duration from 0 (off) to 10ms, TOML key busy_poll."""
        self.assertEqual(parse_args(["--busy-poll=50us"]).busy_poll, 50e-6)
        self.assertEqual(parse_args(["-busy-poll", "0"]).busy_poll, 0.0)
        self.assertEqual(parse_args(["--busy-poll=10ms"]).busy_poll, 0.01)
        self.assertEqual(FLAGS_BY_NAME["busy-poll"].toml_key, "busy_poll")
        for bad in ("11ms", "-1us", "1s"):
            with self.assertRaises(OptionsError, msg=bad) as cm:
                parse_args([f"--busy-poll={bad}"])
            self.assertIn("--busy-poll", str(cm.exception))

    def test_http_allow_origin_flag(self) -> None:
        """--http-allow-origin is repeatable, takes origins only (scheme://host[:port]), TOML key http_allow_origins."""
        opts = parse_args(["--http-allow-origin=https://dash.example", "--http-allow-origin", "http://127.0.0.1:8080/"])
        self.assertEqual(opts.http_allow_origin, ("https://dash.example", "http://127.0.0.1:8080/"))
        self.assertEqual(FLAGS_BY_NAME["http-allow-origin"].toml_key, "http_allow_origins")
        for bad in ("dash.example", "ftp://x", "https://dash.example/app", "https://u@dash.example", "null",
                    "http://x?y", "*"):
            with self.assertRaises(OptionsError, msg=bad) as cm:
                parse_args([f"--http-allow-origin={bad}"])
            self.assertIn("--http-allow-origin must be an origin", str(cm.exception))

    def test_durable_delivery_flag(self) -> None:
        """--durable-delivery is a bool flag (bare means true) with TOML key durable_delivery."""
        self.assertIs(parse_args(["--durable-delivery"]).durable_delivery, True)
        self.assertIs(parse_args(["-durable-delivery=false"]).durable_delivery, False)
        self.assertEqual(FLAGS_BY_NAME["durable-delivery"].toml_key, "durable_delivery")
        self.assertEqual(FLAGS_BY_NAME["durable-delivery"].status, flags.ACTIVE)

    def test_statuses(self) -> None:
        """Every nsqd v1.3 flag is active, lookupd registration, TLS, auth, statsd and e2e included."""
        status = {f.name: f.status for f in FLAGS}
        for name in ("mem-queue-size", "msg-timeout", "tcp-address", "snappy", "tls-cert",
                     "https-address", "auth-http-address", "statsd-address",
                     "e2e-processing-latency-percentile", "lookupd-tcp-address"):
            self.assertEqual(status[name], flags.ACTIVE)
        # nsqtw keeps one timer per channel instead of nsqd's queue scan: those flags do nothing
        self.assertEqual([f.name for f in FLAGS if f.status != flags.ACTIVE],
                         ["queue-scan-worker-pool-max", "queue-scan-selection-count"])
        self.assertEqual({f.status for f in FLAGS if f.name.startswith("queue-scan-")}, {flags.NO_EFFECT})


class DurationTests(SynchronousTestCase):
    def test_parse(self) -> None:
        """Go duration strings become float seconds."""
        cases = {
            "300ms": 0.3,
            "1m30s": 90.0,
            "1.5h": 5400.0,
            "-2s": -2.0,
            "+5s": 5.0,
            "0": 0.0,
            "-0": 0.0,
            "60s": 60.0,
            "2ns": 2e-9,
            "3us": 3e-6,
            "3µs": 3e-6,
            "3μs": 3e-6,
            ".5s": 0.5,
            "1.s": 1.0,
            "1h2m3.5s": 3723.5,
        }
        for text, want in cases.items():
            self.assertAlmostEqual(parse_duration(text), want, places=12, msg=text)

    def test_parse_errors(self) -> None:
        """What Go's time.ParseDuration rejects raises ValueError."""
        for text in ("", "1", "1.5", "abc", "1sec", "1 s", ".s", "-", "s", "1e3s"):
            with self.assertRaises(ValueError, msg=text):
                parse_duration(text)

    def test_parse_overflow(self) -> None:
        """Durations beyond Go's int64 nanoseconds are rejected."""
        parse_duration("2562047h47m16.854775807s")
        with self.assertRaises(ValueError):
            parse_duration("2562047h47m16.854775808s")
        with self.assertRaises(ValueError):
            parse_duration("9999999999h")

    def test_format(self) -> None:
        """Seconds print as Go's Duration.String() does."""
        cases = {
            0.0: "0s",
            60.0: "1m0s",
            0.25: "250ms",
            3600.0: "1h0m0s",
            90.5: "1m30.5s",
            0.025: "25ms",
            1e-9: "1ns",
            1.5e-6: "1.5µs",
            2.0: "2s",
            -90.0: "-1m30s",
            5400.0: "1h30m0s",
            1.000000001: "1.000000001s",
        }
        for seconds, want in cases.items():
            self.assertEqual(format_duration(seconds), want)

    def test_round_trip(self) -> None:
        """Formatting then parsing gives the value back."""
        for text in ("1h0m0s", "250ms", "1m30.5s", "15m0s", "25ms", "0s"):
            self.assertEqual(format_duration(parse_duration(text)), text)


class CommandLineTests(SynchronousTestCase):
    def test_four_syntaxes(self) -> None:
        """-flag value, -flag=value, --flag value and --flag=value all work."""
        for argv in (
            ["-mem-queue-size", "7"],
            ["-mem-queue-size=7"],
            ["--mem-queue-size", "7"],
            ["--mem-queue-size=7"],
        ):
            self.assertEqual(parse_args(argv).mem_queue_size, 7, argv)

    def test_kinds(self) -> None:
        """Durations, strings and log levels parse into their attribute types."""
        opts = parse_args(
            [
                "--msg-timeout=90s",
                "--output-buffer-timeout",
                "100ms",
                "--tcp-address=127.0.0.1:0",
                "--log-level=WARN",
                "--log-prefix",
                "-x-",
                "--tls-min-version=TLS1.2",
                "--max-rdy-count=0x10",
            ]
        )
        self.assertEqual(opts.msg_timeout, 90.0)
        self.assertEqual(opts.output_buffer_timeout, 0.1)
        self.assertEqual(opts.tcp_address, "127.0.0.1:0")
        self.assertEqual(opts.log_level, "warn")
        self.assertEqual(opts.log_prefix, "-x-")
        self.assertEqual(opts.tls_min_version, 0x0303)
        self.assertEqual(opts.max_rdy_count, 16)

    def test_bools(self) -> None:
        """Bool flags: bare means true, =true/=false/=0/=1 as Go's ParseBool."""
        self.assertTrue(
            parse_args(["--statsd-exclude-ephemeral"]).statsd_exclude_ephemeral
        )
        self.assertTrue(
            parse_args(["-statsd-exclude-ephemeral=true"]).statsd_exclude_ephemeral
        )
        self.assertFalse(parse_args(["--snappy=false"]).snappy)
        self.assertFalse(parse_args(["-deflate=0"]).deflate)
        self.assertTrue(parse_args(["--version"]).version)
        self.assertTrue(parse_args(["--verbose", "--worker-id"]).verbose)

    def test_bool_does_not_take_next_argument(self) -> None:
        """A bare bool flag never swallows the following flag."""
        opts = parse_args(["--snappy", "--mem-queue-size=3"])
        self.assertTrue(opts.snappy)
        self.assertEqual(opts.mem_queue_size, 3)
        with self.assertRaises(OptionsError) as cm:
            parse_args(["--snappy", "false"])
        self.assertIn("-snappy=false", str(cm.exception))

    def test_tls_required(self) -> None:
        """--tls-required takes true/false/tcp-https, bare means true."""
        tls = ["--tls-cert=c.pem", "--tls-key=k.pem"]
        self.assertEqual(parse_args([*tls, "--tls-required"]).tls_required, 1)
        self.assertEqual(parse_args([*tls, "--tls-required=true"]).tls_required, 1)
        self.assertEqual(parse_args([*tls, "--tls-required=TCP-HTTPS"]).tls_required, 2)
        self.assertEqual(parse_args(["--tls-required=false"]).tls_required, 0)

    def test_repeatable(self) -> None:
        """Repeatable flags accumulate in order; percentiles also split on commas."""
        opts = parse_args(
            [
                "--lookupd-tcp-address",
                "a:4160",
                "--lookupd-tcp-address=b:4160",
                "-auth-http-address=http://auth/",
                "--e2e-processing-latency-percentile=0.5,1.0",
                "--e2e-processing-latency-percentile",
                "0.99",
            ]
        )
        self.assertEqual(opts.lookupd_tcp_address, ("a:4160", "b:4160"))
        self.assertEqual(opts.auth_http_address, ("http://auth/",))
        # nsqd keeps them largest first
        self.assertEqual(opts.e2e_processing_latency_percentile, (1.0, 0.99, 0.5))

    def test_last_scalar_wins(self) -> None:
        """A scalar flag given twice keeps the last value, as Go's flag package."""
        self.assertEqual(parse_args(["--sync-every=1", "--sync-every=2"]).sync_every, 2)

    def test_double_dash_ends_flags(self) -> None:
        """A lone -- ends the flags, as in Go."""
        self.assertEqual(parse_args(["--sync-every=1", "--"]).sync_every, 1)

    def test_errors(self) -> None:
        """Bad input raises OptionsError with one clear line."""
        cases = {
            (
                "--mem-queue-size=abc",
            ): 'invalid value "abc" for flag -mem-queue-size: parse error',
            ("--bogus",): "flag provided but not defined: -bogus",
            ("-bogus=1",): "flag provided but not defined: -bogus",
            ("positional",): 'unexpected argument "positional": nsqd takes only flags',
            ("--", "x"): 'unexpected argument "x": nsqd takes only flags',
            (
                "--snappy=maybe",
            ): 'invalid boolean value "maybe" for -snappy: parse error',
            ("--mem-queue-size",): "flag needs an argument: -mem-queue-size",
            ("---x",): "bad flag syntax: ---x",
            (
                "--msg-timeout=60",
            ): 'invalid value "60" for flag -msg-timeout: parse error',
            ("--max-rdy-count=99999999999999999999",): (
                'invalid value "99999999999999999999" for flag -max-rdy-count:'
                " value out of range"
            ),
        }
        for argv, want in cases.items():
            with self.assertRaises(OptionsError, msg=argv) as cm:
                parse_args(list(argv))
            self.assertEqual(str(cm.exception), want)

    def test_validation(self) -> None:
        """Values nsqd refuses at start are refused here, each in one line."""
        for argv in (
            ["--node-id=1024"],
            ["--node-id=-1"],
            ["--max-deflate-level=0"],
            ["--max-deflate-level=10"],
            ["--log-level=loud"],
            ["--tls-min-version=tls9"],
            ["--tls-required=maybe"],
            ["--tls-required"],
            ["--tls-cert=only-cert.pem"],
            ["--tls-client-auth-policy=sometimes"],
            ["--auth-http-request-method=put"],
            ["--e2e-processing-latency-percentile=0"],
            ["--e2e-processing-latency-percentile=1.5"],
            ["--e2e-processing-latency-percentile=x"],
            ["--statsd-address=127.0.0.1:8125", "--statsd-interval=999ms"],
            ["--broadcast-tcp-port=70000"],
            ["--disk-threads=0"],
            ["--max-unwritten-bytes=1000"],  # under --max-msg-size: no publish could ever be taken
        ):
            with self.assertRaises(OptionsError, msg=argv) as cm:
                parse_args(argv)
            self.assertTrue(str(cm.exception))
            self.assertNotIn("\n", str(cm.exception))

    def test_valid_edges(self) -> None:
        """The ends of each allowed range are accepted."""
        opts = parse_args(
            [
                "--node-id=0",
                "--max-deflate-level=9",
                "--tls-client-auth-policy=require-verify",
                "--e2e-processing-latency-percentile=1",
                "--statsd-address=127.0.0.1:8125",
                "--statsd-interval=1s",
                "--auth-http-request-method=post",
                "--max-unwritten-bytes=1048576",
            ]
        )
        self.assertEqual(opts.max_unwritten_bytes, 1 << 20)
        self.assertEqual(opts.node_id, 0)
        self.assertEqual(opts.max_deflate_level, 9)
        self.assertEqual(parse_args(["--node-id=1023"]).node_id, 1023)

    def test_help(self) -> None:
        """-h and --help ask for the usage listing."""
        for arg in ("-h", "--help", "-help"):
            with self.assertRaises(flags.HelpRequested):
                parse_args([arg])


class ConfigFileTests(SynchronousTestCase):
    def setUp(self) -> None:
        # tempfile rather than mktemp(): mktemp leaves directories behind under pytest
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir)
        self.count = 0

    def write(self, text: str) -> str:
        self.count += 1
        path = os.path.join(self.dir, f"nsqd{self.count}.toml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def test_priority(self) -> None:
        """Command line beats the config file, which beats the default."""
        path = self.write(
            'mem_queue_size = 500\nmax_rdy_count = 40\nnsqlookupd_tcp_addresses = ["f:4160"]\n'
        )
        opts = parse_args(
            ["--config", path, "--mem-queue-size=7", "--lookupd-tcp-address=c:4160"]
        )
        self.assertEqual(opts.mem_queue_size, 7)
        self.assertEqual(opts.max_rdy_count, 40)
        self.assertEqual(opts.sync_every, 2500)
        self.assertEqual(opts.lookupd_tcp_address, ("c:4160",))
        self.assertEqual(opts.config, path)

    def test_durable_delivery_key(self) -> None:
        """The config file turns on --durable-delivery with durable_delivery = true."""
        self.assertIs(parse_args(["--config", self.write("durable_delivery = true\n")]).durable_delivery, True)

    def test_http_allow_origins_key(self) -> None:
        """The config file lists the origins nsqd's HTTP API takes pages' requests from."""
        path = self.write('http_allow_origins = ["https://dash.example", "http://[::1]:8080"]\n')
        self.assertEqual(parse_args(["--config", path]).http_allow_origin,
                         ("https://dash.example", "http://[::1]:8080"))

    def test_order_does_not_matter(self) -> None:
        """A flag before --config still beats the file."""
        path = self.write("mem_queue_size = 500\n")
        opts = parse_args(["--mem-queue-size=7", f"--config={path}"])
        self.assertEqual(opts.mem_queue_size, 7)

    def test_keys_and_kinds(self) -> None:
        """nsqd's TOML keys and value types are understood."""
        path = self.write(
            """\
id = 42
log_level = "DEBUG"
tcp_address = "127.0.0.1:4150"
nsqlookupd_tcp_addresses = ["a:4160", "b:4160"]
auth_http_addresses = "x:1,y:2"
e2e_processing_latency_percentiles = [0.5, 1]
snappy = false
deflate = "false"
max_rdy_count = "99"
tls_required = "tcp-https"
tls_cert = "c.pem"
tls_key = "k.pem"
tls_min_version = "tls1.2"
some_unknown_key = "ignored, as nsqd does"
[unknown_table]
x = 1
"""
        )
        opts = parse_args(["--config", path])
        self.assertEqual(opts.node_id, 42)
        self.assertEqual(opts.log_level, "debug")
        self.assertEqual(opts.tcp_address, "127.0.0.1:4150")
        self.assertEqual(opts.lookupd_tcp_address, ("a:4160", "b:4160"))
        self.assertEqual(opts.auth_http_address, ("x:1", "y:2"))
        self.assertEqual(opts.e2e_processing_latency_percentile, (0.5, 1.0))
        self.assertFalse(opts.snappy)
        self.assertFalse(opts.deflate)
        self.assertEqual(opts.max_rdy_count, 99)
        self.assertEqual(opts.tls_required, 2)
        self.assertEqual(opts.tls_min_version, 0x0303)

    def test_tls_required_bool(self) -> None:
        """tls_required may be a TOML bool, as nsqd formats then parses it."""
        path = self.write('tls_required = true\ntls_cert = "c"\ntls_key = "k"\n')
        self.assertEqual(parse_args(["--config", path]).tls_required, 1)

    def test_empty_tls_min_version_keeps_default(self) -> None:
        """An empty tls_min_version leaves the default, as nsqd drops the key."""
        path = self.write('tls_min_version = ""\n')
        self.assertEqual(parse_args(["--config", path]).tls_min_version, 0x0301)

    def test_durations(self) -> None:
        """Durations in the file are strings or integer milliseconds (go-options)."""
        path = self.write('msg_timeout = "90s"\nsync_timeout = 1500\n')
        opts = parse_args(["--config", path])
        self.assertEqual(opts.msg_timeout, 90.0)
        self.assertEqual(opts.sync_timeout, 1.5)

    def test_validation_applies_to_file(self) -> None:
        """Range checks apply to values from the file too."""
        path = self.write("max_deflate_level = 12\n")
        with self.assertRaises(OptionsError) as cm:
            parse_args(["--config", path])
        self.assertIn("--max-deflate-level", str(cm.exception))

    def test_bad_values(self) -> None:
        """A value of the wrong type or shape is one line naming the file and key."""
        for text in (
            'mem_queue_size = "lots"',
            "mem_queue_size = 1.5",
            'msg_timeout = "60"',
            "msg_timeout = 1.5",
            'snappy = "maybe"',
            "snappy = 1",
            "tcp_address = 4150",
            "nsqlookupd_tcp_addresses = [1, 2]",
            'log_level = "loud"',
            'tls_min_version = "tls9"',
            'tls_required = "maybe"',
        ):
            path = self.write(text + "\n")
            with self.assertRaises(OptionsError, msg=text) as cm:
                parse_args(["--config", path])
            message = str(cm.exception)
            self.assertNotIn("\n", message)
            self.assertIn(path, message)
            self.assertIn(text.split(" ")[0], message)

    def test_unreadable(self) -> None:
        """A missing file is a one-line error."""
        path = os.path.join(self.dir, "missing.toml")
        with self.assertRaises(OptionsError) as cm:
            parse_args(["--config", path])
        self.assertEqual(
            str(cm.exception),
            f"failed to load config file {path} - No such file or directory",
        )

    def test_not_toml(self) -> None:
        """A file that is not TOML is a one-line error."""
        path = self.write("this is = = not toml\n[[\n")
        with self.assertRaises(OptionsError) as cm:
            parse_args(["--config", path])
        self.assertTrue(
            str(cm.exception).startswith(f"failed to load config file {path} - ")
        )
        self.assertNotIn("\n", str(cm.exception))


class TwistdOptionsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.stdout = io.StringIO()
        self.stderr = io.StringIO()
        self.patch(sys, "stdout", self.stdout)
        self.patch(sys, "stderr", self.stderr)

    def test_success_stores_options(self) -> None:
        """parseOptions resolves Go-style flags into .nsqd (and the dict)."""
        config = NSQDTwistdOptions()
        config.parseOptions(["-mem-queue-size", "5", "--snappy=false"])
        self.assertIsInstance(config.nsqd, NSQDOptions)
        self.assertEqual(config.nsqd.mem_queue_size, 5)
        self.assertFalse(config.nsqd.snappy)
        self.assertEqual(config["mem_queue_size"], 5)
        self.assertEqual(self.stderr.getvalue(), "")

    def test_failure_exits_with_one_line(self) -> None:
        """A bad flag prints one prefixed line on stderr and exits 1."""
        config = NSQDTwistdOptions()
        with self.assertRaises(SystemExit) as cm:
            config.parseOptions(["--bogus"])
        self.assertEqual(cm.exception.code, 1)
        self.assertEqual(
            self.stderr.getvalue(), "nsqtw: flag provided but not defined: -bogus\n"
        )

    def test_help_lists_every_flag(self) -> None:
        """--help prints every flag with its default and exits 0."""
        config = NSQDTwistdOptions()
        with self.assertRaises(SystemExit) as cm:
            config.parseOptions(["--help"])
        self.assertEqual(cm.exception.code, 0)
        out = self.stdout.getvalue()
        for f in FLAGS:
            self.assertIn(f"--{f.name}", out)
        self.assertIn("(default 1m0s)", out)
        self.assertIn("(default 10000)", out)
        self.assertEqual(FLAGS_BY_NAME["msg-timeout"].default_text, "1m0s")


class HelpLayoutTests(SynchronousTestCase):
    def test_zero_defaults_left_out_as_go_does(self) -> None:
        """--help prints no "(default ...)" for zero values (false, "", 0), as Go's flag package."""
        from nsqtw.nsqd.options import usage_text

        text = usage_text()
        entries = dict(re.findall(r"  --([a-z0-9-]+)[^\n]*\n        ([^\n]*)", text))
        self.assertNotIn("(default", entries["worker-id"])
        self.assertNotIn("(default", entries["config"])
        self.assertNotIn("(default", entries["broadcast-tcp-port"])
        self.assertNotIn("see below", text)
        self.assertTrue(entries["msg-timeout"].endswith("(default 1m0s)"))
        self.assertTrue(entries["deflate"].endswith("(default true)"))
