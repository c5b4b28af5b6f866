"""nsqtw.log: nsqd's --log-level and --log-prefix in front of twistd's observer."""

from __future__ import annotations

from typing import Any

from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from nsqtw import log


class LogPrefixTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)
        self.addCleanup(log.set_prefix, "")
        self.addCleanup(log.set_level, "info")

    def test_prefix_before_every_line(self) -> None:
        """--log-prefix goes in front of the text; braces in it are text, not fields."""
        log.set_prefix("[nsqd {x}] ")
        log.Logger(namespace="t").info("TCP: listening on {address}", address="127.0.0.1:4150")
        self.assertEqual([formatEvent(e) for e in self.events], ["[nsqd {x}] TCP: listening on 127.0.0.1:4150"])

    def test_level_filters_before_the_observer(self) -> None:
        """--log-level warn drops info lines and keeps warnings."""
        log.set_level("warn")
        logger = log.Logger(namespace="t")
        logger.info("quiet")
        logger.warn("loud")
        self.assertEqual([formatEvent(e) for e in self.events], ["loud"])
