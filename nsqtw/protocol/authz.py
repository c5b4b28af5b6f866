"""One V2 connection's AUTH: the secret it sent, the auth server's answer, and nsqd's checks.

The protocol decides when to wait for the auth server (it stops reading
meanwhile); this object holds the state and makes nsqd's decisions:
``E_AUTH_DISABLED``, ``E_AUTH_FIRST``, ``E_UNAUTHORIZED``, expiry.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure

from nsqtw._go.json import go_json
from nsqtw.errors import NSQError, fatal
from nsqtw.interfaces import IAuthorizer
from nsqtw.log import Logger
from nsqtw.names import go_quote
from nsqtw.protocol.auth import AuthState

__all__ = ["ClientAuth"]


class ClientAuth:
    """AUTH state of one connection; ``authorizer`` is None when nsqd runs without auth."""

    log = Logger()

    def __init__(self, authorizer: IAuthorizer | None, clock: IReactorTime) -> None:
        self.authorizer = authorizer
        #: whether clients must AUTH (``auth_required`` in the IDENTIFY answer); a plain
        #: attribute, not a property: every publish asks
        self.required = authorizer is not None
        self.clock = clock
        self.secret = ""
        self.state: AuthState | None = None

    def has_authorizations(self) -> bool:
        return self.state is not None and bool(self.state.authorizations)

    def begin(self, secret: str) -> None:
        """An AUTH command: refused when already authorized or when auth is off."""
        if self.has_authorizations():
            raise fatal("E_INVALID", "AUTH already set")
        if self.authorizer is None:
            raise fatal("E_AUTH_DISABLED", "AUTH disabled")
        self.secret = secret

    def query(self, remote_ip: str, tls: bool, common_name: str) -> Deferred[AuthState]:
        """Ask the auth server about the secret."""
        assert self.authorizer is not None
        return self.authorizer.query(remote_ip, tls, self.secret, common_name)

    def failed(self, failure: Failure, client: object) -> NSQError:
        """The auth server could not answer: nsqd keeps the reason in its log, not on the wire."""
        self.log.warn("PROTOCOL(V2): [{client}] AUTH failed {error}",
                      client=client, error=failure.getErrorMessage())
        return fatal("E_AUTH_FAILED", "AUTH failed")

    def accepted(self, result: AuthState, client: object) -> bytes:
        """The auth server's answer to AUTH; returns the response body nsqd sends."""
        self.state = result
        if not result.authorizations:
            raise fatal("E_UNAUTHORIZED", "AUTH no authorizations found")
        self.log.info("PROTOCOL(V2): [{client}] AUTH identity {identity}", client=client,
                      identity=result.identity)
        return go_json({"identity": result.identity, "identity_url": result.identity_url,
                        "permission_count": len(result.authorizations)})

    def check(self, cmd: str, topic: str, channel: str) -> bool:
        """nsqd's CheckAuth for SUB and the publishes; raises E_AUTH_FIRST/E_UNAUTHORIZED.

        Returns False when the authorization has expired and must be asked for again.
        """
        state = self.state
        if state is None or not state.authorizations:
            raise fatal("E_AUTH_FIRST", f"AUTH required before {cmd}")
        if state.expired(self.clock.seconds()):
            return False
        if not state.is_allowed(topic, channel):
            raise fatal("E_UNAUTHORIZED",
                        f"AUTH failed for {cmd} on {go_quote(topic.encode('utf-8', 'surrogateescape'))} "
                        f"{go_quote(channel.encode('utf-8', 'surrogateescape'))}")
        return True

    def stats(self) -> dict[str, object]:
        """The client fields nsqd's /stats shows for AUTH."""
        return {
            "authed": self.has_authorizations(),
            "auth_identity": self.state.identity if self.state else "",
            "auth_identity_url": self.state.identity_url if self.state else "",
        }
