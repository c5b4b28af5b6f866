"""httprouter's ``CleanPath``: the path nsqd's router redirects an unclean request to."""

from __future__ import annotations

__all__ = ["clean_path"]


def clean_path(path: str) -> str:
    """httprouter's CleanPath: one leading slash, no ``.``/``..``/``//``, trailing slash kept."""
    if not path:
        return "/"
    parts: list[str] = []
    for seg in path.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if parts:
                parts.pop()
            continue
        parts.append(seg)
    out = "/" + "/".join(parts)
    if path.endswith("/") and out != "/":
        out += "/"
    return out
