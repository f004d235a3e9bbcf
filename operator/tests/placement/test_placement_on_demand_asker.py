"""The leader's MIG-on-demand task, its memory across rounds: an instance made for a pod
that stays free while the pod waits for something else is released after UNUSED_S, and the
pod gets nothing for COOLDOWN_S (a pod that cannot start anyway holds no GPU slice)."""

from __future__ import annotations

from typing import Any, cast

from tessera.placement.on_demand import WantedInstance
from tessera.placement.units import Unit
from tessera_operator.placement.on_demand import COOLDOWN_S, UNUSED_S, OnDemandAsker

ASKED = WantedInstance("n0", "GPU-0", 0, "3g.40gb", 4, "ns/p", "uid-p", "lab")
OTHER = WantedInstance("n0", "GPU-0", 0, "1g.10gb", 0, "ns/q", "uid-q", "lab")


def unit(w: WantedInstance) -> Unit:
    return Unit(node=w.node, uuid=f"MIG-{w.start}", gpu_uuid=w.gpu, gpu_index=w.gpu_index,
                model="H100-80GB", resource=f"tessera.dev/mig-{w.profile}", memory_mib=1,
                shares=0, healthy=True, profile=w.profile, start=w.start, numa_node=0,
                nvlink_peers=frozenset())


def test_an_instance_left_unused_is_released_and_its_pod_cools_down() -> None:
    now = [1000.0]
    asker = OnDemandAsker(cast(Any, None), cast(Any, None), clock=lambda: now[0])
    previous = [ASKED, OTHER]
    free = {"n0": [unit(ASKED)]}  # ASKED made and free; OTHER not made yet
    waiting = {"uid-p", "uid-q"}
    assert asker._release_unused(previous, free, waiting, now[0]) == previous
    now[0] += UNUSED_S - 1
    assert asker._release_unused(previous, free, waiting, now[0]) == previous
    now[0] += 1
    assert asker._release_unused(previous, free, waiting, now[0]) == [OTHER]
    assert asker.unused == [ASKED] and asker.cooling == {"uid-p": now[0] + COOLDOWN_S}
    # taken meanwhile (no longer free) or the pod placed: the clock starts over
    asker = OnDemandAsker(cast(Any, None), cast(Any, None))
    asker._release_unused(previous, free, waiting, 0.0)
    asker._release_unused(previous, {}, waiting, 10.0)
    assert asker._release_unused(previous, free, waiting, UNUSED_S + 5) == previous
    assert asker.unused == []
