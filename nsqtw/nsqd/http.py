"""nsqd's HTTP API (v1.3.0) on Klein: same routes, arguments, status codes and bodies.

The Go-compatible plumbing (RespondV1 answers, body bounding, httprouter's
redirects) is :mod:`nsqtw.http.base`; this module holds only nsqd's routes,
marked with :func:`~nsqtw.http.base.route` (Klein is imported at the first
request ``/ping``'s direct route does not answer).

Runtime-changeable settings (``PUT /config/...``) live on the NSQD object as
``nsqd.runtime_lookupd_tcp_addresses`` (list of ``host:port``) and
``nsqd.runtime_log_level`` (``"debug"``...``"fatal"``); when NSQD has a
``config_changed(name)`` method it is called after each change.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Generator
from typing import Any

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.python.failure import Failure

from nsqtw import NSQD_VERSION
from nsqtw._go.flags import TLS_REQUIRED
from nsqtw._go.json import go_loads
from nsqtw._go.strconv import parse_int
from nsqtw.core.admission import PUBLISHED, WaitForRoom, Written, admit
from nsqtw.core.nsqd import NSQD
from nsqtw.errors import BackendError, ExitingError, ReplicaError
from nsqtw.http.base import APIError, GoHTTPAPI, Marshal, RawJSON, route, sniff
from nsqtw.http.metrics import MetricsPage
from nsqtw.http.origin import origin_of
from nsqtw.log import LEVELS
from nsqtw.names import is_valid_channel_name, is_valid_topic_name
from nsqtw.observe.metrics import NSQDMetrics
from nsqtw.observe.stats import run_in_slices, snapshot_steps, text_steps
from nsqtw.observe.stats_json import stats_json_steps

__all__ = ["HTTPAPI", "ROUTES"]

_NS = 1_000_000_000
#: nsqd's boolParams: anything else means "true" for these flags
#: seconds an HTTP publish waits in all for room under the bound of unwritten records, then 503
PUBLISH_ROOM_WAIT = 10.0

_BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}

#: every route nsqd v1.3.0 answers (the /debug/pprof ones excepted), with its methods
ROUTES: dict[str, tuple[str, ...]] = {
    "/ping": ("GET",),
    "/info": ("GET",),
    "/pub": ("POST",),
    "/mpub": ("POST",),
    "/stats": ("GET",),
    "/topic/create": ("POST",),
    "/topic/delete": ("POST",),
    "/topic/empty": ("POST",),
    "/topic/pause": ("POST",),
    "/topic/unpause": ("POST",),
    "/channel/create": ("POST",),
    "/channel/delete": ("POST",),
    "/channel/empty": ("POST",),
    "/channel/pause": ("POST",),
    "/channel/unpause": ("POST",),
    "/config/:opt": ("GET", "PUT"),
    # nsqtw only: Prometheus (docs/metrics.md)
    "/metrics": ("GET",),
}
def _go_json_value(kind: str, value: Any) -> Any:
    """An option's value as nsqd's ``GET /config/:opt`` marshals it."""
    if kind == "duration":
        return round(value * _NS)
    if kind == "log-level":
        return LEVELS.get(str(value).lower(), LEVELS["info"])[1]
    if kind in ("strings", "floats"):
        return None if value is None else list(value)
    if kind == "bool":
        return bool(value)
    if kind == "string":
        return str(value)
    return int(value)



#: what Go sniffs ``OK`` as (text/plain; charset=utf-8), worked out once: a healthy /ping is frequent
_OK_TYPE = sniff(b"OK")


def _exiting(_: object) -> str:
    """nsqd answers any failure to queue a publish with 503 EXITING."""
    raise APIError(503, "EXITING")


def _refused(failure: Failure) -> str:
    """A publish that was queued but not answered OK: 503 ``NO_REPLICA`` when no replica acked
    it within ``--replica-wait`` (``--replicas=2``), else nsqd's 503 ``EXITING``."""
    if failure.check(ReplicaError):
        raise APIError(503, "NO_REPLICA")
    raise APIError(503, "EXITING")


