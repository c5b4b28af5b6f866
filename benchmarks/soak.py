"""Soak test (not run in CI): mixed load on a real nsqtw for minutes, with periodic restarts or disk faults.

    python benchmarks/soak.py --minutes 10
    python benchmarks/soak.py --minutes 4 --disk-faults [--fault-every 20] [--fault-for 8] [--fault tmpfs|inject]

Starts nsqtw (``twistd -n nsqtw`` on loopback) with ``--mem-queue-size=0
--sync-every=1`` and runs, for the whole time, publishers (PUB, MPUB and
DPUB) and consumers on two channels that FIN every message. Every
``--restart-every`` seconds the daemon is stopped, alternately with SIGTERM
and kill -9, and started again on the same ports and data path; the clients
reconnect. At the end the load stops, the daemon is restarted once more and
both channels are drained.

With ``--disk-faults`` the daemon's disk fills and frees in cycles instead
(no restarts unless ``--restart-every`` is given too): every
``--fault-every`` seconds the disk is full for ``--fault-for`` seconds, then
gets its space back. ``--fault=tmpfs`` (the default; needs root) puts the
data path on a small tmpfs that a filler file fills to the last byte (kept
full while the consumers' finished segments are deleted) and frees by
deleting it; ``--fault=inject`` (used too when mounting fails) makes the
disk queues' writes fail with ENOSPC through ``tests/reliability/faults.py``.
``/ping`` is sampled throughout: a cycle's health told the truth when it
turned ``NOK`` during the fault, said ``OK`` no more once it had, and was
``OK`` again after the space returned and stayed so. Publishes answered
``E_*_FAILED`` or not answered at all are not acknowledged; they may still be
delivered (at-least-once) and are counted apart.

It prints, per daemon lifetime, the daemon's RSS a few seconds after start
and at its end, and finally the totals: messages acknowledged, received per
channel, lost (acknowledged and never received on a channel) and duplicated
(received more than once: at-least-once after a crash). Lost messages are
split into those a kill -9 is documented to lose (in flight or deferred at
the kill: they live in memory, as in Go nsqd) and unexplained ones; exit
status 1 if there are unexplained ones, or if health did not tell the truth
in a disk-fault cycle.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import http.client
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.daemon import Daemon  # noqa: E402
from tests.rawclient import FRAME_ERROR, FRAME_MESSAGE, HEARTBEAT, OK, Client, Closed, Msg  # noqa: E402

TOPIC = "soak"
CHANNELS = ("a", "b")
NETWORK_ERRORS = (Closed, OSError, TimeoutError, AssertionError)
#: how long a publisher waits for its answer (a full disk may hold it) before it reconnects
ANSWER_TIMEOUT = 30.0


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def ping(address: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """``GET /ping``: (status, body), (0, b"") when there was no answer."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", "/ping")
        r = conn.getresponse()
        return r.status, r.read()
    except (OSError, http.client.HTTPException):
        return 0, b""
    finally:
        conn.close()


def create_channels(address: str) -> None:
    """Create the topic and both channels before any publish: a channel gets only what is published after it exists."""
    host, port = address.rsplit(":", 1)
    for path in [f"/topic/create?topic={TOPIC}"] + [f"/channel/create?topic={TOPIC}&channel={c}" for c in CHANNELS]:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            conn.request("POST", path)
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                raise RuntimeError(f"POST {path}: {r.status}")
        finally:
            conn.close()


# -- disk faults ------------------------------------------------------------


def fill_up(path: str) -> int:
    """Append to the file ``path`` until its filesystem has no byte left; returns the bytes written."""
    written = 0
    with open(path, "ab", buffering=0) as f:
        for size in (1 << 20, 65536, 1):  # then the last partial chunks
            try:
                while True:
                    written += f.write(b"\0" * size) or 0
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
    return written


