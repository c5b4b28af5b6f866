"""The Go-compatible HTTP layer nsqd, nsqlookupd and nsqadmin share (see :mod:`nsqtw.http.base`).

Nothing is imported here: :mod:`nsqtw.http.metrics` must be importable
without :mod:`nsqtw.http.base` (twisted.web, Klein), which a daemon loads
only at its first HTTP connection (``nsqtw.net.lazy``).
"""
