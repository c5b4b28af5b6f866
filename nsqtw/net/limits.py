"""The open-file limit a daemon runs with: the soft limit raised to the hard one at start.

Every socket and every open segment is a descriptor. Linux installs give a
process a soft ``RLIMIT_NOFILE`` of 1,024 and a hard one far above it
(systemd's default hard limit is 524,288), and leave raising the soft one
to the program. Go's runtime does it for every Go program since Go 1.19,
Go nsqd included, so nsqtw's daemons do it too, before they open anything.
"""

from __future__ import annotations

__all__ = ["open_file_limit", "raise_open_file_limit"]


def open_file_limit() -> int | None:
    """The soft open-file limit now (``None`` where there is none to read)."""
    try:
        import resource
    except ImportError:  # not on a Unix
        return None
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def raise_open_file_limit() -> tuple[int, int] | None:
    """Raise the soft open-file limit to the hard one, as Go's runtime does; ``(before, after)`` if it moved.

    A hard limit of "unlimited" is left alone (the kernel would refuse it
    for the soft one), as is a limit that cannot be set: the daemon then runs
    with the limit it was given, as Go's does.
    """
    try:
        import resource
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft >= hard:
        return None
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError):
        return None
    return soft, hard
