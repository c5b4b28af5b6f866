"""twisted.web's server side of the HTTP APIs, imported at the first request a direct route does not answer.

``twisted.web.server`` imports ``twisted.spread``, templates, ``xml.sax`` and
hyperlink (about 3 MB of RSS); a node whose HTTP so far is health checks
(``GET /ping``, answered by :class:`nsqtw.http.channel.GoHTTPChannel` itself)
never needs it. :meth:`nsqtw.http.base.GoSite.request_site` imports this
module and makes the :class:`RequestSite` its requests run against.
"""

from __future__ import annotations

from io import BytesIO
from typing import Any

from twisted.web.server import Request, Site

from nsqtw.http.channel import DISCARD_LIMIT, GoHTTPChannel
from nsqtw.interfaces import IHTTPAPI
from nsqtw.net.twisted_privates import request_target

__all__ = ["BoundedRequest", "RequestSite"]


class BoundedRequest(Request):
    """A request that keeps at most ``limit`` body bytes, dropping the rest as it arrives.

    twisted.web buffers a whole body before any handler runs; this keeps
    only what nsqd would read (its limit plus one byte, so "too big" can
    still be told apart) and counts the rest in ``body_received``. A body
    more than :data:`DISCARD_LIMIT` past the limit (declared so, or
    streamed so with chunked encoding) is not waited for: the handler runs
    at once on what was kept, and the connection closes after the answer.
    """

    body_limit = 0
    body_received = 0
    declared_length: int | None = None
    #: the body went far past the limit: answer now, close after
    over_limit = False
    _hidden_content_type: list[bytes] | None = None

    def _limit(self) -> int:
        api = getattr(getattr(self.channel, "site", None), "api", None)
        # twisted.web keeps the request target only in a private attribute until the body
        # is in (nsqtw.net.twisted_privates); without it, every route gets the largest
        # limit, which still answers right.
        target = request_target(self.channel)
        if IHTTPAPI.providedBy(api):
            limit: int = api.body_limit(target or b"")
            return limit
        return 5 * 1024 * 1024 + 1

    def gotLength(self, length: int | None) -> None:
        self.declared_length = length
        self.body_limit = self._limit()
        self.body_received = 0
        self._kept = BytesIO()
        self.content = self._kept
        if length is not None and length > self.body_limit + DISCARD_LIMIT:
            # the declared length alone decides the answer (too big): the
            # channel runs the request now, with no body, and closes after
            self.over_limit = True
            self.channel.persistent = False
            self.channel.length = 0
            if isinstance(self.channel, GoHTTPChannel):
                self.channel.cut_off()

    def handleContentChunk(self, data: bytes) -> None:
        self.body_received += len(data)
        room = self.body_limit - self._kept.tell()
        if room > 0:
            self._kept.write(data[:room] if len(data) > room else data)
        elif self.body_received > self.body_limit + DISCARD_LIMIT:
            self.over_limit = True  # GoHTTPChannel stops reading and answers

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        # nsqd never reads form fields; keep twisted from parsing (possibly
        # large or malformed) form bodies into request.args
        hidden = self.requestHeaders.getRawHeaders(b"content-type")
        self._hidden_content_type = None if hidden is None else list(hidden)
        if self._hidden_content_type is not None:
            self.requestHeaders.removeHeader(b"content-type")
        super().requestReceived(command, path, version)  # type: ignore[no-untyped-call]

    def process(self) -> None:
        if self._hidden_content_type is not None:
            self.requestHeaders.setRawHeaders(b"content-type", self._hidden_content_type)
            self._hidden_content_type = None
        super().process()  # type: ignore[no-untyped-call]


class RequestSite(Site):
    """The Site a listener's requests are processed against (resources, sessions); it never listens itself.

    The listener's factory is :class:`nsqtw.http.base.GoSite`, which logs
    nothing per request; ``api`` gives a request its body limit.
    """

    def __init__(self, api: Any, request_factory: Any = None, **kwargs: Any) -> None:
        super().__init__(api.resource(), request_factory or BoundedRequest, **kwargs)  # type: ignore[no-untyped-call]
        self.api = api
