"""Evicting the pods the placement service preempts: the Eviction API (a PodDisruption-
Budget that forbids it is obeyed: the pod stays, and the preemptor keeps waiting), and an
Event on each victim naming the pod it made room for."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from tessera.kube.client import ApiError, Kube, path
from tessera.kube.events import post_event
from tessera.placement.usage import Placed

log = logging.getLogger("tessera.placement")

REASON_PREEMPTED = "Preempted"
COMPONENT = "tessera-placement"


async def evict_one(kube: Kube, victim: Placed, for_pod: str) -> None:
    ns, _, name = victim.key.partition("/")
    body = {"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
            "deleteOptions": {"preconditions": {"uid": victim.uid}}}
    try:
        await kube.create(path("", "v1", "pods", ns, name, "eviction"), body)
    except (ApiError, OSError, TimeoutError) as exc:
        log.warning("preemption: eviction refused", extra={"pod": victim.key, "for": for_pod,
                                                           "error": str(exc)[:300]})
        return
    await post_event(kube, {"metadata": {"name": name, "namespace": ns, "uid": victim.uid}},
                     "v1", "Pod", REASON_PREEMPTED,
                     f"preempted by {for_pod}, of higher priority, which needs this pod's "
                     "GPU room (tessera placement)", "Normal", COMPONENT)


def evictor(kube: Kube) -> Callable[[str, Sequence[Placed]], None]:
    """Evicts in the background (the filter answering the scheduler does not wait)."""
    tasks: set[asyncio.Task[None]] = set()

    def evict(for_pod: str, victims: Sequence[Placed]) -> None:
        for v in victims:
            task = asyncio.get_running_loop().create_task(evict_one(kube, v, for_pod))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    return evict
