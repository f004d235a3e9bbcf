"""What the device plugin advertises, from the node's GPU and MIG state (pure).

A *unit* is what one container sees as one CUDA device: a whole GPU (MIG disabled) or one
MIG instance. Each unit is used one way only (one instance, one use): a GPU without MIG is
always shared as ``tessera.dev/vgpu`` shares; a MIG instance is handed out whole as
``tessera.dev/mig-<profile>`` or shared as vgpu shares, as its GPUPartition's
``spec.sharing`` says (``Whole`` by default), never both. The kubelet cannot express that
two devices depend on each other, so advertising one instance twice would let it be given
out whole and shared at once.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from tessera.api.names import GPU_POD, VGPU, VGPU_CORES, VGPU_MEMORY
from tessera.api.resources import mig_resource_name
from tessera_node.device.state import DeviceSnapshot, GPUState, MigInstanceState

Sharing = Literal["Whole", "Shares"]
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
SHARE_SEP = "::"
MIB = 1 << 20


@dataclass(frozen=True)
class Unit:
    """One GPU or MIG instance: what a container sees as one device."""

    uuid: str
    """``GPU-…`` (whole GPU) or ``MIG-…``."""
    gpu_uuid: str
    gpu_index: int
    profile: str | None
    """MIG profile name; None for a whole GPU."""
    memory_bytes: int | None
    """None: unknown (the unit is advertised unhealthy: its budgets cannot be checked)."""
    healthy: bool
    minor: int | None = None
    """The GPU's minor number (its device file ``nvidia<minor>``); None: unknown."""
    gi_id: int | None = None
    """A MIG instance's GPU-instance ID; None for a whole GPU."""
    ci_id: int | None = None
    """The compute instance of a MIG instance's device; None for a whole GPU or unknown."""


@dataclass(frozen=True)
class PluginDevice:
    id: str
    unit: str
    """The unit's UUID."""
    health: str


def _instance_memory(gpu: GPUState, inst: MigInstanceState) -> int | None:
    if inst.memory_total_bytes:
        return inst.memory_total_bytes
    for p in gpu.profiles:
        if p.profile_id == inst.profile_id and p.memory_mib > 0:
            return p.memory_mib * MIB
    return None


def units(snapshot: DeviceSnapshot, unhealthy: frozenset[str] = frozenset()) -> list[Unit]:
    """Every unit of the node. A MIG instance without a compute instance (no MIG device UUID
    yet) is no unit. ``unhealthy``: GPU or MIG UUIDs found unhealthy (XID errors, NVML
    failures); a GPU's unhealthiness covers its instances."""
    out: list[Unit] = []
    for gpu in snapshot.gpus:
        bad_gpu = gpu.uuid in unhealthy
        if gpu.mig_mode == "enabled":
            for inst in gpu.instances:
                if not inst.uuid:
                    continue
                mem = _instance_memory(gpu, inst)
                out.append(Unit(
                    uuid=inst.uuid, gpu_uuid=gpu.uuid, gpu_index=gpu.index,
                    profile=inst.profile or None, memory_bytes=mem,
                    healthy=not bad_gpu and inst.uuid not in unhealthy and mem is not None
                    and bool(inst.profile),
                    minor=gpu.minor, gi_id=inst.gi_id, ci_id=inst.ci_id,
                ))
        else:
            mem = gpu.memory_total_bytes or None
            out.append(Unit(
                uuid=gpu.uuid, gpu_uuid=gpu.uuid, gpu_index=gpu.index, profile=None,
                memory_bytes=mem, healthy=not bad_gpu and mem is not None, minor=gpu.minor,
            ))
    return out


def offered_units(snapshot: DeviceSnapshot, withdrawn: Mapping[str, Collection[str]],
                  readable: bool = True) -> list[Unit]:
    """The units of a snapshot less what is withdrawn (GPU UUID -> devices; the GPU's own UUID
    among them: all of it), every one unhealthy when NVML is not ``readable`` now (the
    snapshot is the last one read): what the device plugin hands out."""
    gone = {x for devs in withdrawn.values() for x in devs}
    whole = {g for g, devs in withdrawn.items() if g in devs}
    found = [u for u in units(snapshot) if u.uuid not in gone and u.gpu_uuid not in whole]
    return found if readable else [_unhealthy(u) for u in found]


