"""The webhook serving certificate's Secret: made and renewed by the leader, followed by
every replica.

``generate`` (the default): the first replica to start creates the Secret (the others lose
the create race, 409, and read it); the leader renews it in the steps of
:mod:`tessera_operator.webhooks.rotation`.  ``external``: someone else (cert-manager) writes the
Secret; the operator only reads it.  Either way every replica re-reads the Secret every check
interval and serves a changed certificate from the next TLS handshake on.

Secret keys: ``tls.crt``/``tls.key`` (served), ``ca.crt`` (the CA bundle the webhook
configurations carry), and during a renewal ``next.crt``/``next.key`` (the certificate
waiting to be served; its CA is already in ``ca.crt``).
"""

from __future__ import annotations

import base64
import logging
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509

from tessera.api.names import ANNOTATION_CERT_STEP_AT
from tessera.kube.client import ApiError, Kube, path
from tessera_operator.webhooks import rotation
from tessera_operator.webhooks.auth import serving_context
from tessera_operator.webhooks.certs import (
    ServingCert,
    fingerprint,
    issuer_in,
    load_bundle,
    make_serving_cert,
    pem_of,
    validity,
)
from tessera_operator.webhooks.config import MUTATING_NAME, VALIDATING_NAME

log = logging.getLogger("tessera.certs")

GENERATE = "generate"
EXTERNAL = "external"


@dataclass(frozen=True)
class SecretCerts:
    """What the Secret holds."""

    served: ServingCert
    next_cert_pem: bytes | None = None
    next_key_pem: bytes | None = None
    step_at: float | None = None
    resource_version: str = ""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def parse_secret(obj: Mapping[str, Any]) -> SecretCerts:
    """The Secret's certificates; ValueError naming what is missing or unreadable."""
    meta = obj.get("metadata") or {}
    data = obj.get("data") or {}
    missing = [k for k in ("ca.crt", "tls.crt", "tls.key") if not data.get(k)]
    if missing:
        raise ValueError(f"Secret {meta.get('namespace')}/{meta.get('name')} lacks "
                         f"{', '.join(missing)}")
    try:
        raw = {k: base64.b64decode(v) for k, v in data.items() if isinstance(v, str)}
    except ValueError as exc:
        raise ValueError(f"Secret {meta.get('name')}: data is not base64: {exc}") from exc
    step = (meta.get("annotations") or {}).get(ANNOTATION_CERT_STEP_AT)
    try:
        step_at = float(step) if step is not None else None
    except ValueError:
        step_at = None  # unreadable: as if no step was written (the steps only wait longer)
    return SecretCerts(ServingCert(raw["ca.crt"], raw["tls.crt"], raw["tls.key"]),
                       raw.get("next.crt"), raw.get("next.key"), step_at,
                       str(meta.get("resourceVersion", "")))


def state_of(sc: SecretCerts, trusted: frozenset[str]) -> rotation.State:
    """The rotation's view of the Secret (``trusted``: CAs the configurations trust)."""
    cas = load_bundle(sc.served.ca_pem)
    served = x509.load_pem_x509_certificate(sc.served.cert_pem)
    served_ca = issuer_in(served, cas)
    next_ca = next_validity = None
    if sc.next_cert_pem:
        waiting = x509.load_pem_x509_certificate(sc.next_cert_pem)
        ca = issuer_in(waiting, cas)
        if ca is not None:
            next_ca, next_validity = fingerprint(ca), validity(waiting)
    return rotation.State(
        served_ca=None if served_ca is None else fingerprint(served_ca),
        not_before=validity(served)[0], not_after=validity(served)[1],
        bundle=tuple(fingerprint(c) for c in cas), next_ca=next_ca,
        next_validity=next_validity, step_at=sc.step_at, trusted=trusted)


def _secret_url(namespace: str, name: str) -> str:
    return path("", "v1", "secrets", namespace, name)


async def read_secret(kube: Kube, namespace: str, name: str) -> SecretCerts | None:
    try:
        return parse_secret(await kube.get(_secret_url(namespace, name)))
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


async def ensure_secret(kube: Kube, namespace: str, name: str, hosts: list[str],
                        lifetime_s: float) -> SecretCerts:
    """Read the shared certificate, creating it if no replica has yet."""
    for _ in range(5):
        found = await read_secret(kube, namespace, name)
        if found is not None:
            return found
        made = make_serving_cert(hosts, lifetime_s=lifetime_s)
        body = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {"app.kubernetes.io/name": "tessera"}},
                "data": {"ca.crt": _b64(made.ca_pem), "tls.crt": _b64(made.cert_pem),
                         "tls.key": _b64(made.key_pem)}}
        try:
            await kube.create(path("", "v1", "secrets", namespace), body)
            log.info("created webhook certificate secret", extra={"secret": name})
        except ApiError as exc:
            if exc.status != 409:
                raise
    raise RuntimeError(f"could not read or create secret {namespace}/{name}")


