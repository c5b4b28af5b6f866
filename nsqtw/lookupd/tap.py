"""twistd plugin glue for ``twistd nsqtw-lookupd``: options in, service out.

nsqlookupd has no TLS: pyOpenSSL is kept out of the process before the
service (and with it Twisted's reactor) is imported in :func:`makeService`
(``nsqtw.net.tls.keep_openssl_out``, ``docs/performance.md``, Memory), and
nsqtw's reactor installed unless ``twistd --reactor`` chose one
(:func:`nsqtw.net.reactor.install_for_daemon`).
"""

from __future__ import annotations

from typing import cast

from twisted.application.service import IService

from nsqtw.log import start_daemon
from nsqtw.lookupd.options import LookupdTwistdOptions as Options
from nsqtw.net.launch import report_to_launcher
from nsqtw.net.limits import raise_open_file_limit
from nsqtw.net.reactor import install_for_daemon
from nsqtw.net.tls import keep_openssl_out

__all__ = ["Options", "makeService"]


def makeService(config: Options) -> IService:
    raise_open_file_limit()  # as Go's runtime does: sockets and segments are descriptors
    keep_openssl_out(False)  # before anything imports the reactor (LookupdService below)
    install_for_daemon()  # before start_daemon: its log writer imports the reactor
    start_daemon("nsqlookupd", config.lookupd.version, config.lookupd.log_level, config.lookupd.log_prefix,
                 getattr(config, "parent", None))
    from nsqtw.lookupd.service import LookupdService

    service = LookupdService(config.lookupd)
    # last: without -n, the process that was started waits here for the daemon's word
    report_to_launcher(getattr(config, "parent", None), "nsqlookupd")
    return cast(IService, service)
