"""The webhook serving certificate: made once with ``cryptography``, shared via a Secret.

Every replica serves the webhooks, and the API server trusts one CA bundle, so all replicas
must present certificates from the same CA.  The first replica to start creates the Secret;
the others lose the create race (409) and read what it wrote.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import logging
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tessera.kube.client import ApiError, Kube, path

log = logging.getLogger("tessera.certs")


@dataclass(frozen=True)
class ServingCert:
    ca_pem: bytes
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


def make_serving_cert(hosts: list[str], days: int = 3650) -> ServingCert:
    """A private CA and a serving certificate for ``hosts`` (DNS names or IP addresses)."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tessera-webhook-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
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
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return ServingCert(
        ca.public_bytes(pem), cert.public_bytes(pem),
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption()))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def ensure_secret(kube: Kube, namespace: str, name: str, hosts: list[str]) -> ServingCert:
    """Read the shared certificate, creating it if no replica has yet."""
    url = path("", "v1", "secrets", namespace, name)
    for _ in range(5):
        try:
            data = (await kube.get(url)).get("data") or {}
            return ServingCert(*(base64.b64decode(data[k]) for k in ("ca.crt", "tls.crt",
                                                                     "tls.key")))
        except ApiError as exc:
            if exc.status != 404:
                raise
        made = make_serving_cert(hosts)
        body = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {"app.kubernetes.io/name": "tessera"}},
                "data": {"ca.crt": _b64(made.ca_pem), "tls.crt": _b64(made.cert_pem),
                         "tls.key": _b64(made.key_pem)}}
        try:
            await kube.create(path("", "v1", "secrets", namespace), body)
            log.info("created webhook certificate secret", extra={"secret": name})
            return made
        except ApiError as exc:
            if exc.status != 409:
                raise
    raise RuntimeError(f"could not read or create secret {namespace}/{name}")
