"""``nsqtw to-file``: nsq_to_file — archive topics to files, rotated by name, size and time, optionally gzipped.

The file name is ``--filename-format`` with ``<TOPIC>``, ``<HOST>``
(``--host-identifier``), ``<PID>``, ``<DATETIME>`` (``--datetime-format``,
strftime) and ``<REV>`` (``-000000``, raised when the file exists or is
rotated) replaced. A file is rotated when its name changes with the time,
after ``--rotate-interval``, or once it holds more than ``--rotate-size``
bytes (of message data). With ``--work-dir`` files are written there and
moved to ``--output-dir`` when closed.

Delivery is nsq_to_file's: each body is written with a newline, and the
messages are FINed only after the file is synced (fsync; with gzip the
current gzip member is finished first, so every acknowledged message is in
a complete member). A sync happens when ``--max-in-flight`` messages wait,
when the consumer is starved, every ``--sync-interval``, and on exit.
Ctrl-C/SIGTERM: stop taking messages, write and sync what was received,
FIN it, close the files. SIGHUP closes the files (they reopen on the next
message).

All file work runs on a disk thread (one ordered lane per topic), never on
the reactor.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import struct
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, BinaryIO

from twisted.internet.defer import Deferred, DeferredList, gatherResults
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.task import LoopingCall

from nsqtw import __version__
from nsqtw._go.duration import format_duration
from nsqtw._go.flags import ACTIVE, FlagSet, make_flag
from nsqtw.client import Config, Consumer, Message, get_json
from nsqtw.client.lookup import lookup_url
from nsqtw.log import LEVELS
from nsqtw.storage.executor import DiskLane, DiskPool
from nsqtw.tools.common import GoLog, client_config, parse_flags, require, run_tool

PROGRAM = "nsq_to_file"


@dataclass(frozen=True)
class ToFileOptions:
    channel: str = "nsq_to_file"
    consumer_opt: tuple[str, ...] = ()
    datetime_format: str = "%Y-%m-%d_%H"
    filename_format: str = "<TOPIC>.<HOST><REV>.<DATETIME>.log"
    gzip: bool = False
    gzip_level: int = 6
    host_identifier: str = ""
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    log_level: str = "info"
    log_prefix: str = "[nsq_to_file] "
    lookupd_http_address: tuple[str, ...] = ()
    max_in_flight: int = 200
    nsqd_tcp_address: tuple[str, ...] = ()
    output_dir: str = "/tmp"
    rotate_interval: float = 0.0
    rotate_size: int = 0
    skip_empty_files: bool = False
    sync_interval: float = 30.0
    topic: tuple[str, ...] = ()
    topic_pattern: str = ""
    topic_refresh: float = 60.0
    version: bool = False
    work_dir: str = ""


_B = ToFileOptions()
FLAGS = FlagSet("nsqtw to-file", (
    make_flag("channel", "string", "Channel to read from.", ACTIVE, base=_B),
    make_flag("consumer-opt", "strings", "A go-nsq Config option for the consumer, as name,value (repeatable; see "
              "docs/client.md).", ACTIVE, base=_B),
    make_flag("datetime-format", "string", "strftime format of <DATETIME> in the file name.", ACTIVE, base=_B),
    make_flag("filename-format", "string", "File name: <TOPIC>, <HOST>, <PID>, <DATETIME> and <REV> are replaced "
              "(<REV> grows when the file exists or rotates).", ACTIVE, base=_B),
    make_flag("gzip", "bool", "Write gzip files.", ACTIVE, base=_B),
    make_flag("gzip-level", "int", "gzip level, 1 (fastest) to 9 (smallest).", ACTIVE, base=_B),
    make_flag("host-identifier", "string", "What <HOST> becomes instead of the short hostname; may use <SHORT_HOST> "
              "and <HOSTNAME>.", ACTIVE, base=_B),
    make_flag("http-client-connect-timeout", "duration", "How long an HTTP connect may take.", ACTIVE, base=_B),
    make_flag("http-client-request-timeout", "duration", "How long an HTTP request may take.", ACTIVE, base=_B),
    make_flag("log-level", "log-level", "Least severe log lines shown: debug, info, warn, error or fatal.",
              ACTIVE, base=_B, default_text='"info"'),
    make_flag("log-prefix", "string", "Text before each log line.", ACTIVE, base=_B),
    make_flag("lookupd-http-address", "strings", "nsqlookupd HTTP address to discover nsqd nodes through (repeatable).",
              ACTIVE, base=_B),
    make_flag("max-in-flight", "int", "Most messages held at once, over all nsqd connections.", ACTIVE, base=_B),
    make_flag("nsqd-tcp-address", "strings", "nsqd TCP address to read from (repeatable).", ACTIVE, base=_B),
    make_flag("output-dir", "string", "Directory of the finished files.", ACTIVE, base=_B),
    make_flag("rotate-interval", "duration", "Start a new file after this long.", ACTIVE, base=_B),
    make_flag("rotate-size", "int", "Start a new file once this many bytes of messages were written.", ACTIVE, base=_B),
    make_flag("skip-empty-files", "bool", "On a rotation with nothing to write, close instead of opening an empty "
              "file.", ACTIVE, base=_B),
    make_flag("sync-interval", "duration", "fsync (and FIN what was written) at least this often.", ACTIVE, base=_B),
    make_flag("topic", "strings", "Topic to archive (repeatable).", ACTIVE, base=_B),
    make_flag("topic-pattern", "string", "Archive only topics this regular expression finds a match in.",
              ACTIVE, base=_B),
    make_flag("topic-refresh", "duration", "How often to ask nsqlookupd for new topics (without --topic).",
              ACTIVE, base=_B),
    make_flag("version", "bool", "Print the version and exit.", ACTIVE, base=_B),
    make_flag("work-dir", "string", "Directory of the files being written; they move to --output-dir when closed.",
              ACTIVE, base=_B),
), lambda hostname: ToFileOptions(), lambda opts: None)


class LevelLog:
    """nsq_to_file's log lines: ``[nsq_to_file] 2006/01/02 15:04:05.000000 INFO: text``, thread-safe."""

    _NAMES = {"debug": "DEBUG", "info": "INFO", "warn": "WARNING", "error": "ERROR", "fatal": "FATAL"}

    def __init__(self, prefix: str, level: str) -> None:
        self.out = GoLog(prefix=prefix, micro=True)
        self.level = LEVELS[level][1]
        self._lock = threading.Lock()

    def log(self, level: str, text: str) -> None:
        if LEVELS[level][1] >= self.level:
            with self._lock:
                self.out.printf(f"{self._NAMES[level]}: {text}")


