"""Allocations made but not confirmed yet (pure): which candidate each is tentatively for,
and the memory it holds meanwhile.

The kubelet admits pods one at a time, in the order its pod watch shows them
(:func:`~.matcher.admission_order`), and for each container asks GetPreferredAllocation,
then Allocate. So the container being allocated is the first candidate without an
allocation (:func:`next_up`), and an Allocate is tentatively for the first candidate it
fits, counting the allocations not confirmed yet (:func:`owner`). Its budget counts on its
units until PodResources confirms which container holds them (then the ready budget
counts), or the allocation is forgotten; an unconfirmed allocation whose every candidate
pod has gone or ended no longer counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from tessera_node.deviceplugin.matcher import ENDED, ContainerRef, PodView


@dataclass(frozen=True)
class Tentative:
    refs: tuple[ContainerRef, ...]
    """The container the allocation is tentatively for, then those it was for before (the
    same device IDs allocated again: an app container reusing an init container's)."""
    units: tuple[str, ...]
    memory: int | None
    """Bytes budgeted on each unit; None: the whole unit."""


def taken(tentative: Mapping[str, Tentative]) -> frozenset[ContainerRef]:
    """Containers with an allocation not confirmed yet."""
    return frozenset(r for t in tentative.values() for r in t.refs)


def next_up(cands: Sequence[tuple[PodView, str]], taken: frozenset[ContainerRef]
            ) -> tuple[PodView, str] | None:
    """The container the kubelet is allocating now: the first candidate (admission order)
    without an allocation."""
    return next(((p, c) for p, c in cands
                 if ContainerRef(p.namespace, p.name, c) not in taken), None)


def owner(matches: Sequence[tuple[PodView, str]], taken: frozenset[ContainerRef],
          fits_with_pending: Callable[[PodView, str], bool]) -> tuple[PodView, str]:
    """Which of the candidates an Allocate's devices fit (``matches``, admission order,
    not empty) it is tentatively for: the first without an allocation that fits beside the
    unconfirmed ones too, else the first without an allocation, else the first."""
    free = [(p, c) for p, c in matches if ContainerRef(p.namespace, p.name, c) not in taken]
    return next((pc for pc in free if fits_with_pending(*pc)), free[0] if free else matches[0])


def held(tentative: Mapping[str, Tentative], pods: Iterable[PodView],
         unit_memory: Mapping[str, int | None], skip: str | None = None
         ) -> dict[str, list[int]]:
    """Memory per unit of the unconfirmed allocations (but ``skip``) whose candidate pods
    have not all gone or ended."""
    alive = {(p.namespace, p.name) for p in pods if p.phase not in ENDED}
    out: dict[str, list[int]] = {}
    for key, t in tentative.items():
        if key == skip or not any((r.namespace, r.pod) in alive for r in t.refs):
            continue
        for u in t.units:
            out.setdefault(u, []).append(t.memory if t.memory is not None
                                         else unit_memory.get(u) or 0)
    return out


def merged(*helds: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for h in helds:
        for u, values in h.items():
            out.setdefault(u, []).extend(values)
    return out
