"""Assembly: the NSQD core plus its listeners, as one twistd service."""

from __future__ import annotations

import fcntl
import gc
import os
from typing import Any

from twisted.application.service import MultiService, Service
from twisted.internet.defer import Deferred, ensureDeferred, gatherResults
from twisted.internet.protocol import Factory

from nsqtw import speedups, version_banner
from nsqtw._go.duration import format_duration
from nsqtw.core.nsqd import NSQD
from nsqtw.heap import freeze_start_up, keep_long_lived_old, release_free_heap, return_big_blocks
from nsqtw.http.metrics import MetricsPage
from nsqtw.log import Logger
from nsqtw.names import is_valid_channel_name, is_valid_topic_name
from nsqtw.net.busypoll import busy_poll_of
from nsqtw.net.exit import exit_cleanly_after_signal, fail_start
from nsqtw.net.lazy import FirstConnectionFactory
from nsqtw.net.limits import open_file_limit
from nsqtw.net.listen import ListenerService, client_endpoint, notify_ready_when_bound
from nsqtw.net.notify import notify
from nsqtw.net.tls import build_server_tls
from nsqtw.nsqd.cpus import AUTO_WORKERS, usable_cpus, with_workers_resolved
from nsqtw.nsqd.lookup import CONNECT_TIMEOUT, Lookup
from nsqtw.observe.metrics import NSQDMetrics
from nsqtw.observe.statsd import StatsdService
from nsqtw.protocol.auth import authorizer_for
from nsqtw.protocol.v2 import V2Factory
from nsqtw.storage.diskqueue import DiskQueue
from nsqtw.storage.durable import DurableDelivery, compact_min, keep_free
from nsqtw.storage.executor import DiskLane, DiskPool
from nsqtw.storage.fsync import FsyncLatency
from nsqtw.storage.groupsync import GroupSync, load_syncfs
from nsqtw.storage.journal import Journal, JournalState, find_journals, journal_path, replay
from nsqtw.storage.metadata import (
    DEFERRED_FILENAME,
    FILENAME,
    MetadataStore,
    decode,
    decode_deferred,
    encode_deferred,
    read_file,
    take_deferred_file,
    write_file,
)
from nsqtw.storage.segments import nsqd_msg_size_limits
from nsqtw.storage.sync import SyncSchedule


class InstantiateError(RuntimeError):
    """A start-up failure nsqd reports as ``failed to instantiate nsqd - ...``."""


class StartError(RuntimeError):
    """A start-up failure whose message is nsqd's whole FATAL line (``failed to persist metadata - ...``)."""


