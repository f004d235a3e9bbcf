"""HTTPS server for the admission webhooks (/healthz and /metrics: :mod:`tessera.kube.serve`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from tessera.kube.serve import start
from tessera_operator.webhooks.admission import Admission
from tessera_operator.webhooks.auth import Reviewers
from tessera_operator.webhooks.config import (
    CLAIM_MUTATE_PATH,
    CLAIM_VALIDATE_PATH,
    PARTITION_PATH,
    POD_PATH,
    QUOTA_PATH,
)

log = logging.getLogger("tessera_operator.webhooks")

Review = Callable[[Mapping[str, Any]], Awaitable[dict[str, Any]]]

MAX_REVIEW_BYTES = 16 << 20
"""Largest admission review read (aiohttp's default, 1 MiB, refused a 1.2 MB pod with a bare
HTTP 413): the API server takes request bodies of up to 3 MiB and etcd stores objects of up
to 1.5 MiB, so every object it can store is reviewed, with room for its JSON escaping."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _endpoint(review: Review, what: str, senders: Reviewers | None
              ) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        if senders is not None:
            peer = request.transport.get_extra_info("peercert") if request.transport else None
            if not senders.allows(peer):
                return web.Response(status=403, text="admission reviews are taken only from "
                                                     "the API server's client certificate")
        try:
            body = await request.json()
            req = body["request"]
        except (ValueError, KeyError, TypeError):
            return web.Response(status=400, text="expected an AdmissionReview")
        try:
            resp = await review(req)
        except Exception as exc:  # an answer is better than a timeout: say what broke
            log.exception("admission failed", extra={"webhook": what})
            resp = {"uid": req.get("uid"), "allowed": False,
                    "status": {"code": 500, "message": f"tessera {what} webhook: {exc}"}}
        out = {"apiVersion": body.get("apiVersion", "admission.k8s.io/v1"),
               "kind": "AdmissionReview", "response": resp}
        return web.Response(text=json.dumps(out), content_type="application/json")
    return handle


def webhook_app(adm: Admission, senders: Reviewers | None = None,
                closing: Callable[[], bool] = lambda: False) -> web.Application:
    """The admission endpoints (only for ``senders`` when given: see
    :mod:`tessera_operator.webhooks.auth`).  While ``closing()`` (the replica drains before
    it stops: :mod:`tessera.kube.shutdown`), every answer closes its connection."""

    @web.middleware
    async def close_connections(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        if closing():
            response.force_close()
            log.info("stopping: this connection closes after its answer", extra={
                "peer": request.transport.get_extra_info("peername") if request.transport
                else None, "path": request.path})
        return response

    app = web.Application(middlewares=[close_connections], client_max_size=MAX_REVIEW_BYTES)
    for p, review, what in ((POD_PATH, adm.mutate_pod, "pod"),
                            (PARTITION_PATH, adm.review_partition, "gpupartition"),
                            (QUOTA_PATH, adm.review_quota, "gpuquota"),
                            (CLAIM_MUTATE_PATH, adm.mutate_claim, "resourceclaim"),
                            (CLAIM_VALIDATE_PATH, adm.validate_claim, "resourceclaim")):
        app.router.add_post(p, _endpoint(review, what, senders))
    return app


__all__ = ["start", "webhook_app"]
