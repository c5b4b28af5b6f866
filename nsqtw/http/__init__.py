"""The Go-compatible HTTP layer nsqd, nsqlookupd and nsqadmin share (see :mod:`nsqtw.http.base`)."""

from nsqtw.http.base import JSON, TEXT, APIError, BoundedRequest, GoHTTPAPI, GoSite, Marshal, sniff

__all__ = ["JSON", "TEXT", "APIError", "BoundedRequest", "GoHTTPAPI", "GoSite", "Marshal", "sniff"]