async def trusted_cas(kube: Kube) -> frozenset[str]:
    """CAs (fingerprints) that every webhook of both configurations trusts; empty when a
    configuration is missing."""
    group = "admissionregistration.k8s.io"
    common: set[str] | None = None
    for plural, name in (("mutatingwebhookconfigurations", MUTATING_NAME),
                         ("validatingwebhookconfigurations", VALIDATING_NAME)):
        try:
            obj = await kube.get(path(group, "v1", plural, name=name))
        except ApiError as exc:
            if exc.status == 404:
                return frozenset()
            raise
        for hook in obj.get("webhooks") or []:
            try:
                pem = base64.b64decode((hook.get("clientConfig") or {}).get("caBundle", ""))
                cas = {fingerprint(c) for c in load_bundle(pem)}
            except ValueError:
                cas = set()
            common = cas if common is None else common & cas
    return frozenset(common or ())


async def step(kube: Kube, namespace: str, name: str, hosts: list[str],
               policy: rotation.Policy, now: float | None = None) -> rotation.Step:
    """Take the renewal step due now (leader only); KEEP also when another writer won."""
    now = time.time() if now is None else now
    sc = await read_secret(kube, namespace, name)
    if sc is None:
        await ensure_secret(kube, namespace, name, hosts, policy.lifetime_s)
        return rotation.Step.PUBLISH
    todo = rotation.plan(state_of(sc, await trusted_cas(kube)), now, policy)
    data: dict[str, str | None]
    if todo is rotation.Step.KEEP:
        return todo
    cas = load_bundle(sc.served.ca_pem)
    if todo is rotation.Step.PUBLISH:
        made = make_serving_cert(hosts, lifetime_s=policy.lifetime_s)
        waiting = (x509.load_pem_x509_certificate(sc.next_cert_pem)
                   if sc.next_cert_pem else None)
        stale = issuer_in(waiting, cas) if waiting is not None else None
        served_ca = issuer_in(x509.load_pem_x509_certificate(sc.served.cert_pem), cas)
        keep = [c for c in cas if c is not stale or c is served_ca]
        data = {"ca.crt": _b64(pem_of(keep) + made.ca_pem), "next.crt": _b64(made.cert_pem),
                "next.key": _b64(made.key_pem)}
    elif todo is rotation.Step.SWITCH:
        assert sc.next_cert_pem and sc.next_key_pem
        data = {"tls.crt": _b64(sc.next_cert_pem), "tls.key": _b64(sc.next_key_pem),
                "next.crt": None, "next.key": None}
    else:  # DROP
        served_ca = issuer_in(x509.load_pem_x509_certificate(sc.served.cert_pem), cas)
        assert served_ca is not None
        data = {"ca.crt": _b64(pem_of([served_ca]))}
    body = {"metadata": {"resourceVersion": sc.resource_version,
                         "annotations": {ANNOTATION_CERT_STEP_AT: f"{now:.3f}"}},
            "data": data}
    try:
        await kube.merge_patch(_secret_url(namespace, name), body)
    except ApiError as exc:
        if exc.status == 409:
            return rotation.Step.KEEP
        raise
    log.info("webhook certificate renewal step", extra={"step": todo.value, "secret": name})
    return todo


class Serving:
    """What this replica serves and trusts now: the TLS context (reloaded in place, so the
    next handshake uses a new certificate) and the CA bundle."""

    def __init__(self, sc: SecretCerts, directory: Path, client_ca: str | None) -> None:
        self.directory = directory
        self.current = sc.served
        _, crt, key = sc.served.write(directory)
        self.tls: ssl.SSLContext = serving_context(crt, key, client_ca)

    def update(self, sc: SecretCerts) -> bool:
        """Follow the Secret; True when what is served or trusted changed. A certificate
        that does not load (or does not match its key) is not served: the old one stays."""
        new = sc.served
        if new == self.current:
            return False
        if (new.cert_pem, new.key_pem) != (self.current.cert_pem, self.current.key_pem):
            _, crt, key = ServingCert(new.ca_pem, new.cert_pem, new.key_pem).write(
                self.directory / "next")
            try:
                ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(crt, key)
            except (ssl.SSLError, OSError) as exc:
                log.error("webhook certificate in the Secret does not load; serving the "
                          "previous one", extra={"error": str(exc)})
                return False
            self.tls.load_cert_chain(crt, key)
            log.info("serving a new webhook certificate")
        self.current = new
        return True
