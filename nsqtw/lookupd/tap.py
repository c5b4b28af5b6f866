"""twistd plugin glue for ``twistd nsqtw-lookupd``: options in, service out."""

from __future__ import annotations

from typing import cast

from twisted.application.service import IService

from nsqtw.log import set_level, set_prefix
from nsqtw.lookupd.options import LookupdTwistdOptions as Options
from nsqtw.lookupd.service import LookupdService

__all__ = ["Options", "makeService"]


def makeService(config: Options) -> IService:
    if config.lookupd.version:
        from nsqtw import NSQD_VERSION, __version__

        print(f"nsqlookupd v{NSQD_VERSION} (nsqtw {__version__})")
        raise SystemExit(0)
    set_level(config.lookupd.log_level)
    set_prefix(config.lookupd.log_prefix)
    return cast(IService, LookupdService(config.lookupd))