class TmpfsFault:
    """The data path on a small tmpfs; a filler file takes all its free space while the disk is full."""

    name = "tmpfs"

    def __init__(self, root: str, size_mib: int) -> None:
        self.mount_point = os.path.join(root, "fs")
        os.makedirs(self.mount_point, exist_ok=True)
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", self.mount_point],
                                capture_output=True)
        if result.returncode != 0:
            raise OSError(result.stderr.decode().strip() or f"mount exited {result.returncode}")
        self.size_mib = size_mib
        self.data_path = os.path.join(self.mount_point, "data")
        os.makedirs(self.data_path)
        self.filler = os.path.join(self.mount_point, "filler")

    def daemon(self, *args: str) -> Daemon:
        return Daemon(self.data_path, *args)

    def describe(self) -> str:
        return f"data path on a {self.size_mib} MiB tmpfs filled by a filler file"

    def fill(self) -> None:
        fill_up(self.filler)

    def keep_full(self) -> None:
        """Take the space the daemon freed meanwhile (finished segments deleted) too."""
        fill_up(self.filler)

    def free(self) -> None:
        try:
            os.unlink(self.filler)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self.free()
        subprocess.run(["umount", "-l", self.mount_point], capture_output=True)


class InjectedFault:
    """Writes of the disk queues fail with ENOSPC (and fsyncs with EIO, optionally) while a flag file exists."""

    name = "inject"

    def __init__(self, root: str, fsync: bool) -> None:
        from tests.reliability.faults import faulty_daemon_code

        self.data_path = os.path.join(root, "data")
        os.makedirs(self.data_path, exist_ok=True)
        self.flags = [os.path.join(root, "disk-is-full")]
        self.env = {"NSQTW_TEST_DISK_FULL_FLAG": self.flags[0]}
        if fsync:
            self.flags.append(os.path.join(root, "fsync-fails"))
            self.env["NSQTW_TEST_FSYNC_FAIL_FLAG"] = self.flags[1]
        self.code = faulty_daemon_code()

    def daemon(self, *args: str) -> Daemon:
        return Daemon(self.data_path, *args, code=self.code, env=self.env)

    def describe(self) -> str:
        return "writes fail with ENOSPC" + (" and fsyncs with EIO" if len(self.flags) > 1 else "") + \
            " (tests/reliability/faults.py)"

    def fill(self) -> None:
        for flag in self.flags:
            open(flag, "w").close()

    def keep_full(self) -> None:
        pass

    def free(self) -> None:
        for flag in self.flags:
            try:
                os.unlink(flag)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        self.free()


DiskFault = TmpfsFault | InjectedFault


@dataclasses.dataclass
class Verdict:
    """What ``/ping`` said in one fault cycle (times in seconds from the fill and from the free)."""

    nok_after: float | None  # first NOK after the fill
    first_nok: bytes
    ok_while_full: int  # OK answers after that, the disk still full
    ok_after: float | None  # first OK after the space returned
    nok_after_recovery: int  # NOK answers after that, until the next fill

    @property
    def truthful(self) -> bool:
        return (self.nok_after is not None and self.ok_while_full == 0 and self.ok_after is not None
                and self.nok_after_recovery == 0)


def health_verdict(samples: list[tuple[float, int, bytes]], filled: float, freed: float, until: float) -> Verdict:
    """Judge the ``/ping`` answers ``(time answered, status, body)`` of one cycle.

    The disk was full from ``filled`` to ``freed``; the cycle ends at
    ``until`` (the next fill, or the end of the load). OK before the first
    failed write and NOK before the first retry succeeds are both true;
    no answer (status 0, e.g. during a restart) says nothing.
    """
    nok_at: float | None = None
    first_nok = b""
    ok_while_full = 0
    ok_at: float | None = None
    nok_after_recovery = 0
    for t, status, body in samples:
        if filled <= t < freed:
            if status == 500 and nok_at is None:
                nok_at, first_nok = t, body
            elif status == 200 and nok_at is not None:
                ok_while_full += 1
        elif freed <= t < until:
            if status == 200 and ok_at is None:
                ok_at = t
            elif status == 500 and ok_at is not None:
                nok_after_recovery += 1
    return Verdict(None if nok_at is None else nok_at - filled, first_nok, ok_while_full,
                   None if ok_at is None else ok_at - freed, nok_after_recovery)


# -- the soak ---------------------------------------------------------------


