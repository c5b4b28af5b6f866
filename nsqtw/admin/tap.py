"""twistd plugin glue for ``twistd nsqtw-admin``: options in, service out."""

from __future__ import annotations

import socket
from typing import cast

from twisted.application.service import IService

from nsqtw.admin.options import AdminOptions
from nsqtw.admin.options import AdminTwistdOptions as Options
from nsqtw.log import start_daemon
from nsqtw.net.listen import split_host_port

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
    opts = config.admin
    start_daemon("nsqadmin", opts.version, opts.log_level, opts.log_prefix,
                 getattr(config, "parent", None))
    _resolve_addresses(opts)
    from nsqtw.admin.service import AdminService

    try:
        service = AdminService(opts)
    except ValueError as e:
        raise SystemExit(f"FATAL: failed to instantiate nsqadmin - {e}") from None
    return cast(IService, service)
