"""Placeholder HTTP API (being replaced by the full nsqd HTTP API)."""

from __future__ import annotations

from typing import Any

from klein import Klein

from nsqtw.nsqd import NSQD


class HTTPAPI:
    app = Klein()

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd

    def resource(self) -> Any:
        return self.app.resource()

    @app.route("/ping", methods=["GET", "HEAD"])
    def ping(self, request: Any) -> bytes:
        request.setHeader("Content-Type", "text/plain; charset=utf-8")
        return b"OK"
