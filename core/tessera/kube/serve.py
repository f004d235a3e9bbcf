"""Plain HTTP for /healthz, /readyz and /metrics, shared by the operator and the node daemon."""

from __future__ import annotations

import ssl
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tessera.kube.health import Health


def health_app(health: Health, not_ready: Callable[[], list[str]] = lambda: []
               ) -> web.Application:
    """/healthz (liveness): every watch and task is working, else 503 and the reasons.
    /readyz: healthy and ``not_ready()`` empty (e.g. the quota cache has listed every
    GPUQuota; the node daemon's watches synced and NVML reachable), else 503 and why.
    /metrics: Prometheus."""
    async def healthz(_: web.Request) -> web.Response:
        problems = health.problems()
        return web.Response(status=503 if problems else 200,
                            text="\n".join(problems) if problems else "ok")

    async def readyz(_: web.Request) -> web.Response:
        problems = health.problems() + not_ready()
        return web.Response(status=503 if problems else 200,
                            text="\n".join(problems) if problems else "ok")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def start(app: web.Application, host: str, port: int,
                ssl_context: ssl.SSLContext | None = None) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=ssl_context, backlog=512).start()
    return runner
