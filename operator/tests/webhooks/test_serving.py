"""The serving Secret's certificates as a replica holds them (no cluster): parsing, the
rotation state read from real certificates, a renewed certificate served from the next
handshake on."""

from __future__ import annotations

import asyncio
import base64
import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from tessera.api.names import ANNOTATION_CERT_STEP_AT
from tessera_operator.webhooks import server
from tessera_operator.webhooks.certs import fingerprint, load_bundle, make_serving_cert
from tessera_operator.webhooks.serving import SecretCerts, Serving, parse_secret, state_of


class _NoAdmission:
    async def review(self, req: Any) -> dict[str, Any]:
        return {"uid": req.get("uid"), "allowed": True}

    mutate_pod = review_partition = review_quota = mutate_claim = validate_claim = review


def _secret(data: dict[str, bytes], step_at: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "tls", "namespace": "ns", "resourceVersion": "7"}
    if step_at is not None:
        meta["annotations"] = {ANNOTATION_CERT_STEP_AT: step_at}
    return {"metadata": meta, "data": {k: base64.b64encode(v).decode()
                                       for k, v in data.items()}}


def test_a_secret_without_its_certificate_is_refused_by_name() -> None:
    made = make_serving_cert(["127.0.0.1"])
    with pytest.raises(ValueError, match=r"ns/tls lacks tls\.key"):
        parse_secret(_secret({"ca.crt": made.ca_pem, "tls.crt": made.cert_pem}))


def test_the_rotation_state_names_cas_by_the_signature_that_binds_them() -> None:
    old, new = make_serving_cert(["a"]), make_serving_cert(["a"])
    sc = parse_secret(_secret({"ca.crt": old.ca_pem + new.ca_pem, "tls.crt": old.cert_pem,
                               "tls.key": old.key_pem, "next.crt": new.cert_pem,
                               "next.key": new.key_pem}, step_at="100.5"))
    old_ca, new_ca = (fingerprint(load_bundle(m.ca_pem)[0]) for m in (old, new))
    state = state_of(sc, frozenset({old_ca}))
    assert (state.served_ca, state.next_ca, state.bundle) == (old_ca, new_ca, (old_ca, new_ca))
    assert state.step_at == 100.5 and sc.resource_version == "7"
    served = x509.load_pem_x509_certificate(old.cert_pem)
    assert state.not_after == served.not_valid_after_utc.timestamp()
    # a certificate whose CA is not in the bundle: no CA of the bundle signed it
    stray = parse_secret(_secret({"ca.crt": new.ca_pem, "tls.crt": old.cert_pem,
                                  "tls.key": old.key_pem}))
    assert state_of(stray, frozenset()).served_ca is None


def test_each_certificate_has_its_own_ca_and_a_lifetime_in_seconds() -> None:
    a, b = make_serving_cert(["x"], lifetime_s=60), make_serving_cert(["x"], lifetime_s=60)
    ca_a, ca_b = load_bundle(a.ca_pem)[0], load_bundle(b.ca_pem)[0]
    assert ca_a.subject != ca_b.subject
    cert = x509.load_pem_x509_certificate(a.cert_pem)
    span = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert 60 <= span.total_seconds() <= 66  # backdated a tenth of a short lifetime
    with pytest.raises(ValueError, match="positive"):
        make_serving_cert(["x"], lifetime_s=0)


async def _served_serial(port: int, cafile: bytes) -> int:
    tls = ssl.create_default_context(cadata=cafile.decode())
    tls.check_hostname = False
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return x509.load_der_x509_certificate(der).serial_number


def test_a_renewed_certificate_is_served_from_the_next_handshake(tmp_path: Path) -> None:
    old, new = make_serving_cert(["127.0.0.1"]), make_serving_cert(["127.0.0.1"])
    bundle = old.ca_pem + new.ca_pem

    async def run() -> list[int]:
        serving = Serving(SecretCerts(old), tmp_path, None)
        app = server.webhook_app(_NoAdmission())  # type: ignore[arg-type]
        runner = await server.start(app, "127.0.0.1", 0, serving.tls)
        port = runner.addresses[0][1]
        serials = [await _served_serial(port, bundle)]
        # a certificate that does not match its key is not served
        assert not serving.update(SecretCerts(type(old)(bundle, new.cert_pem, old.key_pem)))
        serials.append(await _served_serial(port, bundle))
        assert serving.update(SecretCerts(type(old)(bundle, new.cert_pem, new.key_pem)))
        serials.append(await _served_serial(port, bundle))
        assert not serving.update(SecretCerts(type(old)(bundle, new.cert_pem, new.key_pem)))
        await runner.cleanup()
        return serials

    first, refused, renewed = asyncio.run(run())
    want = [x509.load_pem_x509_certificate(c.cert_pem).serial_number for c in (old, new)]
    assert [first, refused, renewed] == [want[0], want[0], want[1]]
