"""Heartbeats and the read deadline of a V2 connection, as nsqd keeps them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from twisted.internet.interfaces import IDelayedCall, IReactorTime, ITransport

from nsqtw.core.message import FRAME_TYPE_RESPONSE, frame
from nsqtw.log import Logger

_HEARTBEAT = frame(FRAME_TYPE_RESPONSE, b"_heartbeat_")


class Heartbeats:
    """A heartbeat every ``heartbeat_interval``, and a hang-up when no command has arrived
    for two of them (a mixin of :class:`~nsqtw.protocol.v2.V2Protocol`)."""

    log: Logger
    clock: IReactorTime
    transport: ITransport | None
    #: seconds between heartbeats (IDENTIFY may change it); 0 or less: none, and no deadline
    heartbeat_interval: float
    _heartbeat_call: IDelayedCall | None
    _read_deadline: IDelayedCall | None
    #: when the last command arrived (the read deadline counts from it)
    _command_at: float

    if TYPE_CHECKING:
        def _closed(self) -> bool: ...

        def _close(self) -> None: ...

    def _restart_heartbeat(self) -> None:
        if self._heartbeat_call is not None and self._heartbeat_call.active():
            self._heartbeat_call.cancel()
        self._heartbeat_call = None
        if self.heartbeat_interval > 0 and not self._closed():
            self._heartbeat_call = self.clock.callLater(self.heartbeat_interval, self._send_heartbeat)

    def _send_heartbeat(self) -> None:
        self._heartbeat_call = None
        if self._closed():
            return
        self.transport.write(_HEARTBEAT)  # type: ignore[union-attr]
        self._arm_read_deadline()
        self._restart_heartbeat()

    def _reset_read_deadline(self) -> None:
        """Start the read deadline afresh (new connection, new heartbeat interval)."""
        if self._read_deadline is not None and self._read_deadline.active():
            self._read_deadline.cancel()
        self._read_deadline = None
        self._restart_read_deadline()

    def _restart_read_deadline(self) -> None:
        """nsqd allows two heartbeat intervals for each command to arrive whole.

        This runs for every command, so it only notes the time: the one timer
        re-arms itself from that note when it fires, instead of a DelayedCall
        being cancelled and made per command.
        """
        self._command_at = self.clock.seconds()

    def _arm_read_deadline(self) -> None:
        """Make the read-deadline timer, when the first heartbeat goes out.

        The deadline is two heartbeat intervals after the last command; the
        heartbeat timer, started at the same moment (connect, IDENTIFY), fires
        one interval in, so making the deadline's timer then is soon enough,
        and fires at the same instant. Most connections that only connect,
        maybe SUB, and leave never make it (a DelayedCall made and cancelled
        was 4 µs of such a connection's cost). It is made before the next
        heartbeat's timer, as before, so a deadline falling on a heartbeat
        still fires first.
        """
        if self._read_deadline is None and self.heartbeat_interval > 0 and not self._closed():
            left = self._command_at + 2 * self.heartbeat_interval - self.clock.seconds()
            self._read_deadline = self.clock.callLater(max(left, 0), self._read_timeout)

    def _read_timeout(self) -> None:
        self._read_deadline = None
        left = self._command_at + 2 * self.heartbeat_interval - self.clock.seconds()
        if left > 0:
            self._read_deadline = self.clock.callLater(left, self._read_timeout)
            return
        self.log.error("ERROR: client({client}) - failed to read command - i/o timeout", client=self)
        self._close()
