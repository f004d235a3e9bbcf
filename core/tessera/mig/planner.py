"""Decide whether a MIG layout fits one GPU, enumerate layouts, and plan minimal-disruption
changes (reference: docs/mig.md §1.4, §1.5, §8).

A layout is a multiset of profile names.  It fits if every instance gets a valid start slot on
the memory-slice axis with no two overlapping, no profile exceeds its maximum count and the
compute slices suffice.  Placements are always explicit: NVML's default placement depends on
creation order and falls into the "largest first" trap (3g+2g+2g only fits with the 3g at
slot 4), so the planner chooses every start and the executor creates with that start.

``+me`` variants: they share the geometry of their base profile (same slots) and at most one
fits.  Enumeration excludes them unless asked (``include_media_extensions``), because they add
no geometry, only a renamed copy of a base instance; the reference counts (77 feasible, 28
maximal on 8-slice GPUs; 9 and 4 on the A30) are without them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from typing import Literal

from tessera.mig.catalog import Profile, profile, profiles, slice_counts


class LayoutError(ValueError):
    """A layout or state that cannot exist on the GPU; the message says which resource runs out."""


class DisruptionError(ValueError):
    """The change would destroy a busy instance and the policy is to refuse."""


class DisruptionPolicy(StrEnum):
    """What to do when a busy instance stands in the way of the desired layout."""

    WAIT = "wait"
    """Do nothing now; plan again once the instance is idle."""
    REFUSE = "refuse"
    """Raise :class:`DisruptionError`."""


@dataclass(frozen=True, order=True)
class Placement:
    """A GPU instance of ``profile`` occupying ``size`` memory slices from ``start``."""

    profile: str
    start: int
    size: int = 0

    def __str__(self) -> str:
        return f"{self.profile}@{self.start}"


@dataclass(frozen=True)
class Instance:
    """A GPU instance that exists now; ``busy`` means processes run on it."""

    profile: str
    start: int
    busy: bool = False

    def __str__(self) -> str:
        return f"{self.profile}@{self.start}" + (" (busy)" if self.busy else "")


@dataclass(frozen=True)
class Step:
    """One executor action with an explicit placement (``nvidia-smi mig -cgi <id>:<start>``)."""

    action: Literal["destroy", "create"]
    profile: str
    start: int


@dataclass(frozen=True)
class Plan:
    """The minimal-disruption route from the current instances to a desired layout."""

    steps: tuple[Step, ...]
    """What to run now, in order; empty while waiting."""
    kept: tuple[Placement, ...]
    """Current instances that stay where they are."""
    final: tuple[Placement, ...]
    """The layout once the steps (or, while waiting, ``pending_steps``) have run."""
    waiting_for: tuple[Instance, ...] = ()
    """Busy instances that must go first (policy ``wait``); the caller plans again later."""
    pending_steps: tuple[Step, ...] = ()
    """While waiting: the steps that would run if the busy instances were idle now."""

    @property
    def destroys(self) -> int:
        return sum(1 for s in self.steps or self.pending_steps if s.action == "destroy")

    @property
    def creates(self) -> int:
        return sum(1 for s in self.steps or self.pending_steps if s.action == "create")


def _resolve(model_id: str, names: Iterable[str]) -> list[Profile]:
    return [profile(model_id, n) for n in names]


def _summary(names: Iterable[str]) -> str:
    counts = Counter(names)
    return "+".join(f"{n}x{p}" if n > 1 else p for p, n in sorted(counts.items())) or "nothing"


def _check_totals(model_id: str, wanted: Sequence[Profile], what: str) -> None:
    """Reject on counts and slice totals, the reasons a person can act on."""
    total_memory, total_compute = slice_counts(model_id)
    for name, n in sorted(Counter(p.name for p in wanted).items()):
        limit = profile(model_id, name).max_count
        if n > limit:
            raise LayoutError(
                f"{what} has {n}x {name} but at most {limit} fit on {model_id} "
                f"(the profile's maximum count)"
            )
    media = sorted(p.name for p in wanted if p.media_extensions)
    if len(media) > 1:
        raise LayoutError(
            f"{what} has {len(media)} media-extension instances ({', '.join(media)}) but "
            f"{model_id} has one OFA engine, which each of them takes: at most one +me "
            f"instance per GPU"
        )
    memory = sum(p.memory_slices for p in wanted)
    if memory > total_memory:
        raise LayoutError(
            f"memory slices run out: {what} needs {memory}, {model_id} has {total_memory}"
        )
    compute = sum(p.compute_slices for p in wanted)
    if compute > total_compute:
        raise LayoutError(
            f"compute slices run out: {what} needs {compute}, {model_id} has {total_compute}"
        )


def _search_order(wanted: Sequence[Profile]) -> list[int]:
    """Most constrained first (largest, fewest slots); equal profiles next to each other."""
    return sorted(
        range(len(wanted)),
        key=lambda i: (-wanted[i].memory_slices, len(wanted[i].starts), wanted[i].name),
    )


def _place(wanted: Sequence[Profile], occupied: int) -> list[int] | None:
    """Start slots for ``wanted`` (same order) around the ``occupied`` slice mask, or None.

    Depth-first over the most constrained profiles first (largest, fewest slots), with equal
    profiles taking increasing starts so that symmetric arrangements are tried once.
    """
    order = _search_order(wanted)
    starts: list[int] = [0] * len(wanted)

    def search(k: int, mask: int, min_start: int) -> bool:
        if k == len(order):
            return True
        p = wanted[order[k]]
        for start in p.starts:
            if start < min_start:
                continue
            m = p.mask(start)
            if mask & m:
                continue
            starts[order[k]] = start
            following_same = k + 1 < len(order) and wanted[order[k + 1]].name == p.name
            if search(k + 1, mask | m, start + 1 if following_same else 0):
                return True
        return False

    return starts if search(0, occupied, 0) else None


def fit(model_id: str, profile_names: Sequence[str]) -> list[Placement]:
    """Concrete placements for a layout on an empty GPU, sorted by start.

    Raises :class:`LayoutError` naming the resource that runs out, or
    :class:`~tessera.mig.catalog.UnknownProfileError` for a name the model does not have.
    """
    wanted = _resolve(model_id, profile_names)
    what = f"layout {_summary(profile_names)}"
    _check_totals(model_id, wanted, what)
    starts = _place(wanted, 0)
    if starts is None:
        slots = "; ".join(
            f"{p.name} starts at {','.join(map(str, p.starts))}"
            for p in sorted(set(wanted), key=lambda p: p.name)
        )
        raise LayoutError(
            f"placement conflict: {what} fits the slice totals of {model_id} but no "
            f"arrangement avoids overlap ({slots})"
        )
    return sorted(
        (Placement(p.name, s, p.memory_slices) for p, s in zip(wanted, starts, strict=True)),
        key=lambda p: p.start,
    )


def validate(model_id: str, placements: Sequence[Placement | Instance]) -> None:
    """Check that explicit placements can coexist on one GPU; raise LayoutError if not."""
    wanted = _resolve(model_id, (p.profile for p in placements))
    _check_totals(model_id, wanted, f"state {_summary(p.profile for p in placements)}")
    mask = 0
    owner: dict[int, str] = {}
    for p, placed in zip(wanted, placements, strict=True):
        if placed.start not in p.starts:
            raise LayoutError(
                f"placement conflict: {p.name} cannot start at slot {placed.start} on "
                f"{model_id} (valid starts: {','.join(map(str, p.starts))})"
            )
        m = p.mask(placed.start)
        if mask & m:
            slot = (mask & m).bit_length() - 1
            raise LayoutError(
                f"placement conflict: {p.name}@{placed.start} overlaps {owner[slot]} "
                f"at memory slice {slot}"
            )
        mask |= m
        for slot in range(p.memory_slices):
            owner[placed.start + slot] = f"{p.name}@{placed.start}"


def _best_final(wanted: Sequence[Profile], current: Sequence[Instance]) -> list[int]:
    """Starts for ``wanted`` that keep the most busy, then the most current instances in place.

    Branch and bound over the placements of the desired layout (most constrained profiles
    first, equal profiles at increasing starts): a branch stops once even matching every
    remaining current instance could not beat the best found so far.
    """
    order = _search_order(wanted)
    here = {(i.profile, i.start): i.busy for i in current}
    total = (sum(i.busy for i in current), len(current))
    starts = [0] * len(wanted)
    best: list[int] | None = None
    best_score = (-1, -1)

    def search(k: int, mask: int, min_start: int, busy: int, kept: int) -> bool:
        nonlocal best, best_score
        if k == len(order):
            if (busy, kept) > best_score:
                best, best_score = list(starts), (busy, kept)
            return best_score == total  # nothing can do better: stop
        left = len(order) - k
        if (min(total[0], busy + left), min(total[1], kept + left)) <= best_score:
            return False
        p = wanted[order[k]]
        following_same = k + 1 < len(order) and wanted[order[k + 1]].name == p.name
        for start in p.starts:
            m = p.mask(start)
            if start < min_start or mask & m:
                continue
            starts[order[k]] = start
            match = here.get((p.name, start))
            if search(k + 1, mask | m, start + 1 if following_same else 0,
                      busy + (match is True), kept + (match is not None)):
                return True
        return False

    search(0, 0, 0, 0, 0)
    if best is None:  # unreachable: callers check that the layout fits
        raise AssertionError("desired layout fits but no placement found")
    return best


def plan(
    model_id: str,
    current: Sequence[Instance],
    desired: Sequence[str],
    policy: DisruptionPolicy = DisruptionPolicy.WAIT,
) -> Plan:
    """Minimal-disruption steps from ``current`` to the ``desired`` layout.

    Keeps the largest set of current instances (busy ones first) that can stay in a valid final
    placement; destroys the rest first, then creates the missing instances at explicit starts.
    Every intermediate state is a subset of the current or the final layout, hence valid.  A
    busy instance is never destroyed: with ``wait`` the plan holds no steps and names the busy
    instances it waits for; with ``refuse`` it raises :class:`DisruptionError`.
    """
    try:
        validate(model_id, current)
    except LayoutError as exc:
        raise LayoutError(f"current instances are invalid: {exc}") from None
    fit(model_id, desired)  # a desired layout that cannot exist at all: say why
    final_starts = _best_final(_resolve(model_id, desired), current)
    by_key = {(i.profile, i.start): n for n, i in enumerate(current)}
    final = tuple(sorted(
        (Placement(p.name, start, p.memory_slices)
         for p, start in zip(_resolve(model_id, desired), final_starts, strict=True)),
        key=lambda p: p.start,
    ))
    subset = {by_key[(p.profile, p.start)] for p in final if (p.profile, p.start) in by_key}
    kept = tuple(p for p in final if (p.profile, p.start) in by_key)
    created = [p for p in final if (p.profile, p.start) not in by_key]
    gone = [i for i in range(len(current)) if i not in subset]
    steps = tuple(
        [Step("destroy", current[i].profile, current[i].start)
         for i in sorted(gone, key=lambda i: current[i].start)]
        + [Step("create", p.profile, p.start) for p in created]
    )
    blocking = tuple(current[i] for i in gone if current[i].busy)
    if not blocking:
        return Plan(steps=steps, kept=kept, final=final)
    if policy is DisruptionPolicy.REFUSE:
        names = ", ".join(str(i) for i in blocking)
        raise DisruptionError(
            f"refusing to change the layout: busy instance(s) {names} would have to be destroyed"
        )
    return Plan(steps=(), kept=kept, final=final, waiting_for=blocking, pending_steps=steps)


def _enumerate(model_id: str, include_media_extensions: bool) -> list[tuple[str, ...]]:
    """Every non-empty feasible layout, grown one profile at a time.

    Feasibility is closed under removal, so a branch stops as soon as adding fails.
    """
    candidates = [p for p in profiles(model_id) if include_media_extensions
                  or not p.media_extensions]
    found: list[tuple[str, ...]] = []

    def grow(layout: list[Profile], first: int) -> None:
        for k in range(first, len(candidates)):
            trial = [*layout, candidates[k]]
            try:
                _check_totals(model_id, trial, "layout")
            except LayoutError:
                continue
            if _place(trial, 0) is None:
                continue
            found.append(tuple(sorted(p.name for p in trial)))
            grow(trial, k)

    grow([], 0)
    return sorted(found)


@cache
def _feasible(model_id: str, include_media_extensions: bool) -> tuple[tuple[str, ...], ...]:
    return tuple(_enumerate(model_id, include_media_extensions))


@cache
def _maximal(model_id: str, include_media_extensions: bool) -> tuple[tuple[str, ...], ...]:
    feasible = _feasible(model_id, include_media_extensions)
    as_set = set(feasible)
    names = sorted({n for layout in feasible for n in layout})
    return tuple(
        layout for layout in feasible
        if not any(tuple(sorted((*layout, n))) in as_set for n in names)
    )


def feasible_layouts(
    model_id: str, include_media_extensions: bool = False
) -> list[tuple[str, ...]]:
    """Every non-empty layout that fits the model, each a sorted tuple of names."""
    profiles(model_id)  # unknown model: raise before caching
    return list(_feasible(model_id, include_media_extensions))


def maximal_layouts(
    model_id: str, include_media_extensions: bool = False
) -> list[tuple[str, ...]]:
    """Every layout that fits and to which no further profile can be added."""
    profiles(model_id)
    return list(_maximal(model_id, include_media_extensions))
