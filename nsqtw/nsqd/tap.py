"""twistd plugin glue for ``twistd nsqtw``: options in, service out.

Only the options are imported when twistd loads the plugin; the service
(and with it Twisted's reactor) is imported in :func:`makeService`, once the
options say whether TLS can be needed.  Without any TLS option pyOpenSSL is
kept out of the process before the reactor is first imported: Twisted's
reactor loads it (with cryptography) only to offer TLS, about 12 MB of idle
RSS that such a node never uses (``docs/performance.md``, Memory). Then the
reactor is installed: nsqtw's own unless ``twistd --reactor`` chose one
(:func:`nsqtw.net.reactor.install_for_daemon`).
"""

from __future__ import annotations

from typing import cast

from twisted.application.service import IService

from nsqtw.log import start_daemon
from nsqtw.net.launch import report_to_launcher
from nsqtw.net.limits import raise_open_file_limit
from nsqtw.net.reactor import install_for_daemon
from nsqtw.net.tls import TLSConfigError, keep_openssl_out
from nsqtw.nsqd.options import NSQDTwistdOptions as Options

__all__ = ["Options", "makeService"]


def makeService(config: Options) -> IService:
    raise_open_file_limit()  # as Go's runtime does: sockets and segments are descriptors
    # before anything imports the reactor (NSQDService below)
    keep_openssl_out(config.nsqd.needs_openssl)
    install_for_daemon()  # before start_daemon: its log writer imports the reactor
    start_daemon("nsqd", config.nsqd.version, config.nsqd.log_level, config.nsqd.log_prefix,
                 getattr(config, "parent", None))
    from nsqtw.nsqd.service import InstantiateError, NSQDService

    try:
        service = NSQDService(config.nsqd)
    except TLSConfigError as e:
        raise SystemExit(f"FATAL: failed to instantiate nsqd - failed to build TLS config - {e}") from None
    try:
        # before the reactor runs, as nsqd's New() does: a missing or busy data path exits 1 at once
        service.lock.acquire()
    except InstantiateError as e:
        raise SystemExit(f"FATAL: failed to instantiate nsqd - {e}") from None
    # last: without -n, the process that was started waits here for the daemon's word
    report_to_launcher(getattr(config, "parent", None), "nsqd")
    return cast(IService, service)
