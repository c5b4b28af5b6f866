"""Replication (``--replicas=2``): every acknowledged message held by two nodes (docs/architecture.md)."""
