"""twistd plugin glue for ``twistd nsqtw-admin``: options in, service out.

The service (and with it Twisted's reactor) is imported in
:func:`makeService`, after nsqtw's reactor is installed, unless ``twistd
--reactor`` chose one (:func:`nsqtw.net.reactor.install_for_daemon`).
"""

from __future__ import annotations

import socket
from typing import cast

from twisted.application.service import IService

from nsqtw.admin.options import AdminOptions
from nsqtw.admin.options import AdminTwistdOptions as Options
from nsqtw.log import start_daemon
from nsqtw.net.launch import report_to_launcher
from nsqtw.net.limits import raise_open_file_limit
from nsqtw.net.listen import split_host_port
from nsqtw.net.reactor import install_for_daemon

__all__ = ["Options", "makeService"]


def _resolve_addresses(opts: AdminOptions) -> None:
    """nsqadmin resolves every node address at start and refuses one that does not resolve."""
    for flag, addresses in (("--nsqd-http-address", opts.nsqd_http_address),
                            ("--lookupd-http-address", opts.lookupd_http_address)):
        for address in addresses:
            try:
                host, port = split_host_port(address)
                socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)
            except (ValueError, OSError) as e:
                reason = getattr(e, "strerror", None) or str(e)
                raise SystemExit(f"FATAL: failed to instantiate nsqadmin - failed to resolve"
                                 f" {flag} ({address}) - {reason}") from None


def makeService(config: Options) -> IService:
    raise_open_file_limit()  # as Go's runtime does: sockets and segments are descriptors
    opts = config.admin
    install_for_daemon()  # before start_daemon: its log writer imports the reactor
    start_daemon("nsqadmin", opts.version, opts.log_level, opts.log_prefix,
                 getattr(config, "parent", None))
    _resolve_addresses(opts)
    from nsqtw.admin.service import AdminService

    try:
        service = AdminService(opts)
    except ValueError as e:
        raise SystemExit(f"FATAL: failed to instantiate nsqadmin - {e}") from None
    # last: without -n, the process that was started waits here for the daemon's word
    report_to_launcher(getattr(config, "parent", None), "nsqadmin")
    return cast(IService, service)
