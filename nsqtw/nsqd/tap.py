"""twistd plugin glue for ``twistd nsqtw``: options in, service out."""

from __future__ import annotations

from typing import cast

from twisted.application.service import IService

from nsqtw.log import start_daemon
from nsqtw.net.tls import TLSConfigError
from nsqtw.nsqd.options import NSQDTwistdOptions as Options
from nsqtw.nsqd.service import NSQDService

__all__ = ["Options", "makeService"]


def makeService(config: Options) -> IService:
    start_daemon("nsqd", config.nsqd.version, config.nsqd.log_level, config.nsqd.log_prefix)
    try:
        return cast(IService, NSQDService(config.nsqd))
    except TLSConfigError as e:
        # nsqd: "failed to instantiate nsqd - failed to build TLS config - ..."
        raise SystemExit(f"nsqtw: failed to build TLS config - {e}") from None
