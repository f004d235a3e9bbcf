"""A MIG GPU in on-demand mode as DRA partitionable devices (KEP-4815), pure: one device per
placement the GPU can still take, all drawing on one set of shared counters, so that the
scheduler never allocates two placements that overlap; the node daemon creates the instance
of the device a claim was allocated.

In ``resource.k8s.io/v1`` a ResourceSlice lists counter sets in ``spec.sharedCounters``
(``[{name, counters: {<name>: {value: <quantity>}}}]``) and each device says what it takes
in ``consumesCounters`` (``[{counterSet, counters: {<name>: {value}}}]``); the scheduler
allocates a set of devices only if, for every counter, what the allocated devices consume
adds up to at most the counter's value (:func:`allocatable`). Partitionable devices are
beta and on by default from Kubernetes 1.36 (``DRAPartitionableDevices``), alpha and off in
1.34, whose slice layout differs (below).

The counters of one GPU, set ``gpu<index>-slices``:

* ``memory-slice-<i>``, value 1, for each memory slice (8, or 4 on an A30): a placement
  consumes one of each slice it occupies, so two placements that overlap are never both
  allocated. GPU-instance placements are on this axis only (NVML's
  ``nvmlGpuInstancePlacement_t``: first memory slice and how many).
* ``compute-slices``, the compute slices left (7, or 4 on an A30): a placement consumes
  its profile's. Compute slices have no position at GPU-instance level, so they are one
  counter with the total, which is exactly the planner's rule (their sum must fit). No
  supported geometry reaches the limit before the memory slices do, but the counter keeps
  the rule exact if one did.
* ``media-engines``, value 1 (0 when an occupied instance has them): every ``+me``
  placement consumes it, since each ``+me`` instance takes the GPU's one OFA engine (at
  most one ``+me`` instance per GPU, whatever its profile: on an A30, ``1g.6gb+me`` and
  ``2g.12gb+me`` exclude each other);
* ``instances``, only with ``onDemand.maxInstances``: how many more instances may be
  created (the limit less the occupied ones); every placement consumes one. The profiles
  ``onDemand.profiles`` does not allow are not published at all (:class:`Bounds`).
* ``count-<profile slug>``, the instances of that profile that may still be created, for
  any other profile whose maximum count is below what its placements alone would allow
  (none on the supported models: the rule stays exact if a model has one).

So a set of these devices is allocatable exactly when the planner's validation accepts
their placements together with the GPU's other instances.

Instances already on the GPU that the scheduler does not know as allocations of these
devices (created for a static partition, left idle by a released claim: ``occupied``) are
honoured by leaving out every placement that could not be added beside them, checked by the
planner's validation, and by lowering ``compute-slices`` and the count counters by what they
use; their memory-slice counters stay, consumed by no published device. Why left out rather
than consuming the same counters: publishing an occupied instance as a device that consumes
its slices stops nothing, since a counter counts only what allocated devices consume and a
slice cannot mark a device allocated; keeping every placement but setting the occupied
slices' counters to 0 would work, but publishes devices that can never be allocated. Left
out, what is published is exactly what the GPU can still take.

Instances made for claims are passed as occupied too (the node daemon passes every instance
NVML shows): once made, the placement device a claim was allocated leaves the slice and its
compute slices leave ``compute-slices``; the claim's allocation stays as recorded. Until the
slice is written again the old one still counts the claim's consumption, so no memory or
compute slice is ever offered twice; the price is a slice write per instance made or
destroyed.

API limits (``resource.k8s.io/v1`` validation): device names, counter set names and counter
names are DNS labels (lowercase alphanumerics and ``-``, at most 63 characters); a counter
set has at most 32 counters (here at most 11 on an 8-slice GPU, 8 on an A30); a device has
at most 2 ``consumesCounters`` entries of at most 32 counters each (here one of at most 11);
a slice in which any device consumes counters holds at most 64 devices (an 8-slice GPU
publishes at most 25, an A30 13). From 1.36 ``sharedCounters`` must sit in a slice of its
own, without devices, in the same pool and generation, at most 8 counter sets per slice; in
1.34 they share the slice with the devices, at most 32 counters over all its sets (three
8-slice GPUs' sets). A slice written for 1.34's layout must be removed before moving to
1.35 or later.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tessera.api.inventory import GPUInventory
from tessera.api.names import DRA_ATTRIBUTE_MIG_PROFILE, DRA_CAPACITY_CORES, DRA_CAPACITY_MEMORY
from tessera.api.partition import OnDemand
from tessera.dra.devices import CORES, MIB
from tessera.mig.catalog import Profile, profile, profiles, slice_counts
from tessera.mig.ondemand import PlacedInstance, candidates
from tessera.mig.planner import Instance, LayoutError, validate

MAX_COUNTERS_PER_SET = 32
MAX_COUNTER_SETS_PER_SLICE = 8
"""From 1.36, in the slice that holds only ``sharedCounters``."""
MAX_COUNTERS_PER_SLICE_1_34 = 32
"""1.34: counters over all the counter sets of one slice."""
MAX_CONSUMPTIONS_PER_DEVICE = 2
MAX_COUNTERS_PER_CONSUMPTION = 32
MAX_DEVICES_CONSUMING_COUNTERS = 64
"""Devices per slice once any of them consumes counters (1.36; 128 in 1.34)."""

COMPUTE_SLICES = "compute-slices"
INSTANCES = "instances"
"""With a limit on instances (``onDemand.maxInstances``): how many more may be created;
every placement consumes one."""


@dataclass(frozen=True)
class Bounds:
    """What a GPUPartition's ``onDemand`` allows on its GPUs."""

    profiles: tuple[str, ...] = ()
    """Only these profiles are published (empty: every profile of the model)."""
    max_instances: int | None = None
    """At most this many instances at once (None: the model's own limits)."""
    keep_whole: int = 0
    """Per node, this many of the partition's GPUs kept with no instance (for whole-GPU
    work): while no more are empty, an empty GPU takes only whole-GPU profiles."""
    partition: str = ""
    """The partition they are of (``keep_whole`` counts its GPUs on a node)."""

    @classmethod
    def of(cls, spec: OnDemand | None, partition: str = "") -> Bounds:
        """A GPUPartition's ``spec.layout.onDemand`` (None: no bounds)."""
        if spec is None:
            return cls(partition=partition)
        return cls(tuple(spec.profiles or ()), spec.max_instances, spec.keep_whole or 0,
                   partition)

    def whole_only(self, model_id: str) -> Bounds | None:
        """These bounds on a GPU kept for whole-GPU work: only the profiles that take the
        whole GPU, of those allowed (None: none is allowed, so nothing may be made)."""
        whole = tuple(p.name for p in profiles(model_id)
                      if p.memory_slices == slice_counts(model_id)[0]
                      and (not self.profiles or p.name in self.profiles))
        return replace(self, profiles=whole) if whole else None


