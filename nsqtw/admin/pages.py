"""nsqadmin's page and its assets: ``/ping``, the one HTML page every view path answers with, and
``/static/``, ``/fonts/`` (from the package, or ``--dev-static-dir``)."""

from __future__ import annotations

import mimetypes
import os
from importlib import resources
from typing import Any

from nsqtw import NSQD_VERSION, __version__
from nsqtw._go.json import go_json
from nsqtw.admin.routes import ADMIN_APP, AdminBase, admin_route

_ASSET_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".png": "image/png", ".svg": "image/svg+xml", ".html": "text/html; charset=utf-8"}


class AdminPages(AdminBase):
    """The routes a browser loads: the page and its assets."""

    @admin_route(ADMIN_APP, "/ping", ("GET",))
    def ping(self, request: Any) -> bytes:
        self._log_request(request, 200)
        return self._write(request, 200, b"OK", b"text/plain; charset=utf-8")

    @admin_route(ADMIN_APP, "/", ("GET",))
    @admin_route(ADMIN_APP, "/topics", ("GET",))
    @admin_route(ADMIN_APP, "/topics/<topic>", ("GET",))
    @admin_route(ADMIN_APP, "/topics/<topic>/<channel>", ("GET",))
    @admin_route(ADMIN_APP, "/nodes", ("GET",))
    @admin_route(ADMIN_APP, "/nodes/<node>", ("GET",))
    @admin_route(ADMIN_APP, "/counter", ("GET",))
    @admin_route(ADMIN_APP, "/lookup", ("GET",))
    def index(self, request: Any, **_: str) -> bytes:
        """The one page: it reads the path and draws the view, from the JSON API."""
        opts = self.options
        settings = {
            "version": NSQD_VERSION,
            "nsqtw_version": __version__,
            "base_path": self.base_path,
            "graphite_url": opts.graphite_url,
            "graph_enabled": bool(opts.graphite_url),
            "proxy_graphite": opts.proxy_graphite,
            "statsd_interval": int(opts.statsd_interval),
            "statsd_counter_format": opts.statsd_counter_format,
            "statsd_gauge_format": opts.statsd_gauge_format,
            "statsd_prefix": opts.statsd_prefix,
            "nsqlookupd": self.lookupds,
            "is_admin": self.is_admin(request),
            "history_interval": opts.history_interval if self.history is not None else 0,
        }
        page = self._asset("index.html").decode("utf-8")
        static = self._full("/static")
        page = page.replace("{{STATIC}}", static).replace(
            "{{SETTINGS}}", go_json(settings).decode("utf-8"))
        self._log_request(request, 200)
        return self._write(request, 200, page.encode("utf-8"), b"text/html")

    def _asset(self, name: str) -> bytes:
        if self.options.dev_static_dir:
            with open(os.path.join(self.options.dev_static_dir, name), "rb") as f:
                return f.read()
        return resources.files("nsqtw.admin").joinpath("static", name).read_bytes()

    @admin_route(ADMIN_APP, "/static/<asset>", ("GET",))
    @admin_route(ADMIN_APP, "/fonts/<asset>", ("GET",))
    def static(self, request: Any, asset: str) -> bytes:
        try:
            if asset.startswith(".") or "/" in asset or "\\" in asset or asset == "index.html":
                raise FileNotFoundError(asset)
            body = self._asset(asset)
        except OSError:
            # nsqadmin's PlainText answers: the error code as text
            self._log_request(request, 404)
            return self._write(request, 404, b"NOT_FOUND", b"text/plain; charset=utf-8")
        ext = os.path.splitext(asset)[1]
        ctype = _ASSET_TYPES.get(ext) or mimetypes.guess_type(asset)[0] or ""
        self._log_request(request, 200)
        request.setHeader(b"Cache-Control", b"no-cache")
        return self._write(request, 200, body, ctype.encode() or None)
