"""The throw-away certificates chain to one CA and carry what kube-apiserver checks."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tessera_e2e.controlplane.pki import WEBHOOK_CLIENT_NAME, write_pki


def test_certificates_chain_and_name_the_right_subjects(tmp_path: Path) -> None:
    pki = write_pki(tmp_path / "pki")
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    serving = x509.load_pem_x509_certificate(pki.serving_cert.read_bytes())
    admin = x509.load_pem_x509_certificate(pki.admin_cert.read_bytes())
    serving.verify_directly_issued_by(ca)
    admin.verify_directly_issued_by(ca)
    san = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in san.get_values_for_type(x509.IPAddress)
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    groups = admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    assert [g.value for g in groups] == ["system:masters"]
    assert all(oct(p.stat().st_mode)[-3:] == "600" for p in (tmp_path / "pki").glob("*.key"))
    # the webhook client certificate has a CA of its own: a webhook trusting that CA trusts
    # the API server and no other client of the cluster
    hook_ca = x509.load_pem_x509_certificate(pki.webhook_client_ca.read_bytes())
    client = x509.load_pem_x509_certificate(pki.webhook_client_cert.read_bytes())
    client.verify_directly_issued_by(hook_ca)
    assert admin.issuer != hook_ca.subject
    names = client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert [n.value for n in names] == [WEBHOOK_CLIENT_NAME]
    usage = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]

