"""nsqadmin's HTTP server (v1.3.0) on Klein: the pages, their assets and the JSON API under ``/api/``.

Answers are shaped by the Go ``http_api`` helpers nsqd's API uses
(:class:`~nsqtw.http.base.GoHTTPAPI`): ``{"message": ...}`` errors, Go
strings written as they are, httprouter's redirects, 405s and 404s. Every
route lives under ``--base-path``. The cluster is asked through
:class:`~nsqtw.admin.cluster.ClusterInfo`; a node or lookupd that fails
makes the answer partial (``"message": "WARNING: ..."``), all failing makes
it a 502, as in nsqadmin.

nsqtw adds ``GET /api/history`` (the charts' series, see
:mod:`nsqtw.admin.history`), a ``results`` list in every action's answer
(what each request to a node or lookupd did), and refuses requests that
change state when a browser sends them from another site
(:func:`cross_site_refusal`), which Go nsqadmin takes.
"""

from __future__ import annotations

from nsqtw.admin.actions import AdminActions
from nsqtw.admin.pages import AdminPages
from nsqtw.admin.queries import AdminQueries
from nsqtw.admin.routes import ROUTES, cross_site_refusal

__all__ = ["ROUTES", "AdminHTTPAPI", "cross_site_refusal"]


class AdminHTTPAPI(AdminPages, AdminQueries, AdminActions):
    """nsqadmin's routes over one cluster; ``options`` may change at run time (PUT /config)."""
