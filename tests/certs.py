"""Certificates made by the tests: a CA, a server certificate for 127.0.0.1, client certificates."""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class CertFiles:
    """Paths of PEM files in one directory."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    #: a client certificate no CA here signed
    stranger_cert: str
    stranger_key: str


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(path: str, key: ec.EllipticCurvePrivateKey) -> None:
    with open(path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))


def _write_cert(path: str, cert: x509.Certificate) -> None:
    with open(path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))


def _issue(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
           issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool = False,
           server: bool = False) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(_name(subject)).issuer_name(issuer)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(hours=1))
               .not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=True,
                          crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
    elif server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    else:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_certs(directory: str) -> CertFiles:
    """A CA, a server certificate for localhost/127.0.0.1 and two client certificates."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _issue("nsqtw test CA", ca_key, _name("nsqtw test CA"), ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _issue("127.0.0.1", server_key, ca.subject, ca_key, server=True)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _issue("test-client", client_key, ca.subject, ca_key)
    stranger_key = ec.generate_private_key(ec.SECP256R1())
    stranger = _issue("stranger", stranger_key, _name("stranger"), stranger_key)
    files = CertFiles(*(os.path.join(directory, n) for n in (
        "ca.pem", "server.pem", "server.key", "client.pem", "client.key",
        "stranger.pem", "stranger.key")))
    _write_cert(files.ca, ca)
    _write_cert(files.server_cert, server)
    _write_key(files.server_key, server_key)
    _write_cert(files.client_cert, client)
    _write_key(files.client_key, client_key)
    _write_cert(files.stranger_cert, stranger)
    _write_key(files.stranger_key, stranger_key)
    return files
