"""nsqtw: NSQ's nsqd and nsqlookupd on Twisted."""

__version__ = "0.1.0"

#: The nsqd version nsqtw speaks for (IDENTIFY, /info, /stats).
NSQD_VERSION = "1.3.0"
