"""MIG on demand: which profile a pending workload gets, and on which GPU and start slot its
instance is created (pure; nothing here touches a GPU).

A claim or pod that asks a MIG profile no existing instance serves makes tessera create that
instance on an idle slice of some GPU, without moving or destroying any instance there:

* :func:`smallest_profile`: a request by memory gets the smallest profile that holds it.
* :func:`candidates`: the start slots where a profile can be added to a GPU beside the
  instances it has, each checked by the planner's own :func:`~tessera.mig.planner.validate`
  (valid start, no overlap on the memory-slice axis, maximum count, compute slices).
* :func:`choose`: among every GPU and start where the profile can be added, the one that
  keeps the most useful free room in the fleet (the rule is on :func:`choose`).

Geometry restated (the catalog holds it): on A100/H100/H200/B200-class GPUs an instance
occupies 1, 2, 4 or 8 of 8 memory slices from one of its profile's start slots (1g: 0-6,
double-memory 1g: 0/2/4/6, 2g: 0/2/4, 3g: 0/4, 4g: 0, 7g: 0) and uses 1, 1, 2, 3, 4 or 7
of 7 compute slices; on the A30, 1, 2 or 4 of 4 slices of each kind (1g: 0-3, 2g: 0/2,
4g: 0). A ``+me`` variant has its base profile's geometry; a GPU holds at most one instance
of each ``+me`` profile.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Generic, Protocol, TypeVar

from tessera.mig.catalog import Profile, profile, profiles
from tessera.mig.planner import Instance, LayoutError, validate


class PlacedInstance(Protocol):
    """Anything with a profile name and a start slot: a planner ``Instance`` or
    ``Placement``, or an inventory ``MigInstance``."""

    @property
    def profile(self) -> str: ...

    @property
    def start(self) -> int: ...


GpuId = TypeVar("GpuId", int, str)
"""How a caller names a GPU: an index or a string (a UUID, ``node/index``); one kind per
call, so that "lowest id" is defined."""


@dataclass(frozen=True)
class Choice(Generic[GpuId]):
    """Create the instance on ``gpu`` at memory slice ``start``."""

    gpu: GpuId
    start: int


Fleet = Sequence[tuple[GpuId, Sequence[PlacedInstance]]]
"""GPUs of one model, each with the instances it has now."""


def smallest_profile(
    model_id: str, memory_mib: int, allowed: Sequence[str] | None = None
) -> Profile | None:
    """The smallest profile of ``model_id`` whose instance memory holds ``memory_mib``.

    Smallest by instance memory, then by compute slices (on an A100-40GB ``1g.10gb`` and
    ``2g.10gb`` have the same memory; a request by memory gets the 1g), then by name. A
    ``+me`` variant is only given when no other profile holds the request, however large
    (``allowed`` ``1g.10gb+me`` and ``7g.80gb``: the 7g), since it takes the GPU's media
    engines, which a request by memory did not ask for. ``allowed``
    restricts the choice to those profile names (an unknown name raises
    :class:`~tessera.mig.catalog.UnknownProfileError`); None when nothing holds it.
    """
    if memory_mib < 0:
        raise ValueError(f"memory must not be negative, got {memory_mib} MiB")
    pool = profiles(model_id) if allowed is None else [profile(model_id, n) for n in allowed]
    holding = [p for p in pool if p.memory_mib >= memory_mib]
    if not holding:
        return None
    return min(holding, key=lambda p: (p.media_extensions, p.memory_mib, p.compute_slices,
                                       p.name))


def _resolve(model_id: str, wanted: str | Profile) -> Profile:
    if isinstance(wanted, Profile):
        if wanted.model_id != model_id:
            raise ValueError(f"profile {wanted.name} is of {wanted.model_id}, not {model_id}")
        return wanted
    return profile(model_id, wanted)


def _instances(existing: Sequence[PlacedInstance]) -> list[Instance]:
    return [Instance(i.profile, i.start) for i in existing]


def _valid(model_id: str, instances: Sequence[Instance]) -> bool:
    try:
        validate(model_id, instances)
    except LayoutError:
        return False
    return True


def candidates(
    model_id: str, existing: Sequence[PlacedInstance], wanted: str | Profile
) -> list[int]:
    """Every start slot, ascending, where ``wanted`` can be added to a GPU holding the
    ``existing`` instances, those staying where they are; empty if none.

    Each start is checked by the planner's validation of the whole GPU with the new
    instance added. Raises :class:`~tessera.mig.planner.LayoutError` if the existing
    instances cannot coexist themselves.
    """
    p = _resolve(model_id, wanted)
    current = _instances(existing)
    try:
        validate(model_id, current)
    except LayoutError as exc:
        raise LayoutError(f"existing instances are invalid: {exc}") from None
    return [s for s in p.starts if _valid(model_id, [*current, Instance(p.name, s)])]


@cache
def scored_profiles(model_id: str) -> tuple[Profile, ...]:
    """The profiles free room is counted in, largest first: every profile but the ``+me``
    variants (their geometry is their base profile's), by memory slices then compute
    slices, descending (7g, 4g, 3g, 2g, double-memory 1g, 1g on an 8-slice GPU)."""
    return tuple(sorted((p for p in profiles(model_id) if not p.media_extensions),
                        key=lambda p: (-p.memory_slices, -p.compute_slices, p.name)))


@dataclass(frozen=True)
class FreeRoom:
    """What a GPU can still take beside its instances, without moving them."""

    usable_slices: int
    """Free memory slices that some instance that could still be added would occupy; a free
    slice outside every such instance is stranded until an instance is destroyed."""
    counts: tuple[int, ...]
    """Per profile of :func:`scored_profiles`, largest first: how many more instances of
    that profile alone could be added."""

    def vector(self) -> tuple[int, ...]:
        """``usable_slices`` then ``counts``: the order :func:`choose` compares in."""
        return (self.usable_slices, *self.counts)


@cache
def _room(model_id: str, state: tuple[tuple[str, int], ...]) -> FreeRoom:
    current = [Instance(n, s) for n, s in state]
    usable = 0
    counts = []
    for p in scored_profiles(model_id):
        # Earliest start first: the instances of one profile are intervals of one length,
        # for which taking the earliest-ending free one each time places the most; the
        # maximum count and the compute slices only cap how many, whichever are taken.
        added: list[Instance] = []
        for start in p.starts:
            trial = Instance(p.name, start)
            if _valid(model_id, [*current, trial]):
                usable |= p.mask(start)
                if _valid(model_id, [*current, *added, trial]):
                    added.append(trial)
        counts.append(len(added))
    return FreeRoom(usable_slices=usable.bit_count(), counts=tuple(counts))


def free_room(model_id: str, existing: Sequence[PlacedInstance]) -> FreeRoom:
    """The free room of a GPU holding ``existing`` (checked by the planner's validation)."""
    return _room(model_id, tuple(sorted((i.profile, i.start) for i in existing)))


def room_change(model_id: str, existing: Sequence[PlacedInstance], wanted: str | Profile,
                start: int) -> tuple[int, ...]:
    """How adding ``wanted`` at ``start`` changes the GPU's :meth:`FreeRoom.vector`."""
    p = _resolve(model_id, wanted)
    before = free_room(model_id, existing).vector()
    after = free_room(model_id, [*_instances(existing), Instance(p.name, start)]).vector()
    return tuple(a - b for a, b in zip(after, before, strict=True))


def _sorted_fleet(gpus: Fleet[GpuId]) -> list[tuple[GpuId, Sequence[PlacedInstance]]]:
    ids = [g for g, _ in gpus]
    if len(set(ids)) != len(ids):
        raise ValueError(f"GPU ids must be unique, got {ids}")
    return sorted(gpus, key=lambda g: g[0])


def choose(model_id: str, gpus: Fleet[GpuId], wanted: str | Profile) -> Choice[GpuId] | None:
    """Where to create an instance of ``wanted`` in a fleet of GPUs of ``model_id``, or
    None if no GPU can take it without moving an instance.

    The rule: keep the most useful free room. The fleet's free room is the sum over its
    GPUs of their :class:`FreeRoom`. Among every (GPU, start) where the profile can be
    added (:func:`candidates`), take the one after which the fleet has

    1. the most usable free memory slices, i.e. the fewest slices stranded: free, but
       outside every instance that could still be added (on an 8-slice GPU, slice 7 once
       a 1-slice instance sits at 6, since only a double-memory 1g at 6, a 3g at 4 or a
       7g reach it; or every free slice once all 7 compute slices are taken); then
    2. the most room for the largest profile, then for the next one, and so on
       (:attr:`FreeRoom.counts` compared lexicographically).

    Why: every placement takes its own slices; what a rule can spare is the slices it
    strands, which no claim can use until something is released, and the aligned runs
    larger profiles need (a 7g an empty GPU, a 4g slices 0-3, a 3g slices 0-3 or 4-7),
    which a badly placed small instance breaks while the smallest profiles fit in almost
    any leftover slice. So room for a larger profile outweighs any room for smaller ones.
    Stranded slices come first because, replaying random claims and releases
    (:mod:`tessera.mig.fragmentation`), ranking by room alone keeps a 2g's run beside a
    1g at slice 6 and strands slice 7, and under heavy load was refused more claims that
    the fleet's free slices would have held than first fit.

    A placement changes only its own GPU's room, so the choices are compared on that GPU's
    change (:func:`room_change`), which orders them as the fleet's room after them does.
    Ties, in order: a GPU that already has instances (pack; keep empty GPUs whole), the
    lowest GPU id, the lowest start. The first never decides: where the usable slices tie,
    an instance on an empty GPU costs the fleet the room of the largest profile, which a
    GPU with instances has lost already, so the room itself prefers packing.
    """
    p = _resolve(model_id, wanted)
    best: tuple[tuple[tuple[int, ...], bool], Choice[GpuId]] | None = None
    for gpu, existing in _sorted_fleet(gpus):
        for start in candidates(model_id, existing, p):
            key = (room_change(model_id, existing, p, start), bool(existing))
            if best is None or key > best[0]:
                best = (key, Choice(gpu, start))
    return None if best is None else best[1]


def first_fit(model_id: str, gpus: Fleet[GpuId], wanted: str | Profile) -> Choice[GpuId] | None:
    """The baseline :func:`choose` is compared with: the lowest GPU id that can take the
    profile, at its lowest valid start."""
    p = _resolve(model_id, wanted)
    for gpu, existing in _sorted_fleet(gpus):
        starts = candidates(model_id, existing, p)
        if starts:
            return Choice(gpu, starts[0])
    return None