class HTTPAPI(GoHTTPAPI):
    """nsqd's HTTP API over one :class:`~nsqtw.core.nsqd.NSQD`."""

    routes = ROUTES
    direct_routes = {b"/ping": "ping"}

    def __init__(self, nsqd: NSQD, tls_enabled: bool = False, metrics: MetricsPage | None = None) -> None:
        self.nsqd = nsqd
        self.tls_enabled = tls_enabled
        if metrics is None:
            # the service shares one page (one registry) between HTTP and HTTPS
            node = NSQDMetrics(nsqd, nsqd.clock, bool(getattr(nsqd.options, "metrics_per_client", False)))
            metrics = MetricsPage(node.collector, node.prepare)
        self.metrics_page = metrics
        options = nsqd.options
        self.tls_required = getattr(options, "tls_required", 0) == TLS_REQUIRED
        # nsqtw: requests that change state are refused from web pages of other origins
        self.browser_origins = frozenset(origin_of(o) for o in getattr(options, "http_allow_origin", ()))
        if nsqd.replication is not None:
            # --replicas=2 only: without, GET /replication is any unknown path's 404, as in Go, and
            # the HTTP channel asks nothing of a request's head
            self.direct_routes = {**HTTPAPI.direct_routes, b"/replication": "replication"}
            self.upgrade = self._replication_link

    # -- replication (nsqtw only, --replicas=2) ------------------------------------------

    def replication(self, request: Any) -> bytes:
        """``GET /replication``: this node replicates; its version and incarnation (peers read it);
        with ``?replica=ADDRESS``, also the topics whose copies that node must keep; with
        ``?owner=ADDRESS``, the notes this node keeps for that node, if any."""
        assert self.nsqd.replication is not None
        self._log_request(request, 200)
        args = getattr(request, "args", None) or {}  # (a direct request has none: the plain path)
        replica, owner = (args.get(name, [b""])[0].decode("utf-8", "replace") for name in (b"replica", b"owner"))
        return self._v1(request, 200, Marshal(self.nsqd.replication.info(replica or None, owner or None)))

    #: the HTTP channel's ``Upgrade`` hook (:meth:`_replication_link` with ``--replicas=2``), else None
    upgrade: Callable[[bytes], Any] | None = None

    def _replication_link(self, head: bytes) -> tuple[Any, list[bytes]] | None:
        """The link's upgrade (``GET /replication/link``, ``Upgrade: nsqtw-replication/1``): a maker
        of the link protocol for the transport and the ``101``'s extra header lines, or None
        (answered as any request)."""
        replication = self.nsqd.replication
        if replication is None or not head.startswith(b"GET /replication/link HTTP/1.1\r\n"):
            return None
        if b"\r\nupgrade: nsqtw-replication/1\r\n" not in head.lower():
            return None
        return replication.upgrade(head)

    def https_port(self) -> int:
        return int(self.nsqd.https_port)

    def body_limit(self, target: bytes) -> int:
        """How many body bytes a request to ``target`` may keep: nsqd's limit + 1."""
        o = self.nsqd.options
        path = target.split(b"?", 1)[0]
        if path == b"/pub" or path.startswith(b"/config/"):
            return int(o.max_msg_size) + 1
        return int(o.max_body_size) + 1

    # -- /ping and /info ---------------------------------------------------

    @route("/ping", ("GET",))
    def ping(self, request: Any) -> bytes:
        """nsqd's PlainText answer: the health text, 500 when unhealthy."""
        health = self.nsqd.health()
        code = 200 if health == "OK" else 500
        self._log_request(request, code)
        if code == 200:
            return self._write(request, code, b"OK", _OK_TYPE)
        body = health.encode("utf-8", "surrogateescape")
        return self._write(request, code, body, sniff(body))

    @route("/info", ("GET",))
    def info(self, request: Any) -> Any:
        return self._run(request, self._info)

    def _info(self, request: Any) -> dict[str, Any]:
        o = self.nsqd.options
        return {
            "version": NSQD_VERSION,
            "broadcast_address": o.broadcast_address,
            "hostname": socket.gethostname(),
            "http_port": self.nsqd.http_port,
            "tcp_port": self.nsqd.tcp_port,
            "start_time": int(self.nsqd.start_time),
            "max_heartbeat_interval": round(o.max_heartbeat_interval * _NS),
            "max_output_buffer_size": int(o.max_output_buffer_size),
            "max_output_buffer_timeout": round(o.max_output_buffer_timeout * _NS),
            "max_deflate_level": int(o.max_deflate_level),
        }

    # -- publishing ----------------------------------------------------------

    @route("/pub", ("POST",))
    def pub(self, request: Any) -> Any:
        return self._run(request, self._pub, logged=False)

    @route("/mpub", ("POST",))
    def mpub(self, request: Any) -> Any:
        return self._run(request, self._mpub, logged=False)

    def _topic_from_query(self, request: Any) -> tuple[dict[str, list[str]], str]:
        """nsqd's getTopicFromQuery, without the get-or-create (done by the caller)."""
        values, bad = self._query(request)
        if bad:
            raise APIError(400, "INVALID_REQUEST")
        if "topic" not in values:
            raise APIError(400, "MISSING_ARG_TOPIC")
        name = values["topic"][0]
        if not is_valid_topic_name(name):
            raise APIError(400, "INVALID_TOPIC")
        return values, name

    def _publish(self, name: str, bodies: list[bytes], defer: float = 0.0,
                 waited: float = 0.0) -> str | Deferred[str]:
        """/pub and /mpub: the node's admission (:func:`~nsqtw.core.admission.admit`), answered
        ``OK`` now or once a spill to disk is written (as TCP), any refusal 503 ``EXITING``.

        Past the memory bound of unwritten records (the rule TCP publishers
        follow too, :meth:`NSQD.wait_for_room`) the request waits for room,
        at most :data:`PUBLISH_ROOM_WAIT` seconds in all, then gets a 503.
        """
        outcome = admit(self.nsqd, name, bodies, defer)
        if outcome is PUBLISHED:
            return "OK"
        if isinstance(outcome, Written):
            return outcome.deferred.addCallbacks(lambda _: "OK", _refused)
        if isinstance(outcome, WaitForRoom):
            return self._publish_when_room(outcome.room, name, bodies, defer, waited)
        raise APIError(503, "EXITING")  # nsqd answers any failure to queue so

    def _publish_when_room(self, room: Deferred[None], name: str, bodies: list[bytes], defer: float,
                           waited: float) -> Deferred[str]:
        clock = self.nsqd.clock
        started = clock.seconds()
        left = PUBLISH_ROOM_WAIT - waited
        if left <= 0:
            room.addErrback(lambda _: None)
            room.cancel()
            raise APIError(503, "EXITING")
        room.addTimeout(left, clock)

        def retry(_: object) -> str | Deferred[str]:
            return self._publish(name, bodies, defer, waited + clock.seconds() - started)

        def failed(_: Any) -> str:
            self.log.warn("NSQ: HTTP publish to topic({topic}) refused - no room for unwritten messages after {s}s",  # noqa: G010 - twisted Logger
                          topic=name, s=PUBLISH_ROOM_WAIT)
            return _exiting(None)

        out: Deferred[str] = room.addCallbacks(retry, failed)
        return out

    def _too_long(self, request: Any, limit: int) -> bool:
        declared = getattr(request, "declared_length", None)
        if declared is None:
            declared = request.getHeader(b"content-length")
            try:
                declared = int(declared) if declared is not None else None
            except ValueError:
                declared = None
        return declared is not None and declared > limit

    def _pub(self, request: Any) -> str | Deferred[str]:
        o = self.nsqd.options
        max_msg = int(o.max_msg_size)
        if self._too_long(request, max_msg):
            raise APIError(413, "MSG_TOO_BIG")
        body = self._body(request, max_msg + 1)
        if len(body) == max_msg + 1:
            raise APIError(413, "MSG_TOO_BIG")
        if not body:
            raise APIError(400, "MSG_EMPTY")
        values, name = self._topic_from_query(request)
        defer = 0.0
        if "defer" in values:
            try:
                ms = parse_int(values["defer"][0])
            except ValueError:
                raise APIError(400, "INVALID_DEFER") from None
            if ms < 0 or ms * 1_000_000 > round(o.max_req_timeout * _NS):
                raise APIError(400, "INVALID_DEFER")
            defer = ms / 1000.0
        self.nsqd.get_topic(name)
        return self._publish(name, [body], defer)

    def _mpub(self, request: Any) -> str | Deferred[str]:
        o = self.nsqd.options
        max_body, max_msg = int(o.max_body_size), int(o.max_msg_size)
        if self._too_long(request, max_body):
            raise APIError(413, "BODY_TOO_BIG")
        values, name = self._topic_from_query(request)
        self.nsqd.get_topic(name)
        binary = False
        if "binary" in values:
            value = values["binary"][0]
            binary = _BOOL_PARAMS.get(value, True)
            if value not in _BOOL_PARAMS:
                self.log.warn("deprecated value '{value}' used for /mpub binary param", value=value)  # noqa: G010 - twisted Logger
        read_max = max_body + 1
        data = self._body(request, read_max)
        if binary and len(data) > max_body:
            # only a chunked body can get here; nsqd would read on
            raise APIError(413, "BODY_TOO_BIG")
        # a body of millions of tiny messages is split a piece per reactor turn; all of it is
        # checked before any of it is published, as nsqd reads the whole body first
        steps = _read_mpub(data, max_msg, max_body) if binary else _mpub_lines(data, max_msg, read_max)
        parsed = run_in_slices(steps, self.nsqd.clock)
        return parsed.addCallback(lambda bodies: self._publish(name, bodies))

    # -- topics ----------------------------------------------------------------

    def _existing_topic(self, name: str) -> Any:
        topic = self.nsqd.get_existing_topic(name)
        if topic is None:
            raise APIError(404, "TOPIC_NOT_FOUND")
        return topic

    @route("/topic/create", ("POST",))
    def topic_create(self, request: Any) -> Any:
        return self._run(request, self._topic_create)

    def _topic_create(self, request: Any) -> None:
        _, name = self._topic_from_query(request)
        self.nsqd.get_topic(name)

    @route("/topic/empty", ("POST",))
    def topic_empty(self, request: Any) -> Any:
        return self._run(request, self._topic_empty)

    async def _topic_empty(self, request: Any) -> None:
        values = self._params(request)
        if "topic" not in values:
            raise APIError(400, "MISSING_ARG_TOPIC")
        name = values["topic"][0]
        if not is_valid_topic_name(name):
            raise APIError(400, "INVALID_TOPIC")
        topic = self._existing_topic(name)
        try:
            await topic.empty()
        except (OSError, BackendError):
            self.log.failure("TOPIC({topic}): empty failed", topic=name)
            raise APIError(500, "INTERNAL_ERROR") from None

    @route("/topic/delete", ("POST",))
    def topic_delete(self, request: Any) -> Any:
        return self._run(request, self._topic_delete)

    async def _topic_delete(self, request: Any) -> None:
        values = self._params(request)
        if "topic" not in values:
            raise APIError(400, "MISSING_ARG_TOPIC")
        name = values["topic"][0]
        try:
            d = self.nsqd.delete_topic(name)
        except KeyError:
            raise APIError(404, "TOPIC_NOT_FOUND") from None
        try:
            await d
        except (OSError, BackendError):
            # nsqd answers 200 whatever the deletion of the files says
            self.log.failure("TOPIC({topic}): delete failed", topic=name)

    @route("/topic/pause", ("POST",))
    def topic_pause(self, request: Any) -> Any:
        return self._run(request, self._topic_pause, True)

    @route("/topic/unpause", ("POST",))
    def topic_unpause(self, request: Any) -> Any:
        return self._run(request, self._topic_pause, False)

    def _topic_pause(self, request: Any, pause: bool) -> None:
        values = self._params(request)
        if "topic" not in values:
            raise APIError(400, "MISSING_ARG_TOPIC")
        topic = self._existing_topic(values["topic"][0])
        topic.pause() if pause else topic.unpause()

    # -- channels ----------------------------------------------------------------

    def _topic_channel(self, request: Any) -> tuple[Any, str]:
        """nsqd's getExistingTopicFromQuery: the topic, and a valid channel name."""
        values = self._params(request)
        if "topic" not in values:
            raise APIError(400, "MISSING_ARG_TOPIC")
        topic_name = values["topic"][0]
        if not is_valid_topic_name(topic_name):
            raise APIError(400, "INVALID_ARG_TOPIC")
        if "channel" not in values:
            raise APIError(400, "MISSING_ARG_CHANNEL")
        channel_name = values["channel"][0]
        if not is_valid_channel_name(channel_name):
            raise APIError(400, "INVALID_ARG_CHANNEL")
        return self._existing_topic(topic_name), channel_name

    @staticmethod
    def _existing_channel(topic: Any, name: str) -> Any:
        channel = topic.channels.get(name)
        if channel is None:
            raise APIError(404, "CHANNEL_NOT_FOUND")
        return channel

    @route("/channel/create", ("POST",))
    def channel_create(self, request: Any) -> Any:
        return self._run(request, self._channel_create)

    def _channel_create(self, request: Any) -> None:
        topic, name = self._topic_channel(request)
        try:
            topic.get_channel(name)
        except ExitingError:
            raise APIError(503, "EXITING") from None

    @route("/channel/empty", ("POST",))
    def channel_empty(self, request: Any) -> Any:
        return self._run(request, self._channel_empty)

    async def _channel_empty(self, request: Any) -> None:
        topic, name = self._topic_channel(request)
        channel = self._existing_channel(topic, name)
        try:
            await channel.empty()
        except (OSError, BackendError):
            self.log.failure("CHANNEL({topic}:{channel}): empty failed", topic=topic.name, channel=name)
            raise APIError(500, "INTERNAL_ERROR") from None
        if self.nsqd.replication is not None:
            self.nsqd.replication.channel_emptied(topic.name, name)

    @route("/channel/delete", ("POST",))
    def channel_delete(self, request: Any) -> Any:
        return self._run(request, self._channel_delete)

    async def _channel_delete(self, request: Any) -> None:
        topic, name = self._topic_channel(request)
        try:
            d = topic.delete_channel(name)
        except KeyError:
            raise APIError(404, "CHANNEL_NOT_FOUND") from None
        try:
            await d
        except (OSError, BackendError):
            self.log.failure("CHANNEL({topic}:{channel}): delete failed", topic=topic.name, channel=name)

    @route("/channel/pause", ("POST",))
    def channel_pause(self, request: Any) -> Any:
        return self._run(request, self._channel_pause, True)

    @route("/channel/unpause", ("POST",))
    def channel_unpause(self, request: Any) -> Any:
        return self._run(request, self._channel_pause, False)

    def _channel_pause(self, request: Any, pause: bool) -> None:
        topic, name = self._topic_channel(request)
        channel = self._existing_channel(topic, name)
        channel.pause() if pause else channel.unpause()

    # -- stats ---------------------------------------------------------------------

    @route("/stats", ("GET",))
    def stats(self, request: Any) -> Any:
        return self._run(request, self._stats)

    def _stats(self, request: Any) -> Any:
        values = self._params(request)

        def first(key: str) -> str:
            return values[key][0] if key in values else ""

        include_clients = _BOOL_PARAMS.get(first("include_clients"), True)
        include_mem = _BOOL_PARAMS.get(first("include_mem"), True)
        return ensureDeferred(self._stats_in_slices(first("topic"), first("channel"), include_clients,
                                                    include_mem, first("format") == "json"))

    async def _stats_in_slices(self, topic: str, channel: str, include_clients: bool, include_mem: bool,
                               as_json: bool) -> Any:
        """The JSON written straight, or the snapshot then its text, a few milliseconds of reactor time at a time.

        nsqadmin polls /stats; at 10,000 channels, or with clients that sent
        megabytes of identity, doing it in one go stalled every connection.
        """
        clock = self.nsqd.clock
        if as_json:
            return RawJSON(await run_in_slices(stats_json_steps(self.nsqd, topic, channel, include_clients,
                                                                include_mem), clock))
        snap = await run_in_slices(snapshot_steps(self.nsqd, topic, channel, include_clients, include_mem), clock)
        start = getattr(self.nsqd, "start_time_precise", None)
        text = await run_in_slices(text_steps(snap, clock.seconds(), start), clock)
        return text.encode("utf-8", "surrogateescape")

    # -- metrics (nsqtw only) ------------------------------------------------------------

    @route("/metrics", ("GET",))
    def metrics(self, request: Any) -> Any:
        """Prometheus text (or OpenMetrics, by ``Accept``); see :mod:`nsqtw.observe.metrics`."""
        return ensureDeferred(self._serve_metrics(request, self.metrics_page))

    # -- config ----------------------------------------------------------------------

    @route("/config/<opt>", ("GET", "PUT",))
    def config(self, request: Any, opt: str) -> Any:
        return self._run(request, self._config, opt)

    def _config(self, request: Any, opt: str) -> Any:
        nsqd: Any = self.nsqd
        if request.method == b"PUT":
            read_max = int(nsqd.options.max_msg_size) + 1
            body = self._body(request, read_max)
            if len(body) == read_max or not body:
                raise APIError(413, "INVALID_VALUE")
            if opt == "nsqlookupd_tcp_addresses":
                try:
                    addresses = go_loads(body)
                except ValueError:
                    raise APIError(400, "INVALID_VALUE") from None
                if addresses is not None and (not isinstance(addresses, list)
                                              or not all(isinstance(a, str) for a in addresses)):
                    raise APIError(400, "INVALID_VALUE")
                if addresses is not None and len(addresses) > MAX_LOOKUPD_ADDRESSES:
                    # Go takes any number (and dials them one by one); thousands of
                    # peers are a mistake or an attack, not a cluster
                    self.log.error("config nsqlookupd_tcp_addresses refused: {count} addresses, more than "
                                   "the {limit} nsqtw accepts", count=len(addresses), limit=MAX_LOOKUPD_ADDRESSES)
                    raise APIError(400, "INVALID_VALUE")
                nsqd.runtime_lookupd_tcp_addresses = addresses
            elif opt == "log_level":
                level = body.decode("utf-8", "surrogateescape").lower()
                if level not in LEVELS:
                    raise APIError(400, "INVALID_VALUE")
                nsqd.runtime_log_level = level
            else:
                raise APIError(400, "INVALID_OPTION")
            self.log.info("config {option} changed", option=opt)
            changed = getattr(nsqd, "config_changed", None)
            if callable(changed):
                changed(opt)
        return self._config_value(opt)

    def _config_value(self, opt: str) -> Any:
        nsqd: Any = self.nsqd
        if opt == "nsqlookupd_tcp_addresses":
            return Marshal(nsqd.runtime_lookupd_tcp_addresses)
        if opt == "log_level":
            return Marshal(LEVELS[nsqd.runtime_log_level][1])
        try:
            from nsqtw.nsqd.options import FLAGS_BY_TOML_KEY
        except ImportError:  # pragma: no cover - options.py is part of the package
            raise APIError(400, "INVALID_OPTION") from None
        flag = FLAGS_BY_TOML_KEY.get(opt)
        if flag is None:
            raise APIError(400, "INVALID_OPTION")
        value = getattr(nsqd.options, flag.attribute, flag.default)
        if flag.kind == "string":
            return str(value)  # RespondV1 writes Go strings as they are, not as JSON
        return Marshal(_go_json_value(flag.kind, value))


