"""kube-scheduler's extender wire (``k8s.io/kube-scheduler/extender/v1``), on the operator's
HTTPS port under ``/placement``.

JSON keys are the Go field names (the Go types have no json tags): ``Pod``, ``Nodes``,
``NodeNames``, ``FailedNodes``, ``FailedAndUnresolvableNodes``, ``Error``, ``PodName``, …
Every replica serves the paths; only the Lease holder decides (its reservations are what
keeps a burst from double-booking a unit), so another replica forwards the call, as it came,
to the URL the holder published on the Lease (``tessera.dev/placement-url``). With no leader
the call fails and the scheduler keeps the pod Pending (it retries): nothing is bound
without tessera's decision.
"""

from __future__ import annotations

import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tessera.api.names import ANNOTATION_PLACEMENT_URL, PLACEMENT_PATH_PREFIX
from tessera.kube.client import ApiError, Kube, path
from tessera_operator import metrics
from tessera_operator.placement.service import PlacementService

log = logging.getLogger("tessera.placement")



def filter_answer(args: Mapping[str, Any], svc: PlacementService) -> dict[str, Any]:
    pod = args.get("Pod") or {}
    nodes = args.get("Nodes")
    names = args.get("NodeNames")
    items = (nodes or {}).get("items") or [] if names is None else []
    if names is None:
        names = [str((n.get("metadata") or {}).get("name")) for n in items]
    got = svc.filter(pod, list(names))
    out: dict[str, Any] = {"FailedNodes": dict(got.failed),
                           "FailedAndUnresolvableNodes": dict(got.unresolvable),
                           "Error": ""}
    if args.get("NodeNames") is not None:
        out["NodeNames"] = list(got.nodes)
        out["Nodes"] = None
    else:
        keep = set(got.nodes)
        out["Nodes"] = {**(nodes or {}), "items": [
            n for n in items if (n.get("metadata") or {}).get("name") in keep]}
        out["NodeNames"] = None
    return out


async def bind_answer(args: Mapping[str, Any], svc: PlacementService) -> dict[str, Any]:
    err = await svc.bind(str(args.get("PodNamespace", "")), str(args.get("PodName", "")),
                         str(args.get("PodUID", "")), str(args.get("Node", "")))
    return {"Error": err}


def preempt_answer(args: Mapping[str, Any], svc: PlacementService) -> dict[str, Any]:
    proposed = list((args.get("NodeNameToMetaVictims") or args.get("NodeNameToVictims")
                     or {}).keys())
    chosen = svc.preempt(args.get("Pod") or {}, proposed)
    return {"NodeNameToMetaVictims": {
        node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": 0}
        for node, uids in chosen.items()}}


@dataclass
class LeaderLink:
    """Whether this replica answers, and where the one that does is."""

    kube: Kube
    lease_url: str
    is_leader: Callable[[], bool]
    ssl_context: Callable[[], ssl.SSLContext | None]
    """Trusts the serving certificate's CA (every replica serves the same certificate)."""
    server_hostname: str | None = None
    """The name the certificate holds (the Service's), when the URL is a pod IP."""
    ready: Callable[[], bool] = lambda: True
    """The leader's state is complete (its consistent relist after taking the Lease)."""
    _url: tuple[float, str | None] = (0.0, None)
    _session: aiohttp.ClientSession | None = field(default=None, repr=False)

    async def leader_url(self) -> str | None:
        at, url = self._url
        if time.monotonic() - at < 1.0:
            return url
        try:
            lease = await self.kube.get(self.lease_url)
        except (ApiError, OSError, TimeoutError):
            lease = {}
        holder = (lease.get("spec") or {}).get("holderIdentity")
        url = ((lease.get("metadata") or {}).get("annotations") or {}).get(
            ANNOTATION_PLACEMENT_URL) if holder else None
        self._url = (time.monotonic(), url)
        return url

    async def forward(self, verb: str, body: bytes) -> web.Response:
        url = await self.leader_url()
        if not url:
            metrics.PLACEMENT_FORWARDED.labels("no-leader").inc()
            return web.Response(status=503, text="no tessera operator holds the leader Lease: "
                                "pods stay Pending until one does")
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20))
        try:
            async with self._session.post(
                    f"{url}{PLACEMENT_PATH_PREFIX}/{verb}", data=body,
                    headers={"Content-Type": "application/json"},
                    ssl=self.ssl_context() or False,
                    server_hostname=self.server_hostname) as r:
                text = await r.read()
                metrics.PLACEMENT_FORWARDED.labels("ok" if r.status == 200 else "error").inc()
                return web.Response(status=r.status, body=text,
                                    content_type="application/json" if r.status == 200
                                    else "text/plain")
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            metrics.PLACEMENT_FORWARDED.labels("error").inc()
            self._url = (0.0, None)
            return web.Response(status=503, text=f"forwarding to the tessera leader at {url}: "
                                f"{exc}")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def add_routes(app: web.Application, svc: PlacementService, link: LeaderLink) -> None:
    """``POST /placement/<verb>`` for each verb."""

    def endpoint(verb: str, answer: Callable[[Mapping[str, Any]], Awaitable[Any]]
                 ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            body = await request.read()
            if not link.is_leader():
                return await link.forward(verb, body)
            if not link.ready():
                return web.Response(status=503, text="the tessera leader is still reading "
                                    "the pods' placements (it just took the Lease)")
            start = time.perf_counter()
            try:
                args = json.loads(body)
                if not isinstance(args, dict):
                    raise ValueError("the body must be a JSON object")
            except ValueError as exc:
                return web.Response(status=400, text=f"unreadable {verb} call: {exc}")
            try:
                out = await answer(args)
            except Exception as exc:  # one odd pod must not take the service down
                log.exception("placement verb failed", extra={"verb": verb})
                return web.Response(status=500, text=f"{verb}: {type(exc).__name__}: {exc}")
            finally:
                metrics.PLACEMENT_SECONDS.labels(verb).observe(time.perf_counter() - start)
            return web.json_response(out)
        return handle

    async def _filter(a: Mapping[str, Any]) -> Any:
        return filter_answer(a, svc)

    async def _bind(a: Mapping[str, Any]) -> Any:
        return await bind_answer(a, svc)

    async def _preempt(a: Mapping[str, Any]) -> Any:
        return preempt_answer(a, svc)

    for verb, fn in (("filter", _filter), ("bind", _bind), ("preempt", _preempt)):
        app.router.add_post(f"{PLACEMENT_PATH_PREFIX}/{verb}", endpoint(verb, fn))


def lease_path(namespace: str, name: str) -> str:
    return path("coordination.k8s.io", "v1", "leases", namespace, name)
