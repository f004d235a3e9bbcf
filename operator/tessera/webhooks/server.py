"""HTTPS server for the admission webhooks (/healthz and /metrics: :mod:`tessera.kube.serve`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from tessera.kube.serve import start
from tessera.reservations.forwarding import (
    RESERVE_PATH,
    authorized,
    usage_from_wire,
    violation_to_wire,
)
from tessera.webhooks.admission import Admission
from tessera.webhooks.config import PARTITION_PATH, POD_PATH, QUOTA_PATH

log = logging.getLogger("tessera.webhooks")

Review = Callable[[Mapping[str, Any]], Awaitable[dict[str, Any]]]


def _endpoint(review: Review, what: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
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


def _reservations(adm: Admission, token: str
                  ) -> Callable[[web.Request], Awaitable[web.Response]]:
    """Reservations handed over by the other replicas (see tessera.reservations.forwarding)."""
    async def handle(request: web.Request) -> web.Response:
        if not authorized(request.headers.get("Authorization"), token):
            return web.Response(status=403, text="not a tessera replica")
        try:
            body = await request.json()
            ns = body["namespace"]
            usage = usage_from_wire(body["usage"])
            if not isinstance(ns, str) or not ns:
                raise ValueError("namespace must be a name")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return web.Response(status=400, text=f"bad reservation: {exc}")
        refused = await adm.store.reserve_in(ns, usage)
        return web.json_response({"refused": [violation_to_wire(v) for v in refused]})
    return handle


def webhook_app(adm: Admission, token: str | None = None) -> web.Application:
    """The admission endpoints, and the reservation endpoint when a replica token is set."""
    app = web.Application()
    if token is not None:
        app.router.add_post(RESERVE_PATH, _reservations(adm, token))
    app.router.add_post(POD_PATH, _endpoint(adm.review_pod, "pod"))
    app.router.add_post(PARTITION_PATH, _endpoint(adm.review_partition, "gpupartition"))
    app.router.add_post(QUOTA_PATH, _endpoint(adm.review_quota, "gpuquota"))
    return app


__all__ = ["start", "webhook_app"]