def kept_whole(gpus: Sequence[tuple[str, Bounds, bool]]) -> set[str]:
    """Of GPUs (id, bounds, whether it has no instance) of one node, those that are kept
    for whole-GPU work now: every empty GPU of a partition whose ``keep_whole`` is at least
    its number of empty GPUs on the node (taking a small instance on any of them would
    leave fewer)."""
    empty: dict[str, list[str]] = {}
    keep: dict[str, int] = {}
    for gid, b, is_empty in gpus:
        if b.keep_whole and is_empty:
            empty.setdefault(b.partition, []).append(gid)
            keep[b.partition] = b.keep_whole
    return {g for part, ids in empty.items() if len(ids) <= keep[part] for g in ids}


def counter_set_name(gpu_index: int) -> str:
    return f"gpu{gpu_index}-slices"


MEDIA_ENGINES = "media-engines"
"""The counter every ``+me`` placement consumes: the GPU's one OFA engine."""


def memory_slice_counter(slot: int) -> str:
    return f"memory-slice-{slot}"


def _slug(name: str) -> str:
    """A profile name as a DNS label's part: ``1g.10gb+me`` -> ``1g10gbme``."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def count_counter(profile_name: str) -> str:
    return f"count-{_slug(profile_name)}"


def placement_device_name(gpu_index: int, profile_name: str, start: int) -> str:
    """``gpu<index>-mig<start>-<profile slug>``: the name the existing MIG-instance devices
    carry, so an instance created for a placement keeps its device's name."""
    return f"gpu{gpu_index}-mig{start}-{_slug(profile_name)}"


