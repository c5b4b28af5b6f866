"""twistd plugin glue for ``twistd nsqtw``: options in, service out."""

from __future__ import annotations

from typing import cast

from twisted.application.service import IService

from nsqtw.log import set_level
from nsqtw.options import NSQDTwistdOptions as Options
from nsqtw.service import NSQDService

__all__ = ["Options", "makeService"]


def makeService(config: Options) -> IService:
    if config.nsqd.version:
        from nsqtw import NSQD_VERSION, __version__

        print(f"nsqd v{NSQD_VERSION} (nsqtw {__version__})")
        raise SystemExit(0)
    set_level(config.nsqd.log_level)
    return cast(IService, NSQDService(config.nsqd))
