"""A test certificate authority and a server certificate it signs, for 127.0.0.1.

The ticket desk serves https with the leaf (``python -m ticketdesk --tls-cert
--tls-key``); a client trusts the CA file, the portal through ``SSL_CERT_FILE``
(``httpx.create_ssl_context`` reads it). Each call makes a new CA, so a second call
is "another CA" whose leaf a client of the first must refuse.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path
from typing import NamedTuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The names the leaf is valid for: how tests and the portal reach a desk.
SERVER_IP = "127.0.0.1"
SERVER_DNS = "localhost"
_VALID_FOR = dt.timedelta(days=2)


class CertFiles(NamedTuple):
    """PEM files: the CA's certificate, the server's certificate and its key."""

    ca: Path
    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_certificates(directory: Path, *, label: str = "test") -> CertFiles:
    """A new CA and a leaf it signs for IP ``127.0.0.1`` and DNS ``localhost``,
    written to ``directory`` as ``<label>-ca.pem``, ``<label>-cert.pem`` and
    ``<label>-key.pem`` (the key unencrypted).

    Both certificates carry what OpenSSL's strict verification asks for (basic
    constraints, key usage, subject and authority key identifiers), valid from an
    hour ago for two days.
    """
    now = dt.datetime.now(dt.UTC)
    not_before, not_after = now - dt.timedelta(hours=1), now + _VALID_FOR
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"ticketdesk {label} CA")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(SERVER_IP))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.IPAddress(ipaddress.ip_address(SERVER_IP)),
                    x509.DNSName(SERVER_DNS),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    made = CertFiles(
        ca=directory / f"{label}-ca.pem",
        cert=directory / f"{label}-cert.pem",
        key=directory / f"{label}-key.pem",
    )
    made.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    made.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    made.key.write_bytes(
        key.private_bytes(
            encoding=serialization.Encoding.PEM,
            format=serialization.PrivateFormat.PKCS8,
            encryption_algorithm=serialization.NoEncryption(),
        )
    )
    made.key.chmod(0o600)
    return made
