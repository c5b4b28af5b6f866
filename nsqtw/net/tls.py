"""nsqd's TLS settings: the server context for tls_v1 upgrades and HTTPS, and the auth client's trust.

Built once at start from ``--tls-cert``, ``--tls-key``,
``--tls-client-auth-policy``, ``--tls-root-ca-file`` and
``--tls-min-version`` with nsqd's meaning (``nsqd.buildTLSConfig``): no
client certificate is asked for by default, ``require`` wants one but
checks nothing, ``require-verify`` checks it against the root CA file (or
the system's CAs when none is given).

pyOpenSSL (with cryptography) is imported here only when a context is built
or a TLS connection is inspected, never at import: a node without any TLS
option leaves it unloaded, and :func:`keep_openssl_out` (called by the
daemons' taps) then keeps Twisted's reactor from loading it too (``docs/performance.md``, Memory).  The HTTPS
listener's factory, which needs ``twisted.protocols.tls`` (and so OpenSSL)
to be defined, lives in :mod:`nsqtw.net.https`.
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING, Any

from twisted.internet.interfaces import IOpenSSLContextFactory
from zope.interface import implementer

if TYPE_CHECKING:
    from OpenSSL import SSL

__all__ = ["ServerTLS", "TLSConfigError", "build_server_tls", "client_trust_root",
           "connection_info", "keep_openssl_out", "looks_like_tls", "peer_common_name"]

#: the record types a TLS client may open with: handshake (ClientHello) or alert
_TLS_FIRST_BYTES = frozenset((0x15, 0x16))
#: ``SSL.TLS1_VERSION`` (the protocol's own number), without importing OpenSSL for a default
_TLS1_VERSION = 0x0301

#: OpenSSL's protocol names as nsqd's /stats prints them (``prettyConnectionState``)
_GO_VERSION_NAMES = {
    "SSLv3": "SSL30",
    "TLSv1": "TLS1.0",
    "TLSv1.1": "TLS1.1",
    "TLSv1.2": "TLS1.2",
    "TLSv1.3": "TLS1.3",
}
_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)


def keep_openssl_out(needed: bool) -> bool:
    """Make ``import OpenSSL`` fail in this process unless ``needed``; a daemon's tap calls it first.

    Twisted's reactor imports pyOpenSSL (and cryptography, ~12 MB of RSS)
    only to offer TLS, and treats a missing one as "TLS unavailable"; a
    daemon whose options can never use TLS does without it.  Done only
    before anything imported the reactor or OpenSSL (a process that already
    has them, such as a test run, is left as it is).  Returns whether
    OpenSSL was kept out.
    """
    if needed or "OpenSSL" in sys.modules or "twisted.internet.reactor" in sys.modules:
        return False
    sys.modules["OpenSSL"] = None  # type: ignore[assignment]
    return True


class TLSConfigError(Exception):
    """The certificate, key or CA file cannot be used (nsqd refuses to start)."""


def _accept_any(conn: Any, cert: Any, errnum: int, depth: int, ok: int) -> bool:
    return True  # "require": a certificate must be sent, any will do


def _verified(conn: Any, cert: Any, errnum: int, depth: int, ok: int) -> bool:
    return bool(ok)


@implementer(IOpenSSLContextFactory)
class ServerTLS:
    """One OpenSSL server context shared by every TLS connection (TCP upgrades and HTTPS)."""

    def __init__(self, cert: str, key: str, client_auth_policy: str = "",
                 root_ca_file: str = "", min_version: int = _TLS1_VERSION) -> None:
        from OpenSSL import SSL

        ctx = SSL.Context(SSL.TLS_METHOD)
        try:
            ctx.set_min_proto_version(min_version)
            ctx.use_certificate_chain_file(cert)
            ctx.use_privatekey_file(key)
            ctx.check_privatekey()
            if client_auth_policy:
                if root_ca_file:
                    ctx.load_verify_locations(root_ca_file)
                    ctx.load_client_ca(root_ca_file.encode())
                else:
                    ctx.set_default_verify_paths()
                callback = _verified if client_auth_policy == "require-verify" else _accept_any
                ctx.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, callback)
            elif root_ca_file:
                ctx.load_verify_locations(root_ca_file)  # still read, so a bad file is refused
        except (SSL.Error, OSError, ValueError) as e:
            raise TLSConfigError(_ssl_error_text(e)) from None
        ctx.set_options(SSL.OP_NO_COMPRESSION | SSL.OP_CIPHER_SERVER_PREFERENCE)
        ctx.set_session_id(b"nsqtw")
        self._ctx = ctx

    def getContext(self) -> SSL.Context:
        return self._ctx


def _ssl_error_text(e: Exception) -> str:
    from OpenSSL import SSL

    if isinstance(e, SSL.Error) and e.args and isinstance(e.args[0], list):
        parts = [str(item[-1]) for item in e.args[0] if item]
        if parts:
            return "; ".join(parts)
    return str(e) or type(e).__name__


def build_server_tls(options: Any) -> ServerTLS | None:
    """The server TLS context nsqd's options ask for; None without ``--tls-cert``/``--tls-key``."""
    if not options.tls_cert and not options.tls_key:
        return None
    return ServerTLS(options.tls_cert, options.tls_key, options.tls_client_auth_policy,
                     options.tls_root_ca_file, options.tls_min_version)


def client_trust_root(root_ca_file: str) -> Any:
    """The CAs the auth client trusts for https:// auth servers (nsqd's buildClientTLSConfig)."""
    if not root_ca_file:
        return None
    from OpenSSL import SSL
    from twisted.internet import ssl as twisted_ssl

    try:
        with open(root_ca_file, "rb") as f:
            pems = _PEM_CERT.findall(f.read())
        certs = [twisted_ssl.Certificate.loadPEM(p) for p in pems]
    except (OSError, SSL.Error, ValueError) as e:
        raise TLSConfigError(_ssl_error_text(e)) from None
    if not certs:
        raise TLSConfigError("failed to append certificate to pool")
    return twisted_ssl.trustRootFromCertificates(certs)


def connection_info(conn: SSL.Connection) -> dict[str, Any]:
    """The TLS fields of nsqd's client stats for one established connection.

    The cipher is OpenSSL's name for it, which for TLS 1.3 is the same as
    Go's (``TLS_AES_128_GCM_SHA256``); for older versions OpenSSL names
    differ from Go's (``ECDHE-RSA-AES128-GCM-SHA256``).
    """
    version = conn.get_protocol_version_name() or ""
    alpn = conn.get_alpn_proto_negotiated() or b""
    return {
        "tls_cipher_suite": conn.get_cipher_name() or "",
        "tls_version": _GO_VERSION_NAMES.get(version, f"Unknown {version}"),
        "tls_negotiated_protocol": alpn.decode("ascii", "replace"),
        # Go (1.16 and later) always reports true here
        "tls_negotiated_protocol_is_mutual": True,
    }


def peer_common_name(conn: SSL.Connection) -> str:
    """The subject common name of the client's certificate, or "" (nsqd's ``common_name``)."""
    from cryptography.x509.oid import NameOID

    cert = conn.get_peer_certificate(as_cryptography=True)
    if cert is None:
        return ""
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    value = names[0].value if names else ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def looks_like_tls(first: bytes) -> bool:
    """Whether a connection's first byte can start a TLS record from a client."""
    return first[:1] != b"" and first[0] in _TLS_FIRST_BYTES
