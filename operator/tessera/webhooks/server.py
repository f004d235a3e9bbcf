"""HTTPS server for the admission webhooks (/healthz and /metrics: :mod:`tessera.kube.serve`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from aiohttp import web

from tessera.kube.serve import start
from tessera.reservations.forwarding import (
    RESERVE_PATH,
    authorized,
    reservation_from_wire,
    violation_to_wire,
)
from tessera.webhooks.admission import Admission
from tessera.webhooks.auth import Reviewers
from tessera.webhooks.config import PARTITION_PATH, POD_PATH, POD_QUOTA_PATH, QUOTA_PATH

log = logging.getLogger("tessera.webhooks")

Review = Callable[[Mapping[str, Any]], Awaitable[dict[str, Any]]]
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


Tokens = Callable[[], Collection[str]]
"""The replica tokens accepted now (they change when the serving certificate is renewed)."""


def _reservations(adm: Admission, tokens: Tokens
                  ) -> Callable[[web.Request], Awaitable[web.Response]]:
    """Reservations handed over by the other replicas (see tessera.reservations.forwarding)."""
    async def handle(request: web.Request) -> web.Response:
        header = request.headers.get("Authorization")
        if not any(authorized(header, t) for t in tokens()):
            return web.Response(status=403, text="not a tessera replica")
        try:
            ns, reservation = reservation_from_wire(await request.json())
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return web.Response(status=400, text=f"bad reservation: {exc}")
        refused = await adm.store.reserve_in(ns, reservation)
        return web.json_response({"refused": [violation_to_wire(v) for v in refused]})
    return handle


def webhook_app(adm: Admission, tokens: Tokens | None = None,
                senders: Reviewers | None = None,
                closing: Callable[[], bool] = lambda: False) -> web.Application:
    """The admission endpoints (only for ``senders`` when given: see
    :mod:`tessera.webhooks.auth`), and the reservation endpoint when replica tokens are set.
    While ``closing()`` (the replica drains before it stops: :mod:`tessera.kube.shutdown`),
    every answer closes its connection."""

    @web.middleware
    async def close_connections(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        if closing():
            response.force_close()
            log.info("stopping: this connection closes after its answer", extra={
                "peer": request.transport.get_extra_info("peername") if request.transport
                else None, "path": request.path})
        return response

    app = web.Application(middlewares=[close_connections])
    if tokens is not None:
        app.router.add_post(RESERVE_PATH, _reservations(adm, tokens))
    for p, review, what in ((POD_PATH, adm.mutate_pod, "pod"),
                            (POD_QUOTA_PATH, adm.validate_pod, "pod quota"),
                            (PARTITION_PATH, adm.review_partition, "gpupartition"),
                            (QUOTA_PATH, adm.review_quota, "gpuquota")):
        app.router.add_post(p, _endpoint(review, what, senders))
    return app


__all__ = ["start", "webhook_app"]