def filename_template(opts: ToFileOptions, topic: str) -> str:
    """nsq_to_file's ``computeFilenameFormat``: everything but ``<DATETIME>`` and ``<REV>`` replaced."""
    hostname = socket.gethostname()
    short = hostname.split(".")[0]
    identifier = short
    if opts.host_identifier:
        identifier = opts.host_identifier.replace("<SHORT_HOST>", short).replace("<HOSTNAME>", hostname)
    template = opts.filename_format
    if opts.gzip or opts.rotate_size > 0 or opts.rotate_interval > 0 or opts.work_dir != opts.output_dir:
        if "<REV>" not in template:
            raise ValueError("missing <REV> in --filename-format when gzip, rotation, or work dir enabled")
    else:
        template = template.replace("<REV>", "")
    template = template.replace("<TOPIC>", topic).replace("<HOST>", identifier).replace("<PID>", str(os.getpid()))
    if opts.gzip and not template.endswith(".gz"):
        template += ".gz"
    return template


class GzipMember:
    """One gzip member as Go's ``gzip.Writer`` writes it (mtime 0, OS 255), raw deflate inside."""

    def __init__(self, level: int) -> None:
        xfl = 2 if level == 9 else 4 if level == 1 else 0
        self._header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00" + bytes((xfl, 255))
        self._deflate = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
        self._crc = 0
        self._size = 0
        self._started = False

    def write(self, data: bytes) -> bytes:
        out = b"" if self._started else self._header
        self._started = True
        self._crc = zlib.crc32(data, self._crc)
        self._size += len(data)
        return out + self._deflate.compress(data)

    def finish(self) -> bytes:
        out = b"" if self._started else self._header
        return out + self._deflate.flush() + struct.pack("<II", self._crc, self._size & 0xFFFFFFFF)


