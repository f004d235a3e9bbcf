"""MIG on demand for pods (tessera_node.layout.on_demand.decide, pure): what the operator
asks is made only where its partition owns an on-demand GPU and the bounds and geometry allow
it; an instance nothing asks or holds is destroyed only after the grace, never while a pod,
an allocation or a process holds it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpu_model import instance, new_gpu

from tessera.dra.partitions import Bounds
from tessera_node.device.state import DeviceSnapshot, GPUState, MigInstanceState
from tessera_node.layout.desired import GPUTarget
from tessera_node.layout.on_demand import Asked, MadeInstance, asked_of, decide

H100 = "H100-80GB"


def target(partition: str = "lab", bounds: Bounds | None = None) -> GPUTarget:
    return GPUTarget(partition, 1, True, on_demand=bounds or Bounds())


def ask(profile: str, start: int, gpu: GPUState, partition: str = "lab") -> Asked:
    return Asked(MadeInstance(gpu.index, gpu.uuid, profile, start), "ns/p", partition)


def never(_i: MigInstanceState) -> bool:
    return False


def run(gpu: GPUState, asked: list[Asked], targets: dict[str, GPUTarget] | None = None,
        held: Any = never, idle: dict[Any, float] | None = None, now: float = 100.0) -> Any:
    return decide(DeviceSnapshot((gpu,)), {gpu.uuid: target()} if targets is None else targets,
                  asked, held, {} if idle is None else idle, now, idle_s=30.0)


def test_asked_instances_are_made_and_an_incomplete_one_completed() -> None:
    g = new_gpu(H100, mig=True)
    work = run(g, [ask("3g.40gb", 4, g)])
    assert [a.instance for a in work.make] == [MadeInstance(0, g.uuid, "3g.40gb", 4)]
    made = replace(g, instances=(instance(H100, "3g.40gb", 4),))
    assert not run(made, [ask("3g.40gb", 4, made)])  # there: nothing to do
    half = replace(g, instances=(instance(H100, "3g.40gb", 4, with_ci=False),))
    assert [a.instance.start for a in run(half, [ask("3g.40gb", 4, half)]).make] == [4]


def test_what_is_not_the_partitions_or_does_not_fit_is_refused_with_why() -> None:
    g = replace(new_gpu(H100, mig=True), instances=(instance(H100, "4g.40gb", 0),))
    cases = [
        (ask("1g.10gb", 4, g, partition="other"), {g.uuid: target()}, "partition lab's"),
        (ask("1g.10gb", 4, g), {}, "not a GPU of this node in migMode OnDemand"),
        (ask("3g.40gb", 0, g), {g.uuid: target()}, "slot 0 is not free"),
        (ask("3g.40gb", 4, g), {g.uuid: target(bounds=Bounds(("1g.10gb",)))},
         "does not allow 3g.40gb"),
        (ask("1g.10gb", 4, g), {g.uuid: target(bounds=Bounds((), 1))}, "at most 1"),
        (ask("9g.99gb", 4, g), {g.uuid: target()}, "9g.99gb"),
    ]
    for asked, targets, why in cases:
        work = run(g, [asked], targets)
        assert not work.make, asked
        assert len(work.refused) == 1 and why in work.refused[0], work.refused
    # a GPU whose MIG is not on yet: nothing made, nothing refused (asked again after)
    off = new_gpu(H100)
    work = run(off, [ask("1g.10gb", 0, off)])
    assert not work.make and not work.refused


def test_an_idle_unasked_instance_is_destroyed_only_after_the_grace() -> None:
    g = replace(new_gpu(H100, mig=True), instances=(instance(H100, "1g.10gb", 0),))
    idle: dict[Any, float] = {}
    assert not run(g, [], idle=idle, now=100.0)
    assert not run(g, [], idle=idle, now=129.0)
    assert run(g, [], idle=idle, now=130.0).destroy == (MadeInstance(0, g.uuid, "1g.10gb", 0),)
    # asked again meanwhile: the clock starts over
    idle = {}
    run(g, [], idle=idle, now=100.0)
    run(g, [ask("1g.10gb", 0, g)], idle=idle, now=120.0)
    assert not run(g, [], idle=idle, now=140.0)


def test_held_or_busy_instances_and_declared_gpus_are_never_destroyed() -> None:
    busy = instance(H100, "1g.10gb", 0, processes=("pid 42 (python3)",))
    held = instance(H100, "2g.20gb", 2)
    free = instance(H100, "1g.10gb", 6)
    g = replace(new_gpu(H100, mig=True), instances=(busy, held, free))
    idle: dict[Any, float] = {}
    run(g, [], held=lambda i: i.uuid == held.uuid, idle=idle, now=0.0)
    work = run(g, [], held=lambda i: i.uuid == held.uuid, idle=idle, now=1000.0)
    assert work.destroy == (MadeInstance(0, g.uuid, "1g.10gb", 6),)
    # a GPU of a declared layout (not in the on-demand targets): its instances are the plan's
    assert not run(g, [], targets={}, idle={}, now=0.0) and not run(
        g, [], targets={}, idle={(g.uuid, "1g.10gb", 6): 0.0}, now=1000.0)


def test_status_demand_is_read_for_this_node_only_and_bad_entries_are_left_out() -> None:
    entry = {"node": "node-0", "gpu": "GPU-0", "gpuIndex": 0, "profile": "3g.40gb",
             "start": 4, "pod": "ns/p", "podUid": "u"}
    parts = [{"metadata": {"name": "lab"}, "status": {"demand": [
        entry, {**entry, "node": "node-1"}, {**entry, "start": "four"},
        {**entry, "start": 9}]}}]
    assert asked_of(parts, "node-0") == [
        Asked(MadeInstance(0, "GPU-0", "3g.40gb", 4), "ns/p", "lab")]
