"""twistd plugin glue for ``twistd nsqtw-lookupd``: options in, service out."""

from __future__ import annotations

from typing import cast

from twisted.application.service import IService

from nsqtw.log import start_daemon
from nsqtw.lookupd.options import LookupdTwistdOptions as Options
from nsqtw.lookupd.service import LookupdService

__all__ = ["Options", "makeService"]


def makeService(config: Options) -> IService:
    start_daemon("nsqlookupd", config.lookupd.version, config.lookupd.log_level, config.lookupd.log_prefix,
                 getattr(config, "parent", None))
    return cast(IService, LookupdService(config.lookupd))
