"""``--workers``: one node on several processes (docs/architecture.md)."""