_PLACEMENT = re.compile(r"^gpu(?P<index>\d+)-mig(?P<start>\d+)-(?P<slug>[a-z0-9]+)$")


def placement_of(device: str, gpu_index: int, model_id: str) -> tuple[str, int] | None:
    """The (profile, start) a device name of :func:`placement_device_name` stands for on
    GPU ``gpu_index`` of ``model_id``; None for any other name, another GPU, a profile the
    model does not have or a start the profile cannot take (a name is input: it is read,
    never trusted)."""
    m = _PLACEMENT.match(device)
    if m is None or int(m["index"]) != gpu_index:
        return None
    start = int(m["start"])
    for p in profiles(model_id):
        if _slug(p.name) == m["slug"] and start in p.starts:
            return p.name, start
    return None


def _placements_alone(p: Profile) -> int:
    """How many instances of ``p`` fit on an empty GPU by geometry alone: the starts taken
    earliest first (intervals of one length), ignoring the maximum count."""
    taken, count = 0, 0
    for start in p.starts:
        if not taken & p.mask(start):
            taken |= p.mask(start)
            count += 1
    return count


def counted_profiles(model_id: str) -> tuple[Profile, ...]:
    """The profiles other than ``+me`` whose maximum count binds before their placements
    run out: each gets a ``count-<slug>`` counter (none on the supported models)."""
    return tuple(p for p in profiles(model_id)
                 if not p.media_extensions and p.max_count < _placements_alone(p))


def has_media_extensions(model_id: str) -> bool:
    return any(p.media_extensions for p in profiles(model_id))


def _occupied(gpu: GPUInventory, occupied: Sequence[PlacedInstance]) -> list[Instance]:
    current = [Instance(i.profile, i.start) for i in occupied]
    try:
        validate(gpu.model, current)
    except LayoutError as exc:
        raise LayoutError(f"GPU {gpu.index}: occupied instances are invalid: {exc}") from None
    return current


def shared_counters(gpu: GPUInventory, occupied: Sequence[PlacedInstance],
                    bounds: Bounds = Bounds()) -> dict[str, Any]:
    """The GPU's counter set, one entry of ``spec.sharedCounters``."""
    current = _occupied(gpu, occupied)
    memory, compute = slice_counts(gpu.model)
    used = [profile(gpu.model, i.profile) for i in current]
    counts = Counter(p.name for p in used)
    counters = {memory_slice_counter(s): {"value": "1"} for s in range(memory)}
    counters[COMPUTE_SLICES] = {"value": str(compute - sum(p.compute_slices for p in used))}
    for p in counted_profiles(gpu.model):
        counters[count_counter(p.name)] = {"value": str(p.max_count - counts[p.name])}
    if has_media_extensions(gpu.model):
        taken = sum(1 for p in used if p.media_extensions)
        counters[MEDIA_ENGINES] = {"value": str(max(0, 1 - taken))}
    if bounds.max_instances is not None:
        counters[INSTANCES] = {"value": str(max(0, bounds.max_instances - len(used)))}
    return {"name": counter_set_name(gpu.index), "counters": counters}


def consumption(gpu: GPUInventory, p: Profile, start: int,
                bounds: Bounds = Bounds()) -> dict[str, Any]:
    """What the device of ``p`` at ``start`` consumes: one ``consumesCounters`` entry."""
    counters = {memory_slice_counter(s): {"value": "1"}
                for s in range(start, start + p.memory_slices)}
    counters[COMPUTE_SLICES] = {"value": str(p.compute_slices)}
    if p in counted_profiles(gpu.model):
        counters[count_counter(p.name)] = {"value": "1"}
    if p.media_extensions:
        counters[MEDIA_ENGINES] = {"value": "1"}
    if bounds.max_instances is not None:
        counters[INSTANCES] = {"value": "1"}
    return {"counterSet": counter_set_name(gpu.index), "counters": counters}


