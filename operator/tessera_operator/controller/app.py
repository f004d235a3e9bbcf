"""The operator process: webhooks on every replica, reconciliation on the Lease holder.

Every replica serves the admission webhooks (from the certificate shared in a Secret,
:mod:`tessera_operator.webhooks.lifecycle`), so admission keeps working through a failover.
Every replica also watches the GPUQuotas and the ResourceQuotas they manage (the admission
caches).  Only the replica holding the Lease writes the webhook configurations, renews the
certificate, runs kopf's GPUPartition watch and the controllers
(:mod:`tessera_operator.controller.controllers`), which reconcile GPUQuotas from the
replica's own watches rather than from second ones through kopf.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import ssl
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kopf

from tessera.api.names import (
    ANNOTATION_GPU_POLICY,
    ANNOTATION_NODE_POLICY,
    ANNOTATION_PLACEMENT_URL,
    GPUPARTITIONS,
    GROUP,
    VERSION,
)
from tessera.kube import serve
from tessera.kube.client import ApiError, Credentials, Kube, load_credentials, path
from tessera.kube.health import Health, supervise
from tessera.kube.loops import measure_lag
from tessera.kube.shutdown import Drain
from tessera.placement.policy import Policy as PlacementPolicy
from tessera.placement.policy import parse as parse_policy
from tessera_operator import metrics
from tessera_operator.cache.managed import ManagedQuotaCache
from tessera_operator.cache.quotas import QuotaCache
from tessera_operator.controller import quota_metrics
from tessera_operator.controller.controllers import Controllers
from tessera_operator.controller.leader import LeaderElector
from tessera_operator.controller.seal import seal_key
from tessera_operator.controller.settings import Options
from tessera_operator.placement.cache import PlacementCache
from tessera_operator.placement.eviction import evictor
from tessera_operator.placement.extender import LeaderLink, add_routes
from tessera_operator.placement.on_demand import OnDemandAsker
from tessera_operator.placement.service import PlacementService
from tessera_operator.webhooks import server
from tessera_operator.webhooks.admission import Admission
from tessera_operator.webhooks.auth import reviewers
from tessera_operator.webhooks.lifecycle import WebhookCertificates
from tessera_operator.webhooks.rotation import Policy
from tessera_operator.webhooks.serving import EXTERNAL

log = logging.getLogger("tessera.operator")


def kopf_registry(ctl: Controllers, creds: Credentials) -> kopf.OperatorRegistry:
    """Thin kopf handlers: raw events into the controller; kopf stores nothing on objects.

    Only ``on.event`` handlers are registered, so kopf writes no diff-base or progress
    annotations and adds no finalizers: GitOps sees no churn from kopf's bookkeeping.
    """
    reg = kopf.OperatorRegistry()

    @kopf.on.startup(registry=reg)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False
        settings.scanning.disabled = True
        settings.peering.standalone = True
        settings.persistence.finalizer = f"{GROUP}/finalizer"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
            prefix=GROUP, v1=False)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=GROUP, key="last-handled", v1=False)
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330

    @kopf.on.login(registry=reg)
    def login(**_: Any) -> kopf.ConnectionInfo:
        # kopf logs in again after a 401: the service account token is read afresh then
        token = creds.current_token(0)
        return kopf.ConnectionInfo(server=creds.server, ca_path=creds.ca_path,
                                   token=token, certificate_path=creds.cert_path,
                                   private_key_path=creds.key_path, scheme="Bearer"
                                   if token else None)

    @kopf.on.event(GROUP, VERSION, GPUPARTITIONS, registry=reg)
    async def partition_event(type: str | None, body: Any, **_: Any) -> None:
        ctl.partitions.on_partition(type, _plain(body))

    return reg


async def run_kopf(registry: kopf.OperatorRegistry, stop: asyncio.Event,
                   take_signals: Callable[[], None]) -> None:
    """kopf until ``stop`` is set: what ``kopf.operator`` does (spawn its tasks, run them),
    with the process's own signal handlers put back in between. kopf, started in the main
    thread, installs SIGTERM/SIGINT handlers that stop it at once: the leader, the one
    replica running kopf, stopped without draining its webhook connections (a create in
    flight got EOF) and, once it had led, ignored SIGTERM after losing the lead."""
    existing = asyncio.all_tasks()
    tasks = await kopf.spawn_tasks(registry=registry, clusterwide=True, standalone=True,
                                   stop_flag=stop)
    take_signals()
    await kopf.run_tasks(tasks, ignored=existing)


def _plain(body: Any) -> dict[str, Any]:
    import copy
    return copy.deepcopy(dict(body))


async def whoami(kube: Kube) -> str | None:
    """The user the operator authenticates as (a SelfSubjectReview, which every
    authenticated user may create): the webhook admits growth holders only from it."""
    try:
        review = await kube.create(path("authentication.k8s.io", "v1", "selfsubjectreviews"),
                                   {"apiVersion": "authentication.k8s.io/v1",
                                    "kind": "SelfSubjectReview"})
    except ApiError as exc:
        log.error("cannot tell who this operator is: growth holders will be refused",
                  extra={"error": exc.message})
        return None
    return str(((review.get("status") or {}).get("userInfo") or {}).get("username") or "")


def certificates(kube: Kube, opts: Options) -> WebhookCertificates:
    """The webhooks' serving certificate and configurations, as the flags say."""
    hosts = [*opts.cert_hosts, opts.service_name, f"{opts.service_name}.{opts.namespace}.svc",
             f"{opts.service_name}.{opts.namespace}.svc.cluster.local"]
    return WebhookCertificates(
        kube, opts.namespace, opts.secret_name, hosts,
        Policy(opts.cert_lifetime_s, opts.cert_renew_fraction, opts.cert_step_s,
               opts.cert_check_interval_s),
        external=opts.webhook_certificate == EXTERNAL,
        applies_configurations=opts.webhook_configurations == "apply",
        webhook_url=opts.webhook_url, service_name=opts.service_name,
        config_interval_s=opts.webhook_config_interval_s)


