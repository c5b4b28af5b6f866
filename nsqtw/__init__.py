"""nsqtw: NSQ's nsqd and nsqlookupd on Twisted."""

from nsqtw import speedups as _speedups

_speedups.install()  # before any compiled module is imported: the compiled build or the .py files

__version__ = "0.1.0"

#: The nsqd version nsqtw speaks for (IDENTIFY, /info, /stats).
NSQD_VERSION = "1.3.0"


def version_banner(program: str) -> str:
    """Go's version line, ``nsqd v1.3.0 (built w/nsqtw-0.1.0)``: tools parse this shape.

    Go prints ``(built w/go1.19.8)``; the build token here names what really
    built the program, in the token syntax client test harnesses accept.
    """
    return f"{program} v{NSQD_VERSION} (built w/nsqtw-{__version__})"