class Soak:
    def __init__(self, daemon: Daemon, restart_every: float | None, faults: DiskFault | None = None,
                 fault_every: float = 20.0, fault_for: float = 8.0) -> None:
        self.daemon = daemon
        self.restart_every = restart_every
        self.faults = faults
        self.fault_every = fault_every
        self.fault_for = fault_for
        self.address = ""
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.acked: set[bytes] = set()
        #: published but not acknowledged: answered E_*_FAILED, or no answer (held, then timed out or cut)
        self.failed: set[bytes] = set()
        self.unanswered: set[bytes] = set()
        self.received: dict[str, dict[bytes, int]] = {c: {} for c in CHANNELS}
        #: when each message was first received, per channel, and when each restart happened
        self.first_seen: dict[str, dict[bytes, float]] = {c: {} for c in CHANNELS}
        self.restarts: list[tuple[float, str]] = []
        self.lifetimes: list[tuple[str, int, int, int]] = []
        #: disk-fault cycles (filled, freed) and /ping answers (time, status, body)
        self.cycles: list[tuple[float, float]] = []
        self.pings: list[tuple[float, int, bytes]] = []
        self.verdicts: list[Verdict] = []
        self.ack_counts: list[int] = []  # len(acked) when each ping was answered
        #: per cycle, messages acknowledged once /ping said NOK and before the space returned
        self.acked_while_nok: list[int] = []
        self.tracebacks = 0
        self.began = time.monotonic()

    # -- clients (each reconnects until told to stop) ---------------------

    def _connect(self) -> Client | None:
        while not self.stop.is_set():
            try:
                return Client(self.address, timeout=10)
            except OSError:
                time.sleep(0.2)
        return None

    def publisher(self, kind: str, n: int) -> None:
        seq = 0
        while not self.stop.is_set():
            c = self._connect()
            if c is None:
                return
            bodies: list[bytes] = []  # sent, not yet answered
            try:
                while not self.stop.is_set():
                    if kind == "mpub":
                        bodies = [b"%s%d-%08d" % (kind.encode(), n, seq + k) for k in range(20)]
                        c.mpub(TOPIC, bodies)
                    else:
                        bodies = [b"%s%d-%08d" % (kind.encode(), n, seq)]
                        if kind == "dpub":
                            c.cmd("DPUB", TOPIC, 200 + seq % 800, body=bodies[0])
                        else:
                            c.cmd("PUB", TOPIC, body=bodies[0])
                    seq += len(bodies)
                    answer = c.read(timeout=ANSWER_TIMEOUT)
                    with self.lock:
                        if answer == OK:
                            self.acked.update(bodies)
                        elif answer[0] == FRAME_ERROR and answer[1].split(b" ", 1)[0].endswith(b"_FAILED"):
                            self.failed.update(bodies)
                        else:
                            self.unanswered.update(bodies)
                    bodies = []
                    if answer != OK:
                        break
                    if kind == "dpub":
                        time.sleep(0.01)
            except NETWORK_ERRORS:
                with self.lock:
                    self.unanswered.update(bodies)
            finally:
                c.close()

    def consumer(self, channel: str) -> None:
        while not self.stop.is_set():
            c = self._connect()
            if c is None:
                return
            try:
                c.sub(TOPIC, channel, 200)
                self._consume(c, channel)
            except NETWORK_ERRORS:
                pass
            finally:
                c.close()

    def _consume(self, c: Client, channel: str, until_quiet: float = 0.0) -> None:
        seen = self.received[channel]
        first = self.first_seen[channel]
        last = time.monotonic()
        while not self.stop.is_set() or until_quiet:
            try:
                ftype, data = c.read_frame(1.0)
            except TimeoutError:
                if until_quiet and time.monotonic() - last > until_quiet:
                    return
                continue
            if (ftype, data) == HEARTBEAT:
                c.cmd("NOP")
                continue
            if ftype != FRAME_MESSAGE:
                raise AssertionError((ftype, data))
            m = Msg(data)
            with self.lock:
                seen[m.body] = seen.get(m.body, 0) + 1
                first.setdefault(m.body, time.monotonic())
            c.fin(m)
            last = time.monotonic()

    # -- disk faults --------------------------------------------------------

    def _sample_health(self, until: float, keep_full: bool = False) -> None:
        while True:
            now = time.monotonic()
            if now >= until:
                return
            if keep_full:
                assert self.faults is not None
                self.faults.keep_full()
            status, body = ping(self.daemon.http_address)
            self.pings.append((time.monotonic(), status, body))
            self.ack_counts.append(len(self.acked))
            time.sleep(max(0.0, min(0.25, until - time.monotonic())))

    def fault_cycles(self, end: float) -> None:
        """Healthy for ``fault_every - fault_for`` s, full for ``fault_for`` s, and again, until ``end``."""
        assert self.faults is not None
        healthy = max(0.0, self.fault_every - self.fault_for)
        self._sample_health(min(end, time.monotonic() + healthy))
        while time.monotonic() + self.fault_for + 2.0 < end:
            filled = time.monotonic()
            try:
                self.faults.fill()
                self._sample_health(filled + self.fault_for, keep_full=True)
            finally:
                self.faults.free()
            freed = time.monotonic()
            acked_at_free = len(self.acked)
            self._sample_health(min(end, freed + healthy))
            until = time.monotonic()
            self.cycles.append((filled, freed))
            v = health_verdict(self.pings, filled, freed, until)
            self.verdicts.append(v)
            acked_at_nok = next((n for (t, status, _), n in zip(self.pings, self.ack_counts, strict=True)
                                 if filled <= t and status == 500), acked_at_free)
            self.acked_while_nok.append(acked_at_free - acked_at_nok)
            print(f"{self.t()} fault {len(self.cycles)}: {self.describe(v)}; {acked_at_free - acked_at_nok} "
                  f"acknowledged between NOK and the space's return, {len(self.acked)} so far", flush=True)

    @staticmethod
    def describe(v: Verdict) -> str:
        nok = "never NOK" if v.nok_after is None else f"NOK after {v.nok_after:.1f} s"
        ok = "never OK again" if v.ok_after is None else f"OK {v.ok_after:.1f} s after space returned"
        return (f"{nok}, {v.ok_while_full} OK while full, {ok}, {v.nok_after_recovery} NOK after that: "
                + ("health told the truth" if v.truthful else "HEALTH DID NOT TELL THE TRUTH"))

    def t(self) -> str:
        """Seconds since the load began, for the progress lines."""
        return f"[{time.monotonic() - self.began:6.1f} s]"

    # -- the run ------------------------------------------------------------

    def _lifetime(self, label: str, seconds: float) -> None:
        pid = self.daemon.pid
        time.sleep(min(5.0, seconds))
        first = peak = rss_kib(pid)
        deadline = time.monotonic() + max(0.0, seconds - 5.0)
        while time.monotonic() < deadline:
            time.sleep(1.0)
            peak = max(peak, rss_kib(pid))
        last = rss_kib(pid)
        self.lifetimes.append((label, first, last, max(peak, last)))
        print(f"{self.t()} {label:>10}: RSS {first / 1024:7.1f} MiB after 5 s, {last / 1024:7.1f} MiB at the end, "
              f"peak {peak / 1024:7.1f} MiB; {len(self.acked)} acknowledged so far", flush=True)

    def run(self, minutes: float) -> int:
        try:
            return self._run(minutes)
        finally:
            self.stop.set()
            self.daemon.stop(signal.SIGTERM)
            if self.faults is not None:
                self.faults.close()

    def _run(self, minutes: float) -> int:
        d = self.daemon.start()
        self.address = d.tcp_address
        tcp, http = d.tcp_address, d.http_address
        create_channels(http)
        threads = [threading.Thread(target=self.publisher, args=(k, n), daemon=True)
                   for k, n in (("pub", 0), ("pub", 1), ("mpub", 0), ("dpub", 0))]
        threads += [threading.Thread(target=self.consumer, args=(ch,), daemon=True) for ch in CHANNELS]
        for t in threads:
            t.start()
        self.began = time.monotonic()
        end = self.began + minutes * 60
        faulting = None
        if self.faults is not None:
            faulting = threading.Thread(target=self.fault_cycles, args=(end,), daemon=True)
            faulting.start()
        n = 0
        while time.monotonic() < end:
            left = end - time.monotonic()
            self._lifetime(f"run {n}", min(self.restart_every or left, left))
            if time.monotonic() >= end:
                break
            how = signal.SIGKILL if n % 2 else signal.SIGTERM
            label = "kill -9" if how == signal.SIGKILL else "SIGTERM"
            self.restarts.append((time.monotonic(), label))
            self.daemon.stop(how)
            down = time.monotonic()
            self.daemon.start(tcp=tcp, http=http)
            print(f"{self.t()} restart {n}: {label}, stopped in {down - self.restarts[-1][0]:.1f} s, "
                  f"started in {time.monotonic() - down:.1f} s", flush=True)
            n += 1
        if faulting is not None:
            faulting.join()
        self.stop.set()
        for t in threads:
            t.join(ANSWER_TIMEOUT + 30)
        if self.faults is not None:
            self.faults.free()
        if self.restart_every:
            # one more graceful restart, then read both channels to the end
            self.daemon.stop(signal.SIGTERM)
            self.daemon.start(tcp=tcp, http=http)
        for channel in CHANNELS:
            c = Client(self.address, timeout=10)
            c.sub(TOPIC, channel, 500)
            self._consume(c, channel, until_quiet=5.0)
            c.close()
        log = self.daemon.read_output()
        self.tracebacks = log.count("Traceback") + log.count("Unhandled")
        self.daemon.stop(signal.SIGTERM)
        return self.report(minutes)

    def _in_flight_at_kill(self, channel: str, body: bytes) -> bool:
        """Whether a kill -9 came between the arrivals of the lost message's nearest received neighbours.

        A channel delivers in publish order (requeues aside), so such a message
        was in flight (or about to be) when the daemon was killed: messages in
        flight live in memory and a kill -9 loses them, as in Go nsqd.
        """
        prefix, _, seq = body.partition(b"-")
        first = self.first_seen[channel]
        around = []
        for step in (-1, 1):
            for k in range(1, 5000):
                t = first.get(b"%s-%08d" % (prefix, int(seq) + step * k))
                if t is not None:
                    around.append(t)
                    break
        if not around:
            return False
        lo, hi = min(around) - 0.5, max(around) + 0.5
        return any(lo <= at <= hi for at, label in self.restarts if label == "kill -9")

    def report(self, minutes: float) -> int:
        acked = self.acked
        kills = any(label == "kill -9" for _, label in self.restarts)
        restarts = (f"restarts every {self.restart_every:g} s (SIGTERM and kill -9 alternately)"
                    if self.restart_every else "no restarts")
        print(f"\nsoak: {minutes:g} min, {len(self.lifetimes)} daemon lifetimes, {restarts}")
        if self.faults is not None:
            truthful = sum(v.truthful for v in self.verdicts)
            print(f"disk faults ({self.faults.describe()}): {len(self.cycles)} cycles, full for "
                  f"{self.fault_for:g} s every {self.fault_every:g} s; health told the truth in "
                  f"{truthful} of {len(self.verdicts)}")
            noks = [v.nok_after for v in self.verdicts if v.nok_after is not None]
            oks = [v.ok_after for v in self.verdicts if v.ok_after is not None]
            if noks and oks:
                print(f"  /ping NOK {min(noks):.1f}-{max(noks):.1f} s after the fill "
                      f"({self.verdicts[0].first_nok[:100]!r}), OK {min(oks):.1f}-{max(oks):.1f} s "
                      f"after space returned")
            print(f"  acknowledged between /ping's NOK and the space's return: {min(self.acked_while_nok, default=0)}-"
                  f"{max(self.acked_while_nok, default=0)} per cycle")
        print(f"acknowledged: {len(acked)} messages; not acknowledged: {len(self.failed)} answered E_*_FAILED, "
              f"{len(self.unanswered)} unanswered")
        lost_any = False
        published = acked | self.failed | self.unanswered
        for channel, seen in self.received.items():
            missing = acked - seen.keys()
            # in memory, so a kill -9 loses them (docs/storage.md): deferred ones not yet due,
            # and those in flight at the kill
            in_flight = {b for b in missing if kills and self._in_flight_at_kill(channel, b)}
            deferred = {b for b in missing - in_flight if kills and b.startswith(b"dpub")}
            lost = missing - in_flight - deferred
            dups = sum(1 for v in seen.values() if v > 1)
            lost_any = lost_any or bool(lost)
            got = seen.keys()
            print(f"channel {channel}: received {len(seen)} distinct; lost: {len(lost)} unexplained"
                  + (f" (e.g. {sorted(lost)[:3]})" if lost else "")
                  + f", {len(in_flight)} in flight at a kill -9, {len(deferred)} deferred at a kill -9;"
                  + f" duplicated {dups}")
            if self.failed or self.unanswered:
                print(f"  delivered though not acknowledged: {len(self.failed & got)} of the E_*_FAILED, "
                      f"{len(self.unanswered & got)} of the unanswered; never published: {len(got - published)}")
        firsts = [f for _, f, _, _ in self.lifetimes]
        lasts = [last for _, _, last, _ in self.lifetimes]
        peaks = [p for _, _, _, p in self.lifetimes]
        print(f"RSS per lifetime (MiB): after 5 s {min(firsts) / 1024:.1f}-{max(firsts) / 1024:.1f}, "
              f"at the end {min(lasts) / 1024:.1f}-{max(lasts) / 1024:.1f}, peak {max(peaks) / 1024:.1f}; "
              f"largest growth within a lifetime "
              f"{max(last - first for _, first, last, _ in self.lifetimes) / 1024:.1f} MiB")
        print(f"tracebacks in the daemon's log (last lifetime): {self.tracebacks}")
        lied = any(not v.truthful for v in self.verdicts)
        return 1 if lost_any or lied else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--restart-every", type=float,
                        help="seconds between restarts (default 60; none with --disk-faults)")
    parser.add_argument("--data-path", help="default: a new temporary directory")
    faults = parser.add_argument_group("disk faults")
    faults.add_argument("--disk-faults", action="store_true", help="fill and free the disk in cycles")
    faults.add_argument("--fault-every", type=float, default=20.0, help="seconds from one fill to the next")
    faults.add_argument("--fault-for", type=float, default=8.0, help="seconds the disk stays full")
    faults.add_argument("--fault", choices=("tmpfs", "inject"), default="tmpfs",
                        help="a filling tmpfs (root; falls back to inject) or injected ENOSPC")
    faults.add_argument("--tmpfs-mib", type=int, default=48, help="size of the tmpfs")
    faults.add_argument("--fsync-fails", action="store_true", help="with --fault=inject: fsyncs fail (EIO) too")
    faults.add_argument("--max-bytes-per-file", type=int, default=1 << 20,
                        help="the daemon's segment size with --disk-faults, so finished segments free space")
    args = parser.parse_args()
    restart_every = args.restart_every if args.restart_every is not None else (None if args.disk_faults else 60.0)
    data_path = args.data_path or tempfile.mkdtemp(prefix="nsqtw-soak-")
    os.makedirs(data_path, exist_ok=True)
    daemon_args = ["--mem-queue-size=0", "--sync-every=1"]
    fault: DiskFault | None = None
    try:
        if args.disk_faults:
            daemon_args.append(f"--max-bytes-per-file={args.max_bytes_per_file}")
            if args.fault == "tmpfs":
                try:
                    fault = TmpfsFault(data_path, args.tmpfs_mib)
                except OSError as e:
                    print(f"cannot mount a tmpfs ({e}): injecting ENOSPC instead", flush=True)
            if fault is None:
                fault = InjectedFault(data_path, args.fsync_fails)
            daemon = fault.daemon(*daemon_args)
            print(f"disk faults: {fault.describe()}", flush=True)
        else:
            daemon = Daemon(data_path, *daemon_args)
        print(f"data path {daemon.data_path}", flush=True)
        return Soak(daemon, restart_every, fault, args.fault_every, args.fault_for).run(args.minutes)
    finally:
        if fault is not None:
            fault.close()
        if not args.data_path:
            shutil.rmtree(data_path, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