class RotatingFile:
    """One topic's output file; every method runs on the topic's disk lane, in order."""

    def __init__(self, opts: ToFileOptions, topic: str, template: str, log: LevelLog) -> None:
        self.opts = opts
        self.topic = topic
        self.template = template
        self.log = log
        self.tag = f"[{topic}/{opts.channel}]"
        self.out: BinaryIO | None = None
        self.path = ""
        self.gz: GzipMember | None = None
        self.filename = ""
        self.open_time = 0.0
        self.filesize = 0
        self.rev = 0

    def current_filename(self) -> str:
        return self.template.replace("<DATETIME>", time.strftime(self.opts.datetime_format))

    def needs_rotation(self) -> bool:
        if self.out is None:
            return True
        filename = self.current_filename()
        if filename != self.filename:
            self.log.log("info", f"{self.tag} new filename {filename}, rotating...")
            return True
        if self.opts.rotate_interval > 0:
            since = time.time() - self.open_time
            if since > self.opts.rotate_interval:
                self.log.log("info", f"{self.tag} {format_duration(since)} since last open, rotating...")
                return True
        if 0 < self.opts.rotate_size < self.filesize:
            self.log.log("info", f"{self.tag} {self.path} currently {self.filesize} bytes"
                                 f" (> {self.opts.rotate_size}), rotating...")
            return True
        return False

    def write(self, bodies: list[bytes]) -> None:
        for body in bodies:
            if self.needs_rotation():
                self.update_file()
            data = body + b"\n"
            assert self.out is not None
            self.out.write(self.gz.write(data) if self.gz is not None else data)
            self.filesize += len(data)

    def sync(self, count: int) -> None:
        if count:
            self.log.log("info", f"{self.tag} syncing {count} records to disk")
        if self.out is None:
            return
        if self.gz is not None:  # end this member: its trailer vouches for what it holds
            self.out.write(self.gz.finish())
            self.gz = GzipMember(self.opts.gzip_level)
        self.out.flush()
        os.fsync(self.out.fileno())

    def tick(self, count: int) -> None:
        """The sync ticker: rotate if due (or just close with --skip-empty-files), then sync."""
        if self.needs_rotation():
            if self.opts.skip_empty_files:
                self.sync(count)
                self.close()
                return
            self.sync(count)
            count = 0
            self.update_file()
        self.sync(count)

    def close(self) -> None:
        out = self.out
        if out is None:
            return
        if self.gz is not None:
            out.write(self.gz.finish())
            self.gz = None
        out.flush()
        os.fsync(out.fileno())
        out.close()
        self.out = None
        opts = self.opts
        if opts.work_dir == opts.output_dir:
            return
        src = self.path
        dst = os.path.join(opts.output_dir, os.path.relpath(src, opts.work_dir))
        self.log.log("info", f"{self.tag} moving finished file {src} to {dst}")
        try:
            _exclusive_rename(src, dst)
            return
        except FileExistsError:
            pass
        template = os.path.join(os.path.dirname(dst), os.path.basename(self.filename))
        rev = self.rev + 1
        while True:
            self.log.log("warn", f"{self.tag} destination file already exists: {dst}")
            dst = template.replace("<REV>", f"-{rev:06d}")
            try:
                _exclusive_rename(src, dst)
            except FileExistsError:
                rev += 1
                continue
            self.log.log("info", f"{self.tag} renamed finished file {src} to {dst} to avoid overwrite")
            return

    def update_file(self) -> None:
        self.close()
        filename = self.current_filename()
        self.rev = 0 if filename != self.filename else self.rev + 1
        self.filename = filename
        self.open_time = time.time()
        opts = self.opts
        full = os.path.join(opts.work_dir, filename)
        os.makedirs(os.path.dirname(full) or ".", 0o770, exist_ok=True)
        while True:
            path = full.replace("<REV>", f"-{self.rev:06d}")
            if opts.work_dir != opts.output_dir:
                final = os.path.join(opts.output_dir, os.path.relpath(path, opts.work_dir))
                os.makedirs(os.path.dirname(final) or ".", 0o770, exist_ok=True)
                if os.path.exists(final):
                    self.log.log("warn", f"{self.tag} output file already exists: {final}")
                    self.rev += 1
                    continue
            flags = os.O_WRONLY | os.O_CREAT
            flags |= os.O_EXCL if opts.gzip or opts.rotate_interval > 0 else os.O_APPEND
            try:
                fd = os.open(path, flags, 0o666)
            except FileExistsError:
                self.log.log("warn", f"{self.tag} working file already exists: {path}")
                self.rev += 1
                continue
            out = os.fdopen(fd, "ab")
            self.log.log("info", f"{self.tag} opening {path}")
            self.filesize = os.fstat(fd).st_size
            if 0 < opts.rotate_size < self.filesize:
                self.log.log("info", f"{self.tag} {path} currently {self.filesize} bytes"
                                     f" (> {opts.rotate_size}), rotating...")
                out.close()
                self.rev += 1
                continue
            self.out = out
            self.path = path
            break
        self.gz = GzipMember(opts.gzip_level) if opts.gzip else None


