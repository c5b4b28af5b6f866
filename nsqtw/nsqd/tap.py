"""twistd plugin glue for ``twistd nsqtw``: options in, service out.

Only the options are imported when twistd loads the plugin; the service
(and with it Twisted's reactor) is imported in :func:`makeService`, once the
options say whether TLS can be needed.  Without any TLS option pyOpenSSL is
kept out of the process before the reactor is first imported: Twisted's
reactor loads it (with cryptography) only to offer TLS, about 12 MB of idle
RSS that such a node never uses (``docs/performance.md``, Memory).
"""

from __future__ import annotations

import sys
from typing import Any, cast

from twisted.application.service import IService

from nsqtw.log import start_daemon
from nsqtw.nsqd.options import NSQDTwistdOptions as Options

__all__ = ["Options", "keep_openssl_out", "makeService"]


def keep_openssl_out(options: Any) -> bool:
    """Make ``import OpenSSL`` fail in this process when ``options`` can never use TLS.

    Twisted's reactor treats a missing pyOpenSSL as "TLS unavailable" and
    carries on, and nothing else nsqd does without a TLS option touches it.
    Done only before anything imported the reactor or OpenSSL (a process
    that already has them, such as a test run, is left as it is).
    Returns whether OpenSSL was kept out.
    """
    if options.needs_openssl:
        return False
    if "OpenSSL" in sys.modules or "twisted.internet.reactor" in sys.modules:
        return False
    sys.modules["OpenSSL"] = None  # type: ignore[assignment]
    return True


def makeService(config: Options) -> IService:
    keep_openssl_out(config.nsqd)
    start_daemon("nsqd", config.nsqd.version, config.nsqd.log_level, config.nsqd.log_prefix,
                 getattr(config, "parent", None))
    from nsqtw.net.tls import TLSConfigError
    from nsqtw.nsqd.service import InstantiateError, NSQDService

    try:
        service = NSQDService(config.nsqd)
    except TLSConfigError as e:
        # nsqd: "failed to instantiate nsqd - failed to build TLS config - ..."
        raise SystemExit(f"nsqtw: failed to build TLS config - {e}") from None
    try:
        # before the reactor runs, as nsqd's New() does: a missing or busy data path exits 1 at once
        service.lock.acquire()
    except InstantiateError as e:
        raise SystemExit(f"FATAL: failed to instantiate nsqd - {e}") from None
    except RuntimeError as e:
        raise SystemExit(f"FATAL: failed to start - {e}") from None
    return cast(IService, service)
