"""HTTPS server for the admission webhooks (/healthz and /metrics: :mod:`tessera.kube.serve`).

With ``--admission-loop=thread`` the operator runs it on an event loop of its own, in a
thread of its own (:class:`tessera.kube.loops.LoopThread`), so that a review never waits
behind the leader's watches, status writes and kopf on the main loop.  A pod review reads
only the quota cache and is answered on the server's loop; the GPUPartition and GPUQuota
reviews use the API client, which belongs to the main loop, and are handed to it
(``main``).  By default it runs on the main loop.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from aiohttp import web

from tessera.kube.loops import Runner
from tessera.kube.serve import start
from tessera.webhooks.admission import Admission
from tessera.webhooks.auth import Reviewers
from tessera.webhooks.config import PARTITION_PATH, POD_PATH, QUOTA_PATH

log = logging.getLogger("tessera.webhooks")

Review = Callable[[Mapping[str, Any]], Coroutine[Any, Any, dict[str, Any]]]


def _endpoint(review: Review, what: str, senders: Reviewers | None, main: Runner | None
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
            resp = await (review(req) if main is None else main(review(req)))
        except Exception as exc:  # an answer is better than a timeout: say what broke
            log.exception("admission failed", extra={"webhook": what})
            resp = {"uid": req.get("uid"), "allowed": False,
                    "status": {"code": 500, "message": f"tessera {what} webhook: {exc}"}}
        out = {"apiVersion": body.get("apiVersion", "admission.k8s.io/v1"),
               "kind": "AdmissionReview", "response": resp}
        return web.Response(text=json.dumps(out), content_type="application/json")
    return handle


def webhook_app(adm: Admission, senders: Reviewers | None = None,
                main: Runner | None = None) -> web.Application:
    """The admission endpoints (only for ``senders`` when given: see
    :mod:`tessera.webhooks.auth`). With ``main``, the server runs on a loop of its own and
    the reviews that use the API client are run by ``main`` on the client's loop."""
    app = web.Application()
    for p, review, what, local in ((POD_PATH, adm.mutate_pod, "pod", True),
                                   (PARTITION_PATH, adm.review_partition, "gpupartition",
                                    False),
                                   (QUOTA_PATH, adm.review_quota, "gpuquota", False)):
        app.router.add_post(p, _endpoint(review, what, senders, None if local else main))
    return app


__all__ = ["start", "webhook_app"]
