"""twistd plugin glue for ``twistd nsqtw``: options in, service out."""

from __future__ import annotations

from typing import cast

from twisted.application.service import IService

from nsqtw.log import start_daemon
from nsqtw.net.tls import TLSConfigError
from nsqtw.nsqd.options import NSQDTwistdOptions as Options
from nsqtw.nsqd.service import InstantiateError, NSQDService

__all__ = ["Options", "makeService"]


def makeService(config: Options) -> IService:
    start_daemon("nsqd", config.nsqd.version, config.nsqd.log_level, config.nsqd.log_prefix,
                 getattr(config, "parent", None))
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
