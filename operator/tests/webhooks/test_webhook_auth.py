"""Who may send admission reviews: the API server's client certificate, checked in TLS."""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, TCPConnector

from tessera_e2e.controlplane.pki import WEBHOOK_CLIENT_NAME, write_pki
from tessera_operator.webhooks import server
from tessera_operator.webhooks.auth import Reviewers, common_names, reviewers, serving_context
from tessera_operator.webhooks.certs import make_serving_cert

APISERVER = {"subject": ((("organizationName", "k8s"),), (("commonName", "apiserver"),))}


def test_only_a_verified_certificate_with_an_accepted_name_may_review() -> None:
    assert common_names(APISERVER) == {"apiserver"}
    anyone = Reviewers()
    assert anyone.allows(APISERVER) and not anyone.allows(None) and not anyone.allows({})
    named = Reviewers(frozenset({"apiserver"}))
    assert named.allows(APISERVER)
    assert not named.allows({"subject": ((("commonName", "kubelet"),),)})
    assert reviewers(None, ["apiserver"]) is None  # no CA: reviews are not authenticated
    assert reviewers("ca.crt", []) == Reviewers()


class _Admission:
    """Answers every review; counts what it was asked."""

    def __init__(self) -> None:
        self.seen = 0

    async def review(self, req: Any) -> dict[str, Any]:
        self.seen += 1
        return {"uid": req["uid"], "allowed": True}

    mutate_pod = review_partition = review_quota = mutate_claim = validate_claim = review


@pytest.mark.parametrize("path", ["/mutate/pods", "/validate/gpupartitions", "/validate/gpuquotas",
                                  "/mutate/resourceclaims", "/validate/resourceclaims"])
def test_reviews_without_the_api_servers_certificate_are_refused_unread(
        tmp_path: Path, path: str) -> None:
    ca, crt, key = make_serving_cert(["127.0.0.1"]).write(tmp_path / "serving")
    pki = write_pki(tmp_path / "pki")  # the local control plane's: a webhook client CA
    client = (pki.webhook_client_cert, pki.webhook_client_key)
    other = (pki.admin_cert, pki.admin_key)  # a client certificate of another CA

    async def run() -> tuple[list[int], int]:
        adm = _Admission()
        app = server.webhook_app(adm,  # type: ignore[arg-type]
                                 Reviewers(frozenset({WEBHOOK_CLIENT_NAME})))
        runner = await server.start(app, "127.0.0.1", 0,
                                    serving_context(crt, key, str(pki.webhook_client_ca)))
        port = runner.addresses[0][1]
        body = json.dumps({"request": {"uid": "u"}})
        codes = []
        for cert in (None, other, client):
            tls = ssl.create_default_context(cafile=str(ca))
            if cert is not None:
                tls.load_cert_chain(*cert)
            try:
                async with ClientSession(connector=TCPConnector(ssl=tls)) as s, s.post(
                        f"https://127.0.0.1:{port}{path}", data=body) as r:
                    codes.append(r.status)
            except OSError:  # the handshake refused a certificate the CA did not sign
                codes.append(0)
        await runner.cleanup()
        return codes, adm.seen

    codes, seen = asyncio.run(run())
    assert codes == [403, 0, 200] and seen == 1
