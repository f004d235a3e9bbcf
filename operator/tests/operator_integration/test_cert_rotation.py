"""The webhook serving certificate renewed under load, and read only when cert-manager
writes it: two replicas against the real API server, pod creates (server-side dry runs,
through the pod webhook) all the while."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from tessera.api.names import ANNOTATION_CERT_STEP_AT
from tessera_e2e.operator.admission_probe import DryRunCreates
from tessera_operator.webhooks import config as webhook_config
from tessera_operator.webhooks.certs import make_serving_cert
from tessera_operator.webhooks.config import ClientConfig

from .conftest import Operators
from .harness import OPERATOR_NS, kubectl_json, wait_until
from .test_quota_admission import pod, quota, setup_ns

pytestmark = pytest.mark.integration
SECRET = "tessera-webhook-tls"
# 45 s certificates renewed at 2/3 (30 s, less the 4.5 s backdating): publish, switch 4 s
# later, drop the old CA 4 s after that; every replica re-reads the Secret every 0.5 s.
SHORT = ["--cert-lifetime", "45", "--cert-step", "4", "--cert-check-interval", "0.5"]


def _secret(cluster: Any) -> dict[str, bytes]:
    data = kubectl_json(cluster, "get", "secret", SECRET, "-n", OPERATOR_NS)["data"]
    return {k: base64.b64decode(v) for k, v in data.items()}


def _served(port: int) -> x509.Certificate:
    """The certificate a replica presents in a new handshake."""
    tls = ssl.create_default_context()
    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            tls.wrap_socket(raw) as s:
        der = s.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def _ca_bundles(cluster: Any) -> set[bytes]:
    out = set()
    for kind, name in (("mutatingwebhookconfiguration", webhook_config.MUTATING_NAME),
                       ("validatingwebhookconfiguration", webhook_config.VALIDATING_NAME)):
        for hook in kubectl_json(cluster, "get", kind, name)["webhooks"]:
            out.add(base64.b64decode(hook["clientConfig"]["caBundle"]))
    return out


@pytest.fixture
def own_replicas(cluster: Any, ops: Operators) -> Iterator[Operators]:
    """The session's replicas stopped for the test; afterwards a fresh Secret and the
    session's replicas again."""
    ops.stop_all()
    cluster.kubectl("delete", "secret", SECRET, "-n", OPERATOR_NS, "--ignore-not-found")
    yield ops
    ops.stop_all()
    cluster.kubectl("delete", "secret", SECRET, "-n", OPERATOR_NS, "--ignore-not-found")
    for name in ops.names:
        ops.start(name)
    ops.ensure_running()


def test_creates_keep_succeeding_while_the_certificate_is_renewed(
        cluster: Any, namespace: str, own_replicas: Operators) -> None:
    ops = own_replicas
    for name in ops.names:
        ops.start(name, extra=SHORT)
    ops.ensure_running()
    first = x509.load_pem_x509_certificate(_secret(cluster)["tls.crt"])
    wait_until("the configurations trust the first CA", lambda: _ca_bundles(cluster) == {
        _secret(cluster)["ca.crt"]}, 30)
    setup_ns(cluster, namespace, quota(namespace, hard={"cores": 100000,
                                                        "memory": "100000Gi"}))
    expires = first.not_valid_after_utc.timestamp()
    steps: set[str] = set()

    def renewed_and_first_expired() -> bool:
        data = _secret(cluster)
        steps.add(("next.crt" in data and "publish") or
                  (data["ca.crt"].count(b"BEGIN CERTIFICATE") > 1 and "switch") or "stable")
        cert = x509.load_pem_x509_certificate(data["tls.crt"])
        return (cert.serial_number != first.serial_number and "next.crt" not in data
                and data["ca.crt"].count(b"BEGIN CERTIFICATE") == 1
                and time.time() > expires + 2)

    with DryRunCreates(cluster.kubectl, lambda i: pod(namespace, f"p{i}", {
            "tessera.dev/vgpu-memory": "1024", "tessera.dev/vgpu-cores": "10"})) as creates:
        wait_until("a renewal, and the first certificate expired", renewed_and_first_expired,
                   timeout=expires - time.time() + 60, interval=0.3)
        ok_at_expiry = creates.ok
        wait_until("creates after the renewal", lambda: creates.ok >= ok_at_expiry + 5, 30)
    assert creates.failed == [], creates.failed
    assert creates.ok >= 30, creates.ok
    assert steps >= {"publish", "switch", "stable"}, steps  # each step was seen
    now = _secret(cluster)
    assert ANNOTATION_CERT_STEP_AT in kubectl_json(
        cluster, "get", "secret", SECRET, "-n", OPERATOR_NS)["metadata"]["annotations"]
    # every replica serves the renewed certificate; the API server trusts only its CA
    want = x509.load_pem_x509_certificate(now["tls.crt"])
    for rep in ops.replicas.values():
        assert _served(rep.webhook_port).serial_number == want.serial_number, rep.name
    assert _ca_bundles(cluster) == {now["ca.crt"]}