class DataPathLock:
    """An exclusive lock on the data path, so two daemons never share one (as nsqd)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        """Lock the directory; like nsqd, a missing one is an error, not created."""
        if self._fd is not None:
            return
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise InstantiateError(f"failed to lock data-path: open {self.path}: "
                                   f"{(e.strerror or str(e)).lower()}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            # Go nsqd v1.3.0's words (dirlock)
            raise InstantiateError(f"failed to lock data-path: cannot flock directory {self.path} -"
                                   f" {(e.strerror or str(e)).lower()} (possibly in use by another"
                                   " instance of nsqd)") from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


#: seconds a graceful stop waits without any queue finishing its flush before it exits anyway
STOP_FLUSH_TIMEOUT = 10.0


def unflushed(nsqd: NSQD) -> list[tuple[str, str]]:
    """Per topic and channel, the messages and records not safely on disk yet (empty ones left out)."""
    out = []
    for topic in nsqd.topics.values():
        queues: list[tuple[str, Any, Any]] = [(f"TOPIC({topic.name})", topic, topic.delivery)]
        queues.extend((f"CHANNEL({topic.name}:{c.name})", c, c.delivery) for c in topic.channels.values())
        for what, queue, delivery in queues:
            counts = {"in memory": queue.in_memory(),
                      "records not written": queue.backend.backlog()}
            if hasattr(queue, "in_flight"):
                counts["in flight"] = len(queue.in_flight)
                counts["deferred"] = len(queue.deferred)
            journal = getattr(delivery, "journal", None)
            if journal is not None:
                counts["journal records not fsynced"] = journal.unsynced()
            if any(counts.values()):
                out.append((what, ", ".join(f"{n} {k}" for k, n in counts.items())))
    return out


class NSQDService(MultiService):
    """The daemon: the NSQD core first, its listeners after.

    Start-up loads ``nsqd.dat`` (and opens every queue it names) before the
    listeners open. MultiService stops children in reverse order, so on
    SIGTERM the listeners close first, then every message is flushed to disk
    and the metadata persisted.
    """

    log = Logger()

    def __init__(self, options: Any, reactor: Any = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        #: the CPUs that chose the workers' count (``--workers=0``, the default), else None
        self.cpus: int | None = None
        if options.workers == AUTO_WORKERS:
            self.cpus = usable_cpus()
            options = with_workers_resolved(options, self.cpus)  # the core, its workers and peers see one count
        self.options = options
        self.reactor = reactor
        self.data_path = options.resolved_data_path
        self.lock = DataPathLock(self.data_path)
        self.durable = bool(options.durable_delivery)
        #: journals replayed at start, waiting for their channels to be made
        self._recovered: dict[str, JournalState] = {}
        mode = DurableDelivery(self._make_journal, options.sync_every) if self.durable else None
        self.nsqd = NSQD(options, reactor, self._make_backend, mode)
        # a certificate that cannot be loaded stops nsqd before it listens (TLSConfigError)
        self.nsqd.tls = build_server_tls(options)
        self.nsqd.auth = authorizer_for(options, reactor)
        #: the disk threads every queue and journal shares; started with the service (after
        #: twistd daemonizes: threads do not survive a fork)
        self.disk_pool: DiskPool | None = None
        #: one --sync-timeout timer for every disk queue, armed only while one has work
        self.sync_schedule = SyncSchedule(reactor, options.sync_timeout)
        self.meta_executor: DiskLane | None = None
        #: a graceful stop's one syncfs for the queues it closes (None where there is no syncfs)
        self.group_sync: GroupSync | None = None
        #: steps disk queues made closing (records written, closes ended): a stop waits while it grows
        self.stop_progress = 0
        #: the data path's filesystem size (--durable-delivery: what its queues keep free depends on it)
        self._fs_bytes: int | None = None
        #: every fsync of the disk queues and journals, timed on the disk threads (/metrics)
        self.fsync_latency = FsyncLatency()
        #: /metrics: one registry for the HTTP and HTTPS listeners
        node_metrics = NSQDMetrics(self.nsqd, reactor, options.metrics_per_client,
                                   self.fsync_latency.histogram)
        self.metrics_page = MetricsPage(node_metrics.collector, node_metrics.prepare)
        tcp = ListenerService("TCP", options.tcp_address, V2Factory(self.nsqd, reactor), self._tcp_bound,
                              program="nsqd", reactor=reactor)
        tcp.setServiceParent(self)  # type: ignore[no-untyped-call]
        #: with --workers, the HTTP(S) listeners answer once every worker is ready (WorkerPool)
        http_gate = None
        if options.workers > 1:
            # after the TCP listener, so it stops first: the workers close their clients
            # before the core flushes their topics
            from nsqtw.workers.pool import WorkerPool

            pool = WorkerPool(self.nsqd, options, reactor, tcp)
            pool.setServiceParent(self)  # type: ignore[no-untyped-call]
            http_gate = pool.http_gate
        if options.http_address:  # nsqd: an empty --http-address turns HTTP off
            # the API (twisted.web, Klein) is imported and made at the first HTTP connection
            site = FirstConnectionFactory(self._http_site, "GoSite")
            ListenerService("HTTP", options.http_address, site, self._http_bound,  # type: ignore[no-untyped-call]
                            program="nsqd", reactor=reactor, gate=http_gate).setServiceParent(self)
        if self.nsqd.tls is not None and options.https_address:
            # imported here: twisted.protocols.tls loads pyOpenSSL, which a node without TLS never needs
            from nsqtw.net.https import HTTPSFactory
            from nsqtw.nsqd.http import HTTPAPI

            # nsqd's HTTPS listener: the same API, TLS from the first byte
            secure = HTTPAPI(self.nsqd, tls_enabled=True, metrics=self.metrics_page).site()
            secure.noisy = False
            ListenerService("HTTPS", options.https_address,  # type: ignore[no-untyped-call]
                            HTTPSFactory(self.nsqd.tls, False, secure), self._https_bound,
                            program="nsqd", reactor=reactor, gate=http_gate).setServiceParent(self)
        if options.statsd_address:
            StatsdService(self.nsqd, reactor).setServiceParent(self)  # type: ignore[no-untyped-call]
        # after the listeners: it announces their ports, and stops first
        lookup = Lookup(self.nsqd, reactor, lambda address: client_endpoint(reactor, address, CONNECT_TIMEOUT))
        lookup.setServiceParent(self)  # type: ignore[no-untyped-call]
        if options.replicas > 1:
            # after lookup: it finds its peers through it, and stops first
            from nsqtw.replica.service import ReplicationService

            replication = ReplicationService(self.nsqd, reactor, options, lookup.lookupd_http_addresses,
                                             self.data_path, lambda: self._lane("replica-standby"))
            replication.setServiceParent(self)  # type: ignore[no-untyped-call]
            lookup.identified.append(replication.lookupd_identified)

    def _http_site(self) -> Factory[Any]:
        """The HTTP listener's factory, made at its first connection."""
        from nsqtw.nsqd.http import HTTPAPI

        site = HTTPAPI(self.nsqd, metrics=self.metrics_page).site()
        site.noisy = False
        return site

    def _lane(self, name: str) -> DiskLane:
        assert self.disk_pool is not None, "queues are made once the service started"
        return self.disk_pool.lane(name)

    def _make_backend(self, name: str) -> DiskQueue:
        o = self.options
        min_size, max_size = nsqd_msg_size_limits(o.max_msg_size)
        reserve = 0
        if self.durable:
            reserve = keep_free(self._fs_size(), "channel" if ":" in name else "topic")
        return DiskQueue(name, self.data_path, o.max_bytes_per_file, min_size, max_size,
                         o.sync_every, o.sync_timeout, self.reactor, self._lane(f"diskqueue-{name}"),
                         durable=self.durable, keep_free=reserve, sync_schedule=self.sync_schedule,
                         fsync_fn=self.fsync_latency.fsync, unwritten=self.nsqd.unwritten,
                         on_set_aside=self.nsqd.count_set_aside, group_sync=self.group_sync,
                         on_progress=self._stop_progressed)

    def _stop_progressed(self) -> None:
        self.stop_progress += 1

    def _fs_size(self) -> int:
        """The data path's filesystem size, read once (the durable writers' reserves)."""
        if self._fs_bytes is None:
            st = os.statvfs(self.data_path)
            self._fs_bytes = st.f_blocks * st.f_frsize
        return self._fs_bytes

    def _make_journal(self, name: str) -> Journal:
        journal = Journal(name, self.data_path, self.reactor, self._lane(f"journal-{name}"),
                          state=self._recovered.pop(name, None), fsync_fn=self.fsync_latency.fsync,
                          keep_free=keep_free(self._fs_size(), "journal"),
                          compact_min_bytes=compact_min(self._fs_size()))
        journal.watch_health(self.nsqd.storage_health)
        return journal

    async def _replay_journals(self, submit: Any) -> list[tuple[str, str | None]]:
        """Read every journal left by a --durable-delivery run that did not stop cleanly.

        Returns the (topic, channel or None) they belong to. Without the flag,
        their messages could not be delivered as promised, so start-up stops
        with an error instead.
        """
        names = await submit(find_journals, self.data_path)
        if names and not self.durable:
            raise RuntimeError(
                f"{journal_path(self.data_path, names[0])} holds messages of a --durable-delivery run"
                f" that did not stop cleanly ({len(names)} journal(s)); start with --durable-delivery"
                " to deliver them (a graceful stop then leaves a plain data directory)")
        pairs: list[tuple[str, str | None]] = []
        for name in names:
            topic, sep, channel = name.partition(":")
            if not (is_valid_topic_name(topic) and (not sep or is_valid_channel_name(channel))):
                self.log.warn("NSQ: ignoring journal {path} (not a topic or topic:channel name)",
                              path=journal_path(self.data_path, name))
                continue
            state = await submit(replay, journal_path(self.data_path, name))
            if state.torn:
                self.log.warn("JOURNAL({name}): cut {torn} bytes of torn records at its end",
                              name=name, torn=state.torn)
            self._recovered[name] = state
            pairs.append((topic, channel if sep else None))
        return pairs

    def _tcp_bound(self, port: int) -> None:
        self.nsqd.tcp_port = port

    def _http_bound(self, port: int) -> None:
        self.nsqd.http_port = port

    def _https_bound(self, port: int) -> None:
        self.nsqd.https_port = port

    def startService(self) -> Deferred[None]:
        Service.startService(self)
        self.log.info("{banner}", banner=version_banner("nsqd"))
        self.log.info("ID: {node_id}", node_id=self.options.node_id)
        self.log.info("{speedups}", speedups=speedups.NOTE)
        if self.cpus is not None:
            self.log.info("workers: {served} ({cpus} usable CPUs; --workers=0, the default, chose;"
                          " --workers=N sets it)", cpus=self.cpus,
                          served="one process serves every client" if self.options.workers == 1 else
                          f"{self.options.workers} worker processes serve TCP clients")
        poll = busy_poll_of(self.reactor)
        if poll is not None:
            # no spinning while the queues load (every disk thread's result would set the reactor
            # spinning against them for the GIL); the limit is set as the listeners open (_start)
            poll.limit = 0
        if poll is not None and self.options.busy_poll > 0:
            self.log.info("busy polling: up to {limit} while traffic is brisk (--busy-poll=0 turns it off)",
                          limit=format_duration(self.options.busy_poll))
        limit = open_file_limit()
        if limit is not None:
            self.log.info("open files: up to {limit} (RLIMIT_NOFILE; an idle queue holds none)", limit=limit)
        keep_long_lived_old()  # queued messages are long-lived
        return_big_blocks()  # a freed MPUB's megabyte goes back to the system, not into the heap
        # what start-up builds (every topic and channel of nsqd.dat) lives as long as the node: no
        # collection while it is built (with 30,000 topics they took a second of a ten-second
        # start); it is frozen out of the collector at the end (_start)
        gc.disable()
        d = ensureDeferred(self._start())
        d.addErrback(self._start_failed)
        d.addBoth(self._collector_back_on)
        return d

    @staticmethod
    def _collector_back_on(result: object) -> object:
        gc.enable()  # (a start that failed too)
        return result

    async def _start(self) -> None:
        self.lock.acquire()
        self.disk_pool = DiskPool(self.reactor, self.options.disk_threads)
        self.meta_executor = self._lane("metadata")
        if load_syncfs() is not None:
            # the data path is opened now: syncfs reports the writeback errors since then
            group = GroupSync(self.data_path, self._lane("syncfs"), self.fsync_latency.syncfs)
            try:
                await group.arm()
                self.group_sync = group
            except OSError as e:  # each queue fsyncs its own files at the stop
                self.log.warn("NSQ: cannot open {path} to sync it at the stop - {error}", path=self.data_path,
                              error=e)
        store = MetadataStore(self.nsqd, self.data_path, self.reactor, self.meta_executor.submit)
        try:
            raw = await self.meta_executor.submit(read_file, self.data_path)
        except OSError as e:  # a data path that is not a directory, or cannot be read
            raise StartError(f"failed to load metadata - failed to read metadata from"
                             f" {os.path.join(self.data_path, FILENAME)} - {e}") from None
        journaled = await self._replay_journals(self.meta_executor.submit)
        if raw is not None:
            try:
                entries = decode(raw)
            except ValueError as e:
                raise RuntimeError(f"failed to parse metadata - {e}") from None
            self.nsqd.load(entries)
            raw_due = await self.meta_executor.submit(take_deferred_file, self.data_path)
            if raw_due:
                self.nsqd.restore_deferred(decode_deferred(raw_due))
            await gatherResults([b.loaded for b in self.nsqd.backends()
                                 if hasattr(b, "loaded")], consumeErrors=True)
            # a queue whose files could not be read (out of descriptors, memory, a failing disk) stops
            # the start: nothing was set aside or overwritten, and a start with what it lacked reads all
            failed = [error for b in self.nsqd.backends() if (error := getattr(b, "load_error", None))]
            if failed:
                more = f" (and {len(failed) - 1} more queues)" if len(failed) > 1 else ""
                raise StartError(f"failed to load metadata - {failed[0]}{more}")
            self.log.info("NSQ: loaded metadata: {topics} topics", topics=len(entries))
        # a channel made just before a crash may have a journal but no entry in nsqd.dat yet
        missing = [(t, c) for t, c in journaled
                   if t not in self.nsqd.topics or (c is not None and c not in self.nsqd.topics[t].channels)]
        for topic, channel in missing:
            t = self.nsqd.get_topic(topic)
            if channel is not None:
                t.get_channel(channel)
        # as nsqd does at start: a data path it cannot write stops it here, not at the first topic
        try:
            await store.persist()
        except Exception as e:
            raise StartError(f"failed to persist metadata - {e}") from None
        self.nsqd.metadata = store
        # what start-up built (every topic and channel of nsqd.dat) lives as long as the node: out
        # of every collection from now on (nsqtw.heap.freeze_start_up). Left young, the first
        # collection of that heap after start-up (a first /metrics scrape of 10,000 channels)
        # stalled the reactor 0.28 s (tests/integration/test_metrics_scale.py); collected now, it
        # took 0.6 s of a 2.5 s restart with 15,000 topics
        freeze_start_up()
        gc.enable()
        if self.nsqd.replication is not None:
            # the logs replication left (its standbys, the node's own logs), before anything is published
            await self.nsqd.replication.recover()
        poll = busy_poll_of(self.reactor)
        if poll is not None:
            poll.limit = self.options.busy_poll
        for service in self:
            service.startService()
        notify_ready_when_bound(self.reactor, self)
        # what start-up freed goes back to the system (about 1.3 MB of an idle node's RSS)
        release_free_heap()

    def _start_failed(self, failure: Any) -> None:
        if failure.check(StartError):
            reason = failure.getErrorMessage()
        else:
            what = "instantiate nsqd" if failure.check(InstantiateError) else "start"
            reason = f"failed to {what} - {failure.getErrorMessage()}"
        fail_start(self.reactor, reason)

    async def _close_within(self, seconds: float) -> None:
        """Flush and close every topic and channel; give up once ``seconds`` pass with no queue closing.

        A healthy disk keeps closing queues, however many there are, and the
        stop waits for all of them. A disk that keeps failing (fsync errors,
        a full disk under ``--durable-delivery``) would hold the stop
        forever: the hand-offs wait for journal fsyncs that never succeed.
        Once ``seconds`` pass in which no queue moved on (wrote what it
        held, or finished closing), the disk threads run nothing more but
        the metadata's, the jobs under way end, and what is not on disk then
        is logged, queue by queue: what a kill -9 at that moment would leave
        (with ``--durable-delivery`` the journals and the topics' read
        positions still hold every acknowledged message). A record that
        reached the disk is never reported.
        """
        finished: Deferred[bool] = Deferred()
        seen = -1
        last = self.reactor.seconds()

        def settle(result: bool) -> None:
            if not finished.called:
                finished.callback(result)

        def watch() -> None:
            nonlocal seen, last
            if finished.called:
                return
            now = self.reactor.seconds()
            if self.stop_progress != seen:
                seen, last = self.stop_progress, now
            elif now - last >= seconds:
                settle(False)
                return
            timer[0] = self.reactor.callLater(min(1.0, seconds), watch)

        timer: list[Any] = [None]
        self.nsqd.close().addBoth(lambda _: settle(True))
        watch()
        if await finished:
            if timer[0] is not None and timer[0].active():
                timer[0].cancel()
        else:
            self.log.error("NSQ: stop: no queue moved on flushing for {seconds}s - exiting anyway",
                           seconds=seconds)
            if self.disk_pool is not None:
                # nothing more reaches the disk (but nsqd.dat), so what is reported below stays true
                await self.disk_pool.halt(keep=self.meta_executor)
        # what failed to reach the disk, whether the flush finished (with errors) or was given up
        for what, counts in unflushed(self.nsqd):
            self.log.error("NSQ: stop: {what} could not be flushed: {counts}", what=what, counts=counts)

    def stopService(self) -> Deferred[None]:
        return ensureDeferred(self._stop())

    async def _stop(self) -> None:
        notify("STOPPING=1")
        # listeners first (reverse order)
        await super().stopService()  # type: ignore[no-untyped-call]
        due = self.nsqd.deferred_due()
        # before closing: with --durable-delivery, closing drops the journals holding them
        if due and self.meta_executor is not None:
            try:
                await self.meta_executor.submit(write_file, self.data_path, encode_deferred(due),
                                                DEFERRED_FILENAME)
            except Exception as e:
                self.log.error("NSQ: failed to save deferred due times - {error}", error=e)
        await self._close_within(STOP_FLUSH_TIMEOUT)
        if self.nsqd.replication is not None:
            await self.nsqd.replication.closed()
        if self.group_sync is not None:
            self.group_sync.disarm()
        if self.nsqd.metadata is not None:
            try:
                await self.nsqd.metadata.persist()
            except Exception as e:
                self.log.error("NSQ: failed to persist metadata - {error}", error=e)
        if self.meta_executor is not None:
            self.meta_executor.stop()
        self.sync_schedule.stop()
        if self.disk_pool is not None:
            self.disk_pool.stop()
        self.lock.release()
        self.log.info("NSQ: stopped")
        exit_cleanly_after_signal(self.reactor)