#: the most nsqlookupd addresses PUT /config/nsqlookupd_tcp_addresses accepts (nsqtw's bound)
MAX_LOOKUPD_ADDRESSES = 100


#: the bytes of a newline-separated /mpub body split in one step of :func:`_mpub_lines`
MPUB_TEXT_PIECE = 65536
#: the messages of a binary /mpub body read in one step of :func:`_read_mpub`
MPUB_BINARY_PIECE = 8192


def _mpub_lines(data: bytes, max_msg: int, read_max: int) -> Generator[None, None, list[bytes]]:
    """nsqd's newline-separated /mpub body as messages, a piece of lines per step.

    As nsqd reads it: one message per line (its ``\\n`` dropped, empty lines
    skipped), 413 ``MSG_TOO_BIG`` for a line longer than ``max_msg``, and 413
    ``BODY_TOO_BIG`` when the body reaches ``read_max`` (nsqd's limit + 1),
    which nsqd finds at the line holding the last byte, before that line's
    own size.
    """
    bodies: list[bytes] = []
    end = len(data)
    pos = 0
    while pos < end:
        nl = data.find(b"\n", pos + MPUB_TEXT_PIECE - 1)
        cut = end if nl == -1 else nl + 1
        lines = data[pos:cut].split(b"\n")
        if cut == end and end == read_max:
            before_last = lines[:-2] if data.endswith(b"\n") else lines[:-1]
            if before_last and max(map(len, before_last)) > max_msg:
                raise APIError(413, "MSG_TOO_BIG")
            raise APIError(413, "BODY_TOO_BIG")
        if max(map(len, lines)) > max_msg:
            raise APIError(413, "MSG_TOO_BIG")
        bodies.extend(filter(None, lines))
        pos = cut
        yield
    return bodies


def _read_mpub(data: bytes, max_msg: int, max_body: int) -> Generator[None, None, list[bytes]]:
    """nsqd's readMPUB over a whole binary /mpub body, a piece per step; errors are nsqd's codes minus ``E_``."""
    if len(data) < 4:
        raise APIError(413, "BAD_BODY")
    (count,) = struct.unpack_from(">i", data, 0)
    if count <= 0 or count > (max_body - 4) // 5:
        raise APIError(413, "BAD_BODY")
    pos = 4
    bodies = []
    for i in range(count):
        if pos + 4 > len(data):
            raise APIError(413, "BAD_MESSAGE")
        (size,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if size <= 0 or size > max_msg:
            raise APIError(413, "BAD_MESSAGE")
        if pos + size > len(data):
            raise APIError(413, "BAD_MESSAGE")
        bodies.append(data[pos:pos + size])
        pos += size
        if i % MPUB_BINARY_PIECE == MPUB_BINARY_PIECE - 1:
            yield
    return bodies
