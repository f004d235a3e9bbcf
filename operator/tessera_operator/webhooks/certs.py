"""The webhook serving certificate: made with ``cryptography``, and read back.

Every replica serves the webhooks, and the API server trusts one CA bundle, so all replicas
must present certificates from a CA in that bundle.  Each certificate the operator makes has
its own private CA (a unique name, key identifiers): during a renewal the bundle holds the old
and the new CA, and a TLS client picks the right one by name and key identifier.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_LIFETIME_S = 365 * 86400.0
"""A serving certificate's lifetime unless told otherwise (``--cert-lifetime``'s default)."""
MAX_BACKDATE_S = 300.0
"""Certificates start this much in the past (clock skew between the nodes), or a tenth of
their lifetime when that is shorter."""


@dataclass(frozen=True)
class ServingCert:
    ca_pem: bytes
    """The CA bundle clients trust: one CA, or two while a renewal is under way."""
    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: Path) -> tuple[Path, Path, Path]:
        """ca.crt, tls.crt, tls.key under ``directory`` (key readable by owner only)."""
        directory.mkdir(parents=True, exist_ok=True)
        ca, crt, key = directory / "ca.crt", directory / "tls.crt", directory / "tls.key"
        ca.write_bytes(self.ca_pem)
        crt.write_bytes(self.cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(self.key_pem)
        return ca, crt, key


def make_serving_cert(hosts: list[str], days: float | None = None,
                      lifetime_s: float = DEFAULT_LIFETIME_S) -> ServingCert:
    """A new private CA and a serving certificate for ``hosts`` (DNS names or IP addresses),
    both valid ``lifetime_s`` seconds (``days``, when given, instead)."""
    if days is not None:
        lifetime_s = days * 86400.0
    if lifetime_s <= 0:
        raise ValueError(f"certificate lifetime must be positive, got {lifetime_s}")
    now = dt.datetime.now(dt.UTC)
    start = now - dt.timedelta(seconds=min(MAX_BACKDATE_S, lifetime_s / 10))
    end = now + dt.timedelta(seconds=lifetime_s)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_serial = x509.random_serial_number()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                            f"tessera-webhook-ca-{ca_serial:x}"[:64])])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(ca_serial)
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .add_extension(ca_ski, critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                ca_ski), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return ServingCert(
        ca.public_bytes(pem), cert.public_bytes(pem),
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption()))


def load_bundle(pem: bytes) -> list[x509.Certificate]:
    """The certificates of a PEM bundle, in order (ValueError if there is none)."""
    return x509.load_pem_x509_certificates(pem)


def fingerprint(cert: x509.Certificate) -> str:
    """SHA-256 of the certificate's DER: how a CA is named in the rotation state."""
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def issuer_in(cert: x509.Certificate, cas: list[x509.Certificate]) -> x509.Certificate | None:
    """The CA among ``cas`` that signed ``cert`` (signature checked), or None."""
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return ca
    return None


def validity(cert: x509.Certificate) -> tuple[float, float]:
    """(not before, not after) in seconds since the epoch."""
    return (cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp())


def pem_of(certs: list[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)
