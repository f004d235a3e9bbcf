"""Leader election on a ``coordination.k8s.io/v1`` Lease (kopf's peering is not one).

The holder renews every ``renew_s``; a candidate takes the Lease over only once
``renewTime + leaseDurationSeconds`` has passed.  Every write carries the resourceVersion it
read, so two candidates racing for an expired Lease cannot both win.  A leader that cannot
renew within the duration steps down *before* another replica may take over (it stops at
``duration - renew_s`` without a successful renewal), so two leaders never overlap.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from tessera.kube.client import ApiError, Kube, Obj, path
from tessera_operator import metrics

log = logging.getLogger("tessera.leader")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _fmt(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(s: str | None) -> dt.datetime | None:
    if not s:
        return None
    return dt.datetime.fromisoformat(s.replace("Z", "+00:00"))


@dataclass
class LeaderElector:
    kube: Kube
    namespace: str
    name: str
    identity: str
    duration_s: int = 15
    renew_s: float = 5.0
    annotations: dict[str, str] = field(default_factory=dict)
    """Written on the Lease with every acquire and renewal (where the holder serves)."""
    is_leader: bool = False
    _last_renew: float = 0.0
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return path("coordination.k8s.io", "v1", "leases", self.namespace, self.name)

    def _spec(self, lease: Obj | None, now: dt.datetime) -> Obj:
        old = (lease or {}).get("spec") or {}
        taking_over = old.get("holderIdentity") != self.identity
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": self.duration_s,
                "renewTime": _fmt(now),
                "acquireTime": _fmt(now) if taking_over else old.get("acquireTime", _fmt(now)),
                "leaseTransitions": int(old.get("leaseTransitions") or 0) + (
                    1 if taking_over and lease is not None else 0)}
        return spec

    async def try_acquire_or_renew(self) -> bool:
        """One round: True if this replica holds the Lease afterwards."""
        now = _now()
        try:
            lease = await self.kube.get(self.url)
        except ApiError as exc:
            if exc.status != 404:
                raise
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace,
                                 "annotations": dict(self.annotations)},
                    "spec": self._spec(None, now)}
            try:
                await self.kube.create(path("coordination.k8s.io", "v1", "leases",
                                            self.namespace), body)
                return True
            except ApiError as exc2:
                if exc2.status == 409:
                    return False
                raise
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
        duration = int(spec.get("leaseDurationSeconds") or self.duration_s)
        expired = renewed is None or now > renewed + dt.timedelta(seconds=duration)
        if holder not in (self.identity, None, "") and not expired:
            return False
        lease["spec"] = self._spec(lease, now)
        meta = lease.setdefault("metadata", {})
        meta["annotations"] = {**(meta.get("annotations") or {}), **self.annotations}
        try:
            await self.kube.replace(self.url, lease)
            return True
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise

    async def release(self) -> None:
        """Give the Lease up on a clean shutdown so a standby takes over at once."""
        if not self.is_leader:
            return
        try:
            lease = await self.kube.get(self.url)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = ""
                lease["spec"]["renewTime"] = _fmt(_now() - dt.timedelta(days=1))
                await self.kube.replace(self.url, lease)
        except (ApiError, OSError) as exc:
            log.warning("could not release lease", extra={"error": str(exc)})
        self._set(False)

    def _set(self, leader: bool) -> None:
        if leader != self.is_leader:
            self.is_leader = leader
            metrics.IS_LEADER.set(1 if leader else 0)
            log.info("leadership changed", extra={"leader": leader, "identity": self.identity})
            self._changed.set()

    async def run(self, on_lead: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Campaign forever; while leading, run ``on_lead`` and cancel it on loss."""
        loop = asyncio.get_running_loop()
        task: asyncio.Task[None] | None = None
        try:
            while True:
                try:
                    held = await self.try_acquire_or_renew()
                except (ApiError, OSError, TimeoutError) as exc:
                    log.warning("lease round failed", extra={"error": str(exc)})
                    held = False
                now = loop.time()
                if held:
                    self._last_renew = now
                    self._set(True)
                elif self.is_leader and now - self._last_renew < self.duration_s - self.renew_s:
                    pass  # transient failure: still safely ours for a while
                else:
                    self._set(False)
                if self.is_leader and task is None:
                    task = asyncio.create_task(on_lead(), name="leader-work")
                if not self.is_leader and task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    task = None
                if task is not None and task.done():
                    err = None if task.cancelled() else task.exception()
                    if err is None:  # kopf stopped on a signal: shut down, hand over
                        log.info("leader work finished; stopping")
                        return
                    log.error("leader work failed", extra={"error": repr(err)})
                    raise SystemExit(1)
                await asyncio.sleep(self.renew_s if self.is_leader else self.renew_s / 2)
        finally:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
