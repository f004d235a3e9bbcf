"""Throw-away certificates for one local cluster, made with `cryptography`.

One CA signs the API server's serving certificate and the cluster-admin client certificate
(group system:masters); a separate RSA key signs service account tokens.  A second CA signs
only the client certificate the API server shows admission webhooks (its
AdmissionConfiguration's kubeConfigFile), so a webhook trusting that CA trusts the API
server and no other client of the cluster. EC P-256 keys keep
generation in the milliseconds, so every start gets fresh ones.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=2)
SERVING_DNS_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
ADMIN_USER = "tessera-admin"
WEBHOOK_CLIENT_NAME = "kube-apiserver-webhook-client"


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files written for a cluster."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    service_account_key: Path
    service_account_pub: Path
    webhook_client_ca: Path
    webhook_client_cert: Path
    webhook_client_key: Path


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
             ) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
    )


def _leaf(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_name: x509.Name,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    san: x509.SubjectAlternativeName | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        _builder(subject, ca_name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if san is not None:
        builder = builder.add_extension(san, critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def _ca(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, x509.Name]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    cert = (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return cert, key, name


def write_pki(directory: Path, serving_ips: Sequence[str] = ("127.0.0.1", "10.0.0.1")) -> Pki:
    """Create CAs, serving, admin, webhook-client and service-account material under
    `directory` (0700); the API server's certificate names `serving_ips` (where it listens,
    the Service IP)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca_cert, ca_key, ca_name = _ca("tessera-local-ca")
    hook_ca_cert, hook_ca_key, hook_ca_name = _ca("tessera-local-webhook-client-ca")
    hook_cert, hook_key = _leaf(hook_ca_key, hook_ca_name, _name(WEBHOOK_CLIENT_NAME),
                                ExtendedKeyUsageOID.CLIENT_AUTH)
    san = x509.SubjectAlternativeName(
        [x509.DNSName(name) for name in SERVING_DNS_NAMES]
        + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in serving_ips]
    )
    serving_cert, serving_key = _leaf(
        ca_key, ca_name, _name("kube-apiserver"), ExtendedKeyUsageOID.SERVER_AUTH, san
    )
    admin_cert, admin_key = _leaf(
        ca_key, ca_name, _name(ADMIN_USER, "system:masters"), ExtendedKeyUsageOID.CLIENT_AUTH
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    pki = Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        service_account_key=directory / "sa.key",
        service_account_pub=directory / "sa.pub",
        webhook_client_ca=directory / "webhook-client-ca.crt",
        webhook_client_cert=directory / "webhook-client.crt",
        webhook_client_key=directory / "webhook-client.key",
    )
    pem = serialization.Encoding.PEM
    pki.ca_cert.write_bytes(ca_cert.public_bytes(pem))
    pki.ca_key.write_bytes(_key_pem(ca_key))
    pki.serving_cert.write_bytes(serving_cert.public_bytes(pem))
    pki.serving_key.write_bytes(_key_pem(serving_key))
    pki.admin_cert.write_bytes(admin_cert.public_bytes(pem))
    pki.admin_key.write_bytes(_key_pem(admin_key))
    pki.webhook_client_ca.write_bytes(hook_ca_cert.public_bytes(pem))
    pki.webhook_client_cert.write_bytes(hook_cert.public_bytes(pem))
    pki.webhook_client_key.write_bytes(_key_pem(hook_key))
    pki.service_account_key.write_bytes(_key_pem(sa_key))
    pki.service_account_pub.write_bytes(
        sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    for path in directory.iterdir():
        if path.suffix == ".key":
            path.chmod(0o600)
    return pki


def issue(
    pki: Pki,
    stem: Path,
    common_name: str,
    organization: str | None = None,
    *,
    server_ips: Sequence[str] = (),
) -> tuple[Path, Path]:
    """A certificate signed by the cluster's CA, written to `<stem>.crt` and `<stem>.key`:
    a client certificate, or with `server_ips` a serving certificate for those addresses.
    Kubernetes reads the user from CN and the groups from O (e.g. system:node:<name>,
    system:nodes)."""
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_name = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes()).subject
    san = None
    usage = ExtendedKeyUsageOID.CLIENT_AUTH
    if server_ips:
        usage = ExtendedKeyUsageOID.SERVER_AUTH
        san = x509.SubjectAlternativeName(
            [x509.DNSName(common_name)]
            + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
        )
    cert, key = _leaf(ca_key, ca_name, _name(common_name, organization), usage, san)
    cert_path, key_path = stem.with_suffix(".crt"), stem.with_suffix(".key")
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(_key_pem(key))
    key_path.chmod(0o600)
    return cert_path, key_path