def _unhealthy(u: Unit) -> Unit:
    return replace(u, healthy=False)


def is_shared(unit: Unit, sharing: Mapping[str, Sharing]) -> bool:
    """Whole GPUs are always shared; a MIG instance as its GPU's partition says."""
    return unit.profile is None or sharing.get(unit.gpu_uuid, "Whole") == "Shares"


def share_id(unit_uuid: str, k: int) -> str:
    return f"{unit_uuid}{SHARE_SEP}{k}"


def unit_of(device_id: str) -> str:
    """The unit UUID a device ID stands for (a share ID or a whole instance's UUID)."""
    return device_id.split(SHARE_SEP, 1)[0]


@dataclass(frozen=True)
class Offer:
    """How one unit is advertised: under which resource, as how many devices."""

    unit: Unit
    resource: str
    """``tessera.dev/vgpu`` or ``tessera.dev/mig-<profile>``."""
    shares: int
    """``tessera.dev/vgpu`` devices (shares) on it; 0: one device, the unit whole."""


def offers(all_units: list[Unit], shares_per_unit: int,
           sharing: Mapping[str, Sharing]) -> list[Offer]:
    """Each unit's one resource, by GPU index then UUID: what :func:`advertised` serves and
    what the node's inventory publishes as its ``units`` (one decision for both)."""
    if shares_per_unit < 1:
        raise ValueError("shares per unit must be at least 1")
    out: list[Offer] = []
    for u in sorted(all_units, key=lambda u: (u.gpu_index, u.uuid)):
        if is_shared(u, sharing):
            out.append(Offer(u, VGPU, shares_per_unit))
        else:
            assert u.profile is not None
            out.append(Offer(u, mig_resource_name(u.profile), 0))
    return out


def advertised(
    all_units: list[Unit],
    shares_per_unit: int,
    sharing: Mapping[str, Sharing],
    profiles: frozenset[str] = frozenset(),
) -> dict[str, list[PluginDevice]]:
    """Devices by resource name. ``tessera.dev/vgpu`` is always present (possibly empty), and
    so is the resource of every profile in ``profiles`` (the profiles the node's layouts
    name), so a plugin keeps serving, with no devices, while its instances are being
    re-created."""
    out: dict[str, list[PluginDevice]] = {VGPU: []}
    for p in sorted(profiles):
        out.setdefault(mig_resource_name(p), [])
    for o in offers(all_units, shares_per_unit, sharing):
        health = HEALTHY if o.unit.healthy else UNHEALTHY
        uuid = o.unit.uuid
        out.setdefault(o.resource, []).extend(
            [PluginDevice(share_id(uuid, k), uuid, health) for k in range(o.shares)]
            if o.shares else [PluginDevice(uuid, uuid, health)])
    return out


DEFAULT_MAX_PODS = 110
"""The kubelet's default ``maxPods``: used while the Node's ``pods`` capacity is unknown."""


def vgpu_capacity(all_units: list[Unit], sharing: Mapping[str, Sharing],
                  max_pods: int = DEFAULT_MAX_PODS) -> dict[str, str]:
    """The Node's capacity of ``tessera.dev/vgpu-memory`` (MiB) and ``tessera.dev/vgpu-cores``
    (percent): the healthy shared units' memory, and 100 per healthy shared unit; and of
    ``tessera.dev/pod`` (one on every GPU pod, what the managed ResourceQuota counts GPU pods
    by): as many as the kubelet may run pods."""
    shared = [u for u in all_units if u.healthy and is_shared(u, sharing)]
    memory_mib = sum((u.memory_bytes or 0) // MIB for u in shared)
    return {VGPU_MEMORY: str(memory_mib), VGPU_CORES: str(100 * len(shared)),
            GPU_POD: str(max_pods)}


def capacity_patch(capacity: Mapping[str, str]) -> dict[str, object]:
    """The merge patch of ``nodes/<node>/status`` that sets these extended resources (the
    kubelet does not advertise them: no plugin serves them)."""
    return {"status": {"capacity": dict(capacity), "allocatable": dict(capacity)}}
