"""An admission webhook on loopback, for tests that need one next to tessera's.

``ReviewServer(decide, cert, key)`` answers each AdmissionReview with ``decide(request,
peercert)`` -> (allowed, message[, JSON patch]); ``configuration(...)`` registers it for one
namespace, as a validating or (with ``mutating=True``) a mutating webhook.
"""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

Decide = Callable[[dict[str, Any], Any], tuple[Any, ...]]
"""(allowed, message) or (allowed, message, JSON patch operations)."""


class ReviewServer:
    """HTTPS on 127.0.0.1 (a free port); with ``client_ca`` a client certificate it signed
    is required, and ``decide`` sees it (``SSLSocket.getpeercert()``)."""

    def __init__(self, decide: Decide, cert: Path, key: Path,
                 client_ca: Path | None = None) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                peer = self.connection.getpeercert()
                allowed, message, *patch = decide(review["request"], peer)
                response = {"uid": review["request"]["uid"], "allowed": allowed,
                            "status": {"code": 403, "message": message}}
                if patch and patch[0]:
                    response.update(patchType="JSONPatch", patch=base64.b64encode(
                        json.dumps(patch[0]).encode()).decode())
                body = json.dumps({"apiVersion": "admission.k8s.io/v1",
                                   "kind": "AdmissionReview", "response": response}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(cert, key)
        if client_ca is not None:
            tls.load_verify_locations(cafile=str(client_ca))
            tls.verify_mode = ssl.CERT_REQUIRED
        self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def configuration(self, name: str, ca_pem: bytes, resources: list[str], namespace: str,
                      object_selector: dict[str, Any] | None = None, timeout_s: int = 10,
                      mutating: bool = False) -> dict[str, Any]:
        """A Validating (or Mutating) WebhookConfiguration sending this server CREATEs of
        ``resources`` (core group) in ``namespace``; ``ca_pem`` signed the server's
        certificate.  Mutating webhooks run in the order of their configurations' names."""
        hook: dict[str, Any] = {
            "name": f"{name}.example.com",
            "clientConfig": {"url": f"https://127.0.0.1:{self.port}/",
                             "caBundle": base64.b64encode(ca_pem).decode()},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": resources}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "failurePolicy": "Fail", "sideEffects": "None", "timeoutSeconds": timeout_s,
            "admissionReviewVersions": ["v1"]}
        if object_selector is not None:
            hook["objectSelector"] = object_selector
        kind = "Mutating" if mutating else "Validating"
        return {"apiVersion": "admissionregistration.k8s.io/v1",
                "kind": f"{kind}WebhookConfiguration", "metadata": {"name": name},
                "webhooks": [hook]}

    def stop(self) -> None:
        self.server.shutdown()
