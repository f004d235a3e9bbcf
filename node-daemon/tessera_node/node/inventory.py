"""The node's GPUs as the inventory contract publishes them, from one NVML snapshot (pure).

The labels and the ``tessera.dev/gpus`` annotation come from :mod:`tessera.api.inventory`
(``node_labels``, ``to_annotation``); this module only turns what NVML reports into its
types, and checks the model table's MIG profiles against NVML's for each GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tessera.api.inventory import AdvertisedUnit, GPUInventory, MigInstance, OnDemandOffer
from tessera.dra.partitions import Bounds
from tessera.mig.catalog import profiles
from tessera.models import GPUModel
from tessera_node.device.state import DeviceSnapshot, GPUState, ProfileInfo, model_of
from tessera_node.deviceplugin.devices import Offer
from tessera_node.layout.desired import GPUTarget
from tessera_node.node.findings import Finding

MAX_DIFFERENCES = 3
"""Profile differences named in one finding before '… and N more'."""


@dataclass(frozen=True)
class NodeGPUs:
    """The inventory to publish and what is wrong with it."""

    gpus: tuple[GPUInventory, ...]
    findings: tuple[Finding, ...]


def node_gpus(snapshot: DeviceSnapshot) -> NodeGPUs:
    """Every GPU of a known model; a GPU the model table does not know is left out (the
    operator could not plan for it) and becomes a finding."""
    out: list[GPUInventory] = []
    findings: list[Finding] = []
    for g in snapshot.gpus:
        model = model_of(g)
        if model is None:
            findings.append(Finding(
                "UnknownModel", f"GPU {g.index} ({g.name}, PCI device 0x{g.pci_device_id:08X}) "
                "is not in tessera's model table: left out of the inventory", g.index))
            continue
        out.append(GPUInventory(
            index=g.index, uuid=g.uuid, model=model.id,
            memory_mib=g.memory_total_bytes // (1 << 20),
            mig_mode=g.mig_mode if model.mig_capable else "unsupported",
            instances=tuple(MigInstance(profile=i.profile, start=i.start, uuid=i.uuid)
                            for i in g.instances),
            numa_node=g.numa_node, pci_bus_id=g.pci_bus_id, nvlink_peers=g.nvlink_peers))
        findings.extend(profile_mismatches(g, model))
    return NodeGPUs(tuple(out), tuple(findings))


def with_units(gpus: tuple[GPUInventory, ...], offered: Iterable[Offer]
               ) -> tuple[GPUInventory, ...]:
    """The GPUs with ``units``: what the device plugin advertises on each (``offered``: its
    :func:`~tessera_node.deviceplugin.devices.offers`, in its order; a GPU it offers nothing
    on gets none). A MIG unit's ``start`` is its instance's placement."""
    starts = {i.uuid: i.start for g in gpus for i in g.instances if i.uuid}
    by_gpu: dict[str, list[AdvertisedUnit]] = {}
    for o in offered:
        u = o.unit
        by_gpu.setdefault(u.gpu_uuid, []).append(AdvertisedUnit(
            uuid=u.uuid, resource=o.resource, memory_mib=(u.memory_bytes or 0) // (1 << 20),
            shares=o.shares, healthy=u.healthy, profile=u.profile,
            start=starts.get(u.uuid) if u.profile else None))
    return tuple(g.model_copy(update={"units": tuple(by_gpu.get(g.uuid, ()))}) for g in gpus)


def unhealthy_units(gpus: tuple[GPUInventory, ...]) -> tuple[GPUInventory, ...]:
    """The GPUs with every unit unhealthy: how the device plugin advertises them while NVML
    cannot be read."""
    return tuple(g if not g.units else g.model_copy(update={"units": tuple(
        u.model_copy(update={"healthy": False}) for u in g.units)}) for g in gpus)


def profile_mismatches(gpu: GPUState, model: GPUModel) -> list[Finding]:
    """One finding when NVML's GPU-instance profiles differ from the model table's.

    NVML describes its profiles only while MIG is enabled; a GPU with MIG disabled is
    checked once it is enabled.
    """
    if not gpu.profiles or not model.mig_capable:
        return []
    nvml = {p.profile_id: p for p in gpu.profiles}
    table = {p.smi_profile_id: p for p in profiles(model.id)}
    diffs: list[str] = []
    for pid, want in sorted(table.items()):
        got = nvml.get(pid)
        if got is None:
            diffs.append(f"{want.name} (ID {pid}) missing from NVML")
            continue
        expected = ProfileInfo(pid, want.name, want.memory_mib, want.compute_slices,
                               want.max_count, want.sm_count)
        for field in ("name", "memory_mib", "compute_slices", "max_count", "sm_count"):
            a, b = getattr(expected, field), getattr(got, field)
            if a != b:
                diffs.append(f"{want.name} {field} {a} in the table, {b} by NVML")
    diffs += [f"{p.name} (ID {pid}) unknown to the table" for pid, p in sorted(nvml.items())
              if pid not in table]
    if not diffs:
        return []
    shown = "; ".join(diffs[:MAX_DIFFERENCES])
    more = len(diffs) - MAX_DIFFERENCES
    if more > 0:
        shown += f"; and {more} more"
    return [Finding("ProfileMismatch", f"GPU {gpu.index} ({model.id}): tessera's model "
                    f"table and NVML disagree on MIG profiles: {shown}", gpu.index)]


def on_demand_profiles(model: str, bounds: Bounds) -> tuple[str, ...]:
    """The profiles an on-demand GPU of ``model`` may be given (its partition's
    ``onDemand.profiles``, else every profile of the model; ``+me`` variants only when
    named): each is a device plugin resource from the start, so the scheduler sees the
    resource (with none free) and a pod asking it waits for an instance."""
    if bounds.profiles:
        return bounds.profiles
    try:
        return tuple(p.name for p in profiles(model) if not p.media_extensions)
    except (KeyError, ValueError):
        return ()


def with_on_demand(gpus: tuple[GPUInventory, ...], on_demand: Mapping[str, GPUTarget]
                   ) -> tuple[GPUInventory, ...]:
    """The GPUs with ``onDemand`` set on those whose instances are made for pods
    (``on_demand``: GPU UUID -> the target of its partition in migMode OnDemand)."""
    out = []
    for g in gpus:
        t = on_demand.get(g.uuid)
        if t is None or t.on_demand is None:
            out.append(g)
            continue
        out.append(g.model_copy(update={"on_demand": OnDemandOffer(
            partition=t.partition, profiles=t.on_demand.profiles,
            max_instances=t.on_demand.max_instances,
            keep_whole=t.on_demand.keep_whole or None)}))
    return tuple(out)