def _exclusive_rename(src: str, dst: str) -> None:
    """Move without overwriting: link then unlink (FileExistsError when ``dst`` exists)."""
    os.link(src, dst)
    os.remove(src)


class TopicArchiver:
    """One topic: its consumer on the reactor, its :class:`RotatingFile` on a disk lane.

    Messages are written in batches (one job per reactor turn) and FINed in
    batches after a sync job: the lane runs jobs in order, so a sync covers
    every write submitted before it.
    """

    def __init__(self, reactor: Any, opts: ToFileOptions, topic: str, config: Config, lane: DiskLane,
                 log: LevelLog) -> None:
        self.reactor = reactor
        self.opts = opts
        self.lane = lane
        self.log = log
        self.file = RotatingFile(opts, topic, filename_template(opts, topic), log)
        self.consumer = Consumer(topic, opts.channel, self.handle, config, reactor=reactor,
                                 nsqd_tcp_addresses=opts.nsqd_tcp_address,
                                 lookupd_http_addresses=opts.lookupd_http_address)
        self.unwritten: list[Message] = []
        #: written (the job is submitted), waiting for a sync
        self.unsynced: list[Message] = []
        self._flush_call: IDelayedCall | None = None
        self._ticker = LoopingCall(self.tick)
        self._ticker.clock = reactor
        self._stopped: Deferred[None] | None = None
        self.failed = False

    def start(self) -> None:
        self.consumer.start()
        self._ticker.start(self.opts.sync_interval, now=False)

    def handle(self, msg: Message) -> None:
        msg.disable_auto_response()
        self.unwritten.append(msg)
        if self._flush_call is None:
            self._flush_call = self.reactor.callLater(0, self.flush)

    def flush(self) -> None:
        """Submit the turn's messages as one write job; sync when nsq_to_file would."""
        self._flush_call = None
        if self.unwritten:
            batch, self.unwritten = self.unwritten, []
            self.lane.submit(self.file.write, [m.body for m in batch]).addErrback(self._fatal, "writing message")
            self.unsynced.extend(batch)
        if len(self.unsynced) >= self.opts.max_in_flight or self.consumer.is_starved():
            self.sync()

    def sync(self, job: Any = None) -> Deferred[Any]:
        batch, self.unsynced = self.unsynced, []
        d = self.lane.submit(job or self.file.sync, len(batch))

        def synced(_: Any) -> None:
            for m in batch:
                m.finish()

        def failed(f: Any) -> None:
            for m in batch:  # not known to be on disk: give them back
                m.requeue(0, backoff=False)
            self._fatal(f, "failed syncing messages")

        return d.addCallbacks(synced, failed)

    def tick(self) -> None:
        if self._flush_call is not None:
            self._flush_call.cancel()
            self._flush_call = None
            if self.unwritten:
                batch, self.unwritten = self.unwritten, []
                self.lane.submit(self.file.write, [m.body for m in batch]).addErrback(self._fatal, "writing")
                self.unsynced.extend(batch)
        self.sync(self.file.tick)

    def hup(self) -> None:
        self.sync()
        self.lane.submit(self.file.close)

    def _fatal(self, f: Any, what: str) -> None:
        self.failed = True
        self.log.log("fatal", f"{self.file.tag} {what}: {f.getErrorMessage()}")
        self.reactor.callLater(0, self.reactor.stop)

    def stop(self) -> Deferred[None]:
        """Stop consuming; write, sync and FIN what was received; close the file."""
        if self._stopped is not None:
            return self._stopped
        if self._ticker.running:
            self._ticker.stop()
        consumer_stopped = self.consumer.stop()  # CLS; it waits for the FINs below
        if self._flush_call is not None:
            self._flush_call.cancel()
            self._flush_call = None
        if self.unwritten:
            batch, self.unwritten = self.unwritten, []
            self.lane.submit(self.file.write, [m.body for m in batch]).addErrback(self._fatal, "writing")
            self.unsynced.extend(batch)
        synced = self.sync()

        async def finish() -> None:
            await synced
            await consumer_stopped
            await self.lane.submit(self.file.close)

        self._stopped = Deferred.fromCoroutine(finish())
        return self._stopped


