"""Which free MIG instance to hand out whole: the one that leaves the node's free slots most
useful.

On each MIG GPU the free memory slices are those covered by no instance or by an instance
no pod holds (a repartition could reuse them). A GPU's usefulness is the largest profile,
in memory slices, that :mod:`tessera.mig.catalog` could still place entirely in its free
slices (a valid start slot, enough free compute slices, the profile's maximum count
respected); 0 when none fits. The node's usefulness is the tuple of its GPUs' usefulness,
largest first; a lexicographically larger tuple is better.

Among the candidate instances the best is the one leaving the most useful node; ties go to
the GPU with fewer free instances (instances are packed onto busy GPUs), then the higher
start slot, then the UUID. A GPU with a unit whose profile the catalog does not know for its
model counts as fully used (usefulness 0), and whole GPUs (no profile) are not MIG GPUs.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from tessera.mig.catalog import Profile, UnknownProfileError, profile, profiles, slice_counts
from tessera.placement.units import Unit

InstanceKey = tuple[tuple[int, ...], int, int, str]
"""Smaller is better: negated node usefulness, free instances on the GPU, -start, UUID."""


def _profile(unit: Unit) -> Profile | None:
    if unit.profile is None or unit.start is None:
        return None
    try:
        p = profile(unit.model, unit.profile)
    except (UnknownProfileError, KeyError):
        return None
    return p if unit.start in p.starts else None


def mig_gpus(units: Iterable[Unit]) -> dict[str, list[Unit]]:
    """The node's MIG GPUs (those with instance units) and their instance units."""
    out: dict[str, list[Unit]] = defaultdict(list)
    for u in units:
        if u.profile is not None and u.start is not None:
            out[u.gpu_uuid].append(u)
    return dict(out)


def gpu_usefulness(model: str, instances: Sequence[Unit], held: frozenset[str]) -> int:
    """Largest profile (memory slices) placeable in the GPU's free slices."""
    memory_total, compute_total = slice_counts(model)
    occupied = 0
    compute_used = 0
    counts: Counter[str] = Counter()
    for u in instances:
        if u.uuid not in held:
            continue
        p = _profile(u)
        if p is None or u.start is None:
            return 0
        occupied |= p.mask(u.start)
        compute_used += p.compute_slices
        counts[p.name] += 1
    best = 0
    for p in profiles(model):
        if p.media_extensions or p.memory_slices <= best:
            continue
        if counts[p.name] >= p.max_count or compute_used + p.compute_slices > compute_total:
            continue
        if any(not occupied & p.mask(s) and s + p.memory_slices <= memory_total
               for s in p.starts):
            best = p.memory_slices
    return best


def node_usefulness(units: Sequence[Unit], held: frozenset[str]) -> tuple[int, ...]:
    """Each MIG GPU's usefulness with ``held`` instances taken, largest first."""
    return tuple(sorted((gpu_usefulness(insts[0].model, insts, held)
                         for insts in mig_gpus(units).values()), reverse=True))


def instance_key(candidate: Unit, units: Sequence[Unit], held: frozenset[str]) -> InstanceKey:
    """How good taking ``candidate`` is, given the instances ``held`` now (smaller: better)."""
    after = node_usefulness(units, held | {candidate.uuid})
    on_gpu = mig_gpus(units).get(candidate.gpu_uuid, [])
    free_here = sum(1 for u in on_gpu if u.uuid not in held)
    return (tuple(-x for x in after), free_here, -(candidate.start or 0), candidate.uuid)


def best_instance(candidates: Sequence[Unit], units: Sequence[Unit],
                  held: frozenset[str]) -> Unit:
    """The candidate that leaves the node's free slots most useful (see module rules)."""
    return min(candidates, key=lambda c: instance_key(c, units, held))