async def run(opts: Options) -> None:
    """Every replica: the webhooks, the GPUQuota and managed-ResourceQuota watches, the
    certificate it serves; the replica holding the Lease also runs kopf, the controllers
    and the certificate's renewal."""
    creds = load_credentials(opts.kubeconfig)
    kube = Kube(creds)
    certs = certificates(kube, opts)
    serving = await certs.start(Path(tempfile.mkdtemp(prefix="tessera-webhook-")),
                                opts.webhook_client_ca)
    senders = reviewers(opts.webhook_client_ca, opts.webhook_client_names)
    if senders is None:
        log.warning("admission reviews are not authenticated (no --webhook-client-ca): "
                    "anyone reaching the webhook port can post reviews (they change nothing, "
                    "but cost the operator CPU)")
    elector = LeaderElector(kube, opts.namespace, opts.lease_name, opts.identity,
                            opts.lease_duration_s, opts.lease_renew_s,
                            annotations={ANNOTATION_PLACEMENT_URL: placement_url(opts)})
    health = Health(stuck_after_s=opts.stuck_after_s)
    store = QuotaCache(kube, health=health)
    counts = ManagedQuotaCache(kube, health=health)
    adm = Admission(kube, store, counts, await whoami(kube), opts.scheduler_name,
                    holder_image=opts.growth_holder_image)
    ctl = Controllers.build(kube, store, opts.recount_interval_s, health=health,
                            holder_image=opts.growth_holder_image)
    quota_metrics.register(store.snapshot, counts.get)
    drain = Drain(opts.shutdown_drain_s)
    places = PlacementCache(kube, health=health)
    placement = PlacementService(places, kube, default_placement_policy(opts),
                                 evict=evictor(kube))
    placing = {"ready": False}
    link = LeaderLink(kube, elector.url, lambda: elector.is_leader,
                      lambda: client_context(serving.current.ca_pem),
                      server_hostname=opts.placement_server_name or (
                          f"{opts.service_name}.{opts.namespace}.svc"
                          if os.environ.get("POD_IP") and not opts.placement_url else None),
                      ready=lambda: placing["ready"])

    def not_ready() -> list[str]:
        return ((["not synced yet"] if not (store.synced and counts.synced) else [])
                + (["placement: nodes and pods not listed yet"] if not places.synced else [])
                + (["stopping"] if drain.draining else []))

    hooks = server.webhook_app(adm, senders, closing=lambda: drain.draining)
    add_routes(hooks, placement, link)
    runners = [
        await server.start(hooks, opts.webhook_host, opts.webhook_port, serving.tls),
        await serve.start(serve.health_app(health, not_ready=not_ready),
                          opts.health_host, opts.health_port),
    ]
    lag = asyncio.create_task(measure_lag(metrics.LOOP_LAG_SECONDS.observe))
    log.info("serving", extra={"webhookPort": opts.webhook_port, "healthPort": opts.health_port,
                               "identity": opts.identity})
    asker = OnDemandAsker(placement, kube)  # MIG on demand for pods (status.demand)
    leader_work = {**certs.leader_tasks(), **ctl.tasks(), "mig-on-demand": asker.run}

    async def lead() -> None:
        ctl.lead_with(await seal_key(kube, opts.namespace))
        await places.relist_pods()  # the last leader's Bindings, before placing anything
        placing["ready"] = True
        stop = asyncio.Event()
        tasks = [asyncio.create_task(run_kopf(kopf_registry(ctl, creds), stop, take_signals),
                                     name="kopf")]
        for name, work in leader_work.items():
            task = asyncio.create_task(supervise(name, work, health), name=name)
            health.track(name, task)
            tasks.append(task)
        store.subscribe(ctl.quotas.on_quota)
        counts.subscribe(ctl.quotas.on_managed)
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()
        finally:
            store.subscribe(None)
            counts.subscribe(None)
            stop.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            take_signals()  # kopf leaves its handlers behind, on a future that is done
            health.forget(*leader_work)
            ctl.forget()
            placing["ready"] = False
            placement.forget()

    loop = asyncio.get_running_loop()
    everyone = {"quota-cache": store.watch, "managed-quota-cache": counts.watch,
                "certificate-follow": certs.follow_loop,
                "placement-nodes": places.watch_nodes, "placement-pods": places.watch_pods}
    background = [asyncio.create_task(supervise(name, work, health), name=name)
                  for name, work in everyone.items()]
    for name, task in zip(everyone, background, strict=True):
        health.track(name, task)
    main = asyncio.create_task(elector.run(lead))

    def take_signals() -> None:
        """SIGTERM and SIGINT start the drain (again after kopf replaced the handlers)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, drain.stop, lambda: main.cancel())

    take_signals()
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await main
    finally:
        for task in (*background, lag):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await elector.release()
        await link.close()
        log.info("closing the webhook and health servers")
        for r in runners:
            await r.cleanup()
        await kube.close()
        log.info("stopped", extra={"identity": opts.identity})


def placement_url(opts: Options) -> str:
    """Where this replica answers extender calls while it leads."""
    if opts.placement_url:
        return opts.placement_url.rstrip("/")
    host = os.environ.get("POD_IP") or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"https://{host}:{opts.webhook_port}"


def default_placement_policy(opts: Options) -> PlacementPolicy:
    return parse_policy({ANNOTATION_NODE_POLICY: opts.placement_node_policy,
                         ANNOTATION_GPU_POLICY: opts.placement_gpu_policy})


_contexts: dict[bytes, ssl.SSLContext] = {}


def client_context(ca_pem: bytes) -> ssl.SSLContext:
    """Trusts the webhook CA (to forward extender calls to the leader's same certificate)."""
    ctx = _contexts.get(ca_pem)
    if ctx is None:
        ctx = ssl.create_default_context(cadata=ca_pem.decode())
        _contexts.clear()
        _contexts[ca_pem] = ctx
    return ctx