def test_an_external_certificate_is_only_read_and_followed(
        cluster: Any, namespace: str, own_replicas: Operators, tmp_path: Path) -> None:
    """cert-manager's part played by the test: it writes the Secret and the caBundle (its CA
    injector's job); the operator writes neither, and serves a renewed Secret."""
    ops = own_replicas
    first = make_serving_cert(["127.0.0.1"])
    files = first.write(tmp_path / "first")
    out = cluster.kubectl("create", "secret", "generic", SECRET, "-n", OPERATOR_NS,
                          "--type=kubernetes.io/tls", *(f"--from-file={f.name}={f}"
                                                        for f in files))
    assert out.returncode == 0, out.stderr

    def inject(ca: bytes) -> None:  # what cert-manager's CA injector does
        cc = ClientConfig(ca, url=f"https://127.0.0.1:{ops.proxy.port}")
        for body in (webhook_config.mutating(cc), webhook_config.validating(cc)):
            res = cluster.kubectl("apply", "--server-side", "--force-conflicts",
                                  "--field-manager=cainjector", "-f", "-",
                                  input=json.dumps(body))
            assert res.returncode == 0, res.stderr

    inject(first.ca_pem)
    flags = ["--webhook-certificate", "external", "--webhook-configurations", "ca-bundle",
             "--cert-check-interval", "0.5"]
    for name in ops.names:
        ops.start(name, extra=flags)
    ops.leader()
    setup_ns(cluster, namespace, quota(namespace))
    made = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=pod(
        namespace, "a", {"tessera.dev/vgpu-memory": "1024"}))
    assert made.returncode == 0, made.stderr
    assert _secret(cluster) == {"ca.crt": first.ca_pem, "tls.crt": first.cert_pem,
                                "tls.key": first.key_pem}  # as the test wrote it
    first_serial = x509.load_pem_x509_certificate(first.cert_pem).serial_number
    for rep in ops.replicas.values():
        assert _served(rep.webhook_port).serial_number == first_serial

    renewed = make_serving_cert(["127.0.0.1"])
    inject(first.ca_pem + renewed.ca_pem)
    patch = {"data": {k: base64.b64encode(v).decode() for k, v in (
        ("ca.crt", first.ca_pem + renewed.ca_pem), ("tls.crt", renewed.cert_pem),
        ("tls.key", renewed.key_pem))}}
    out = cluster.kubectl("patch", "secret", SECRET, "-n", OPERATOR_NS, "--type=merge",
                          "-p", json.dumps(patch))
    assert out.returncode == 0, out.stderr
    rv = kubectl_json(cluster, "get", "secret", SECRET, "-n", OPERATOR_NS)["metadata"][
        "resourceVersion"]
    renewed_serial = x509.load_pem_x509_certificate(renewed.cert_pem).serial_number
    for rep in ops.replicas.values():
        wait_until(f"{rep.name} serves the renewed certificate",
                   lambda r=rep: _served(r.webhook_port).serial_number == renewed_serial, 15)
    made = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=pod(
        namespace, "b", {"tessera.dev/vgpu-memory": "1024"}))
    assert made.returncode == 0, made.stderr
    time.sleep(3)  # several check intervals and leader loops: nothing is written
    meta = kubectl_json(cluster, "get", "secret", SECRET, "-n", OPERATOR_NS)["metadata"]
    assert meta["resourceVersion"] == rv
    assert ANNOTATION_CERT_STEP_AT not in (meta.get("annotations") or {})
    assert _ca_bundles(cluster) == {first.ca_pem + renewed.ca_pem}
