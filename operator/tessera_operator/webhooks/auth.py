"""Who may send the webhooks admission reviews: the API server, proven by a client certificate.

A review writes nothing (the count is the API server's, in the ResourceQuota each GPUQuota
manages), but it answers with a namespace's quota policy and costs the operator CPU, so
reviews are taken from the API server only where that can be proven.  The API server
authenticates to webhooks when its AdmissionConfiguration gives the webhook plugins a
``kubeConfigFile`` with a client certificate (``docs/operator.md``, "Authenticating the API
server"); the operator is given the CA that signed it (``--webhook-client-ca``) and,
optionally, the certificate names to accept (``--webhook-client-name``).  Then the TLS
handshake verifies the certificate and every review without an accepted one is refused
before it is read.

Without a CA the webhooks accept every review (clusters whose API server cannot be
configured, e.g. managed ones): then only the NetworkPolicy keeps others away.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Reviewers:
    """Accepted senders: any certificate the CA verified, or only these common names."""

    names: frozenset[str] = frozenset()

    def allows(self, peercert: Any) -> bool:
        """``peercert`` as ``SSLSocket.getpeercert()`` gives it (empty: no certificate)."""
        if not peercert:
            return False
        if not self.names:
            return True
        return bool(self.names & common_names(peercert))


def common_names(peercert: Any) -> set[str]:
    out = set()
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                out.add(str(value))
    return out


def serving_context(cert: Path, key: Path, client_ca: str | None) -> ssl.SSLContext:
    """TLS for the webhook port; with a client CA, certificates it signed are verified.

    Client certificates stay optional in the handshake, so that a review without one gets a
    403 that says why (:class:`Reviewers`) rather than a failed handshake.
    """
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    if client_ca is not None:
        tls.load_verify_locations(cafile=client_ca)
        tls.verify_mode = ssl.CERT_OPTIONAL
    return tls


def reviewers(client_ca: str | None, names: Iterable[str]) -> Reviewers | None:
    """The accepted senders, or None when reviews are not authenticated (no CA given)."""
    return None if client_ca is None else Reviewers(frozenset(names))