def _attributes(gpu: GPUInventory, p: Profile, start: int,
                cliques: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    """The attributes of the MIG-instance devices (``tessera.dra.devices``), less the
    instance's own UUID (it has none before it is created), plus where it would sit."""
    out: dict[str, dict[str, Any]] = {
        "model": {"string": gpu.model},
        "gpuUUID": {"string": gpu.uuid},
        "index": {"int": gpu.index},
        "memoryMiB": {"int": p.memory_mib},
        "mig": {"bool": True},
        "smCount": {"int": p.sm_count},
        DRA_ATTRIBUTE_MIG_PROFILE: {"string": p.name},
        "start": {"int": start},
        "memorySlices": {"int": p.memory_slices},
        "computeSlices": {"int": p.compute_slices},
    }
    if gpu.numa_node is not None:
        out["numaNode"] = {"int": gpu.numa_node}
    if gpu.pci_bus_id:
        out["pciBusID"] = {"string": gpu.pci_bus_id}
    if gpu.uuid in cliques:
        out["nvlinkClique"] = {"int": cliques[gpu.uuid]}
    return out


def placement_devices(gpu: GPUInventory, occupied: Sequence[PlacedInstance],
                      cliques: Mapping[str, int] | None = None,
                      bounds: Bounds = Bounds()) -> list[dict[str, Any]]:
    """One exclusive device per placement (profile x start) the GPU can still take beside
    ``occupied``, by profile (the catalog's order, smallest first) then start, of the
    profiles ``bounds`` allows. Capacity as a whole MIG instance's: its ``memory`` in bytes
    and all its ``cores``."""
    current = _occupied(gpu, occupied)
    cliques = cliques or {}
    out: list[dict[str, Any]] = []
    if bounds.max_instances is not None and len(current) >= bounds.max_instances:
        return out
    for p in profiles(gpu.model):
        if bounds.profiles and p.name not in bounds.profiles:
            continue
        for start in candidates(gpu.model, current, p):
            out.append({
                "name": placement_device_name(gpu.index, p.name, start),
                "attributes": _attributes(gpu, p, start, cliques),
                "capacity": {DRA_CAPACITY_MEMORY: {"value": str(p.memory_mib * MIB)},
                             DRA_CAPACITY_CORES: {"value": str(CORES)}},
                "consumesCounters": [consumption(gpu, p, start, bounds)],
            })
    return out


@dataclass(frozen=True)
class GPUPartitions:
    """One on-demand GPU's part of a ResourceSlice pool."""

    counter_set: dict[str, Any]
    """For ``spec.sharedCounters``."""
    devices: list[dict[str, Any]]
    """For ``spec.devices``."""


def gpu_partitions(gpu: GPUInventory, occupied: Sequence[PlacedInstance],
                   cliques: Mapping[str, int] | None = None,
                   bounds: Bounds = Bounds()) -> GPUPartitions:
    return GPUPartitions(counter_set=shared_counters(gpu, occupied, bounds),
                         devices=placement_devices(gpu, occupied, cliques, bounds))


def allocatable(counter_sets: Sequence[Mapping[str, Any]],
                devices: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the scheduler may allocate ``devices`` together: for every counter of every
    set, what they consume adds up to at most its value (a counter they name that no set
    has makes them unallocatable). Counter values here are plain integers."""
    available = {(s["name"], name): int(c["value"])
                 for s in counter_sets for name, c in s["counters"].items()}
    consumed: Counter[tuple[str, str]] = Counter()
    for d in devices:
        for entry in d.get("consumesCounters", ()):
            for name, c in entry["counters"].items():
                consumed[(entry["counterSet"], name)] += int(c["value"])
    return all(key in available and n <= available[key] for key, n in consumed.items())
