"""One DRA device per unit tessera offers on a node — a whole GPU or one MIG instance — as
``resource.k8s.io/v1`` writes it in a ResourceSlice: a stable name, the attributes a user
selects on in CEL, and the capacity a claim consumes.

A unit that is shared (the device plugin's ``tessera.dev/vgpu`` units: a GPU without MIG, or
an instance of a partition with ``sharing: Shares``) is published with
``allowMultipleAllocations`` and consumable capacity: ``memory`` in bytes (claims in MiB
steps, at least 1 MiB) and ``cores`` in percent (1–100); a claim that does not say takes
all of either, so nothing is ever overcommitted by omission. A whole unit (``sharing:
Whole``) is an exclusive device with fixed capacity. Pure: the node daemon only calls it."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from tessera.api.inventory import AdvertisedUnit, GPUInventory
from tessera.api.names import DRA_ATTRIBUTE_MIG_PROFILE, DRA_CAPACITY_CORES, DRA_CAPACITY_MEMORY
from tessera.mig.catalog import UnknownProfileError, profile
from tessera.models import UnknownModelError, get_model

MIB = 1 << 20
CORES = 100
"""A unit's SM time, in percent: the ``cores`` capacity of every device."""
MAX_NAME = 63
"""A device name is a DNS label."""
MAX_KEYS = 32
"""Attributes and capacities together, per device (resource.k8s.io/v1)."""
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def is_c_identifier(key: str) -> bool:
    """An attribute or capacity name DRA accepts (a C identifier of at most 32 characters)."""
    return bool(_C_IDENTIFIER.match(key))


def is_dns_label(name: str) -> bool:
    return bool(_DNS_LABEL.match(name))


def device_name(gpu: GPUInventory, unit: AdvertisedUnit) -> str:
    """``gpu<index>`` for a whole GPU, ``gpu<index>-mig<start>-<profile>`` for an instance
    (``1g.10gb+me`` → ``1g10gbme``): stable for as long as the GPU sits at that index and
    the instance at that placement, so a daemon restart publishes the same names."""
    if unit.profile is None:
        return f"gpu{gpu.index}"
    slug = re.sub(r"[^a-z0-9]", "", unit.profile.lower())
    return f"gpu{gpu.index}-mig{unit.start if unit.start is not None else 0}-{slug}"


def nvlink_cliques(gpus: Iterable[GPUInventory]) -> dict[str, int]:
    """Per GPU UUID joined by NVLink to another of the node's GPUs: its clique, the lowest
    index among the GPUs it reaches through active links (GPUs without a link have none)."""
    by_uuid = {g.uuid: g for g in gpus}
    links: dict[str, set[str]] = {u: set() for u in by_uuid}
    for g in by_uuid.values():
        for peer in g.nvlink_peers:
            if peer in by_uuid and peer != g.uuid:
                links[g.uuid].add(peer)
                links[peer].add(g.uuid)
    out: dict[str, int] = {}
    for start in by_uuid:
        if start in out or not links[start]:
            continue
        seen, todo = {start}, [start]
        while todo:
            for peer in links[todo.pop()]:
                if peer not in seen:
                    seen.add(peer)
                    todo.append(peer)
        clique = min(by_uuid[u].index for u in seen)
        out.update({u: clique for u in seen})
    return out


def _string(value: str) -> dict[str, str]:
    return {"string": value}


def _int(value: int) -> dict[str, int]:
    return {"int": value}


def _sm_count(gpu: GPUInventory, unit: AdvertisedUnit) -> int | None:
    try:
        if unit.profile is None:
            return get_model(gpu.model).sm_count
        return profile(gpu.model, unit.profile).sm_count
    except (UnknownModelError, UnknownProfileError):
        return None


def attributes(gpu: GPUInventory, unit: AdvertisedUnit,
               cliques: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    """What a claim selects on (``device.attributes["gpu.tessera.dev"].<name>`` in CEL)."""
    out: dict[str, dict[str, Any]] = {
        "model": _string(gpu.model),
        "uuid": _string(unit.uuid),
        "gpuUUID": _string(gpu.uuid),
        "index": _int(gpu.index),
        "memoryMiB": _int(unit.memory_mib),
        "mig": {"bool": unit.profile is not None},
    }
    sm = _sm_count(gpu, unit)
    if sm is not None:
        out["smCount"] = _int(sm)
    if unit.profile is not None:
        out[DRA_ATTRIBUTE_MIG_PROFILE] = _string(unit.profile)
    if gpu.numa_node is not None:
        out["numaNode"] = _int(gpu.numa_node)
    if gpu.pci_bus_id:
        out["pciBusID"] = _string(gpu.pci_bus_id)
    if gpu.uuid in cliques:
        out["nvlinkClique"] = _int(cliques[gpu.uuid])
    return out


def capacity(unit: AdvertisedUnit, reserved: tuple[int, int] = (0, 0)
             ) -> dict[str, dict[str, Any]]:
    """``memory`` (bytes) and ``cores`` (percent); with request policies on a shared unit.
    ``reserved``: (bytes, cores) of the shared unit that live resizes took beyond their
    claims' allocations: published as that much less capacity, so the scheduler, which
    subtracts the allocated claims from it, places no new claim into it."""
    if not shared(unit):
        return {DRA_CAPACITY_MEMORY: {"value": str(unit.memory_mib * MIB)},
                DRA_CAPACITY_CORES: {"value": str(CORES)}}
    memory = str(max(MIB, unit.memory_mib * MIB - reserved[0]))
    cores = str(max(1, CORES - reserved[1]))
    return {
        DRA_CAPACITY_MEMORY: {"value": memory, "requestPolicy": {
            "default": memory, "validRange": {"min": "1Mi", "step": "1Mi"}}},
        DRA_CAPACITY_CORES: {"value": cores, "requestPolicy": {
            "default": cores, "validRange": {"min": "1", "max": cores, "step": "1"}}},
    }


def shared(unit: AdvertisedUnit) -> bool:
    """Several claims may share it: what the device plugin offers as ``tessera.dev/vgpu``
    shares (a whole MIG instance is advertised with none)."""
    return unit.shares > 0


def node_devices(gpus: Iterable[GPUInventory],
                 reserved: Mapping[str, tuple[int, int]] | None = None) -> list[dict[str, Any]]:
    """The node's DRA devices, in GPU index then placement order; healthy units only (an
    unhealthy unit is withdrawn, as the device plugin reports it unhealthy). A GPU whose
    units the daemon does not know yet publishes nothing. ``reserved``: unit UUID ->
    (bytes, cores) live resizes took there (:func:`capacity`)."""
    reserved = reserved or {}
    gpus = sorted(gpus, key=lambda g: g.index)
    cliques = nvlink_cliques(gpus)
    out: list[dict[str, Any]] = []
    for gpu in gpus:
        units = sorted(gpu.units or (), key=lambda u: (u.start is not None, u.start or 0))
        for unit in units:
            if not unit.healthy:
                continue
            device: dict[str, Any] = {
                "name": device_name(gpu, unit),
                "attributes": attributes(gpu, unit, cliques),
                "capacity": capacity(unit, reserved.get(unit.uuid, (0, 0))),
            }
            if shared(unit):
                device["allowMultipleAllocations"] = True
            out.append(device)
    return out
