"""Observing a node: the stats snapshot, statsd, quantiles."""
