"""A link's proof that its peer knows the cluster's replica secret (``--replica-secret-file``).

Without a secret a link trusts whoever reaches the HTTP port, as nsqd's
HTTP API does: anyone who can publish can also hold copies, or send a
``TAKEN`` notice that makes an owner leave messages out. With one, each
side of a link shows the other that it knows the secret before either
hands its link's records to anything:

- each side draws a fresh nonce for the connection and sends it in the
  upgrade's head (:data:`NONCE_HEADER`: the owner's in its request, the
  replica's in its ``101``), so both know both before any record;
- each side's first record is a ``PROOF``: HMAC-SHA256 under the secret of
  its role, the peer's nonce and its own (:func:`proof`). A proof made for
  one connection or one direction proves nothing on another, so a proof
  overheard, replayed or reflected is refused;
- a side with a secret takes nothing from a peer whose first record is not
  a ``PROOF`` that checks, and says nothing but its own ``PROOF`` until
  then: no ``HELLO``, no message leaves for a node that cannot show it.

It authenticates the link's peers, not its records: the records that
follow are not signed or encrypted, so the secret keeps out whoever can
only reach the port, not a machine in the middle of the connection (keep
the nodes on a network of their own for that, as for nsqd's HTTP API).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Final

__all__ = ["ACCEPT", "CONNECT", "NONCE_HEADER", "SecretError", "new_nonce", "nonce_of", "proof", "read_secret",
           "valid"]

#: the upgrade's head line that carries a side's nonce (``Nsqtw-Nonce: <32 hex digits>``)
NONCE_HEADER: Final = b"Nsqtw-Nonce"
#: the roles a proof is made for: the side that connected (an owner, or a replica with notes) and the
#: side whose HTTP port answered
CONNECT: Final = b"connect"
ACCEPT: Final = b"accept"
_NONCE_BYTES: Final = 16
#: the longest secret file read (a secret is a line, not a document)
MAX_SECRET: Final = 4096


class SecretError(ValueError):
    """The secret file cannot be used; the message says why, for the start-up error."""


def read_secret(path: str) -> bytes:
    """The secret in ``path``: its bytes less surrounding whitespace (a trailing newline is not part
    of it). SecretError for a file that cannot be read, is empty or is over :data:`MAX_SECRET`."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SECRET + 1)
    except OSError as e:
        raise SecretError(f"--replica-secret-file {path!r} cannot be read: {e.strerror}") from None
    if len(data) > MAX_SECRET:
        raise SecretError(f"--replica-secret-file {path!r} is over {MAX_SECRET} bytes")
    secret = data.strip()
    if not secret:
        raise SecretError(f"--replica-secret-file {path!r} is empty")
    return secret


def new_nonce() -> bytes:
    """A fresh nonce for one connection, as it goes in the head: 32 lowercase hex digits."""
    return os.urandom(_NONCE_BYTES).hex().encode()


def nonce_of(head: bytes) -> bytes:
    """The nonce an upgrade's head carries (b"" when it has none, or one of the wrong shape)."""
    name = NONCE_HEADER.lower() + b":"
    for line in head.split(b"\r\n")[1:]:
        if line.lower().startswith(name):
            value = line[len(name):].strip().lower()
            if len(value) == 2 * _NONCE_BYTES and all(c in b"0123456789abcdef" for c in value):
                return value
            return b""
    return b""


def proof(secret: bytes, role: bytes, their_nonce: bytes, own_nonce: bytes) -> bytes:
    """What the side in ``role`` sends as its ``PROOF`` on the connection of these nonces."""
    return hmac.new(secret, b"nsqtw-replication/1\n%s\n%s\n%s" % (role, their_nonce, own_nonce),
                    hashlib.sha256).digest()


def valid(secret: bytes, payload: bytes, role: bytes, own_nonce: bytes, their_nonce: bytes) -> bool:
    """Whether ``payload`` is the ``PROOF`` a peer in ``role`` owes this side (in constant time)."""
    if not own_nonce or not their_nonce:
        return False
    return hmac.compare_digest(payload, proof(secret, role, own_nonce, their_nonce))