async def to_file(reactor: Any, opts: ToFileOptions) -> int:
    require(bool(opts.channel), "--channel is required")
    require(opts.http_client_connect_timeout > 0, "--http-client-connect-timeout should be positive")
    require(opts.http_client_request_timeout > 0, "--http-client-request-timeout should be positive")
    require(bool(opts.nsqd_tcp_address or opts.lookupd_http_address),
            "--nsqd-tcp-address or --lookupd-http-address required.")
    require(not (opts.nsqd_tcp_address and opts.lookupd_http_address),
            "use --nsqd-tcp-address or --lookupd-http-address not both")
    require(1 <= opts.gzip_level <= 9, f"invalid --gzip-level value ({opts.gzip_level}), should be 1-9")
    require(bool(opts.topic or opts.topic_pattern), "--topic or --topic-pattern required")
    require(bool(opts.topic or opts.lookupd_http_address),
            "--lookupd-http-address must be specified when no --topic specified")
    if not opts.work_dir:
        opts = replace(opts, work_dir=opts.output_dir)
    log = LevelLog(opts.log_prefix, opts.log_level)
    config = client_config(opts.consumer_opt, PROGRAM, max_in_flight=opts.max_in_flight)
    pool = DiskPool(reactor, threads=2, name="to-file")
    archivers: dict[str, TopicArchiver] = {}
    pattern = re.compile(opts.topic_pattern) if opts.topic_pattern else None

    def update(topics: Sequence[str]) -> None:
        for topic in topics:
            if topic in archivers:
                continue
            if pattern is not None and not pattern.search(topic):
                log.log("warn", f"skipping topic {topic} (doesn't match pattern {opts.topic_pattern})")
                continue
            try:
                archiver = TopicArchiver(reactor, opts, topic, config.copy(), pool.lane(topic), log)
            except ValueError as e:
                log.log("error", f"couldn't create logger for new topic {topic}: {e}")
                continue
            archivers[topic] = archiver
            archiver.start()

    async def refresh() -> None:
        try:
            answers = await gatherResults([get_json(reactor, lookup_url(a, "/topics"),
                                                    opts.http_client_request_timeout)
                                           for a in opts.lookupd_http_address], consumeErrors=True)
        except Exception as e:
            log.log("error", f"could not retrieve topic list: {getattr(e, 'subFailure', e)}")
            return
        update(sorted({t for data in answers for t in data.get("topics") or []}))

    discovery: LoopingCall | None = None
    if not opts.topic:
        discovery = LoopingCall(lambda: Deferred.fromCoroutine(refresh()))
        discovery.clock = reactor
        discovery.start(opts.topic_refresh, now=False)

    done: Deferred[None] = Deferred()

    def stop() -> Deferred[Any]:
        if discovery is not None and discovery.running:
            discovery.stop()
        d = DeferredList([a.stop() for a in archivers.values()], consumeErrors=True)

        def finished(_: Any) -> None:
            pool.stop()
            if not done.called:
                done.callback(None)
        return d.addCallback(finished)

    reactor.addSystemEventTrigger("before", "shutdown", stop)
    def hup() -> None:
        for a in archivers.values():
            a.hup()

    signal.signal(signal.SIGHUP, lambda *_: reactor.callFromThread(hup))
    update(opts.topic)
    await done
    return 1 if any(a.failed for a in archivers.values()) else 0


def main(argv: Sequence[str]) -> int:
    opts = parse_flags("nsqtw to-file", FLAGS, argv)
    if opts.version:
        print(f"nsq_to_file v{__version__} (nsqtw)")
        return 0
    return run_tool(lambda reactor: to_file(reactor, opts))
