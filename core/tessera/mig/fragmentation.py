"""Fragmentation of a fleet of MIG GPUs under a placement rule (pure): replay one sequence of
claims and releases with a rule such as :func:`tessera.mig.ondemand.choose` or the baseline
:func:`tessera.mig.ondemand.first_fit`, and count the claims that were refused although the
fleet had enough free slices in total.

Every claim asks one instance of a profile; the rule picks a GPU and start among those
where the instance can be added without moving any other, or refuses. Nothing is ever
re-placed, so a refusal with enough free slices is fragmentation: the free slices are
there but not as a run the profile may start on. The same events replayed with two rules
give figures that compare the rules alone.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tessera.mig.catalog import Profile, profile, slice_counts
from tessera.mig.ondemand import Choice, scored_profiles
from tessera.mig.planner import Instance, LayoutError, fit, validate


@dataclass(frozen=True)
class Claim:
    """A workload asks one instance of ``profile``."""

    profile: str


@dataclass(frozen=True)
class Release:
    """The workload of an earlier claim ends and its instance is destroyed."""

    claim: int
    """Which claim: its ordinal among the sequence's claims, from 0. Nothing happens if
    the rule had refused that claim."""


Event = Claim | Release

Policy = Callable[[str, Sequence[tuple[int, Sequence[Instance]]], Profile], Choice[int] | None]
"""A placement rule: model, GPUs (index, instances), profile -> where, or None."""


def random_events(model_id: str, count: int, seed: int,
                  release_share: float = 0.4) -> list[Event]:
    """``count`` events drawn from ``random.Random(seed)``, the same for the same arguments.

    Each event releases one of the claims still outstanding (with probability
    ``release_share``, when there is one) or claims a profile drawn uniformly from the
    model's profiles without ``+me`` variants.
    """
    if not 0.0 <= release_share < 1.0:
        raise ValueError(f"release_share must be in [0, 1), got {release_share}")
    rng = random.Random(seed)
    names = sorted(p.name for p in scored_profiles(model_id))
    events: list[Event] = []
    outstanding: list[int] = []
    claims = 0
    for _ in range(count):
        if outstanding and rng.random() < release_share:
            events.append(Release(outstanding.pop(rng.randrange(len(outstanding)))))
        else:
            events.append(Claim(rng.choice(names)))
            outstanding.append(claims)
            claims += 1
    return events


@dataclass(frozen=True)
class Outcome:
    """What a rule made of one sequence of events."""

    claims: int
    placed: int
    placed_slices: int
    """Memory slices of the placed instances, summed."""
    could_have_fit: int
    """Refused although the fleet's free memory slices and free compute slices, summed
    over its GPUs, would have held the instance."""
    one_gpu_repacked: int
    """Refused although one GPU could have held it had its instances been placed anew
    (a subset of ``could_have_fit``)."""

    @property
    def refused(self) -> int:
        return self.claims - self.placed


def simulate(model_id: str, n_gpus: int, events: Sequence[Event], policy: Policy) -> Outcome:
    """Replay ``events`` on ``n_gpus`` empty GPUs of ``model_id`` with ``policy``.

    A choice the planner's validation rejects raises ``ValueError``: a rule may refuse,
    never place wrongly.
    """
    total_memory, total_compute = slice_counts(model_id)
    gpus: list[list[Instance]] = [[] for _ in range(n_gpus)]
    live: dict[int, tuple[int, Instance]] = {}
    claims = placed = placed_slices = could_have_fit = repacked = 0
    for event in events:
        if isinstance(event, Release):
            if event.claim in live:
                gpu, instance = live.pop(event.claim)
                gpus[gpu].remove(instance)
            continue
        number, claims = claims, claims + 1
        p = profile(model_id, event.profile)
        choice = policy(model_id, [(i, tuple(g)) for i, g in enumerate(gpus)], p)
        if choice is not None:
            instance = Instance(p.name, choice.start)
            try:
                validate(model_id, [*gpus[choice.gpu], instance])
            except (LayoutError, IndexError) as exc:
                raise ValueError(f"policy placed {instance} on GPU {choice.gpu}: {exc}") from None
            gpus[choice.gpu].append(instance)
            live[number] = (choice.gpu, instance)
            placed += 1
            placed_slices += p.memory_slices
            continue
        used = [profile(model_id, i.profile) for g in gpus for i in g]
        free_memory = n_gpus * total_memory - sum(u.memory_slices for u in used)
        free_compute = n_gpus * total_compute - sum(u.compute_slices for u in used)
        if free_memory >= p.memory_slices and free_compute >= p.compute_slices:
            could_have_fit += 1
            if any(_fits_repacked(model_id, g, p) for g in gpus):
                repacked += 1
    return Outcome(claims=claims, placed=placed, placed_slices=placed_slices,
                   could_have_fit=could_have_fit, one_gpu_repacked=repacked)


def _fits_repacked(model_id: str, instances: Sequence[Instance], p: Profile) -> bool:
    try:
        fit(model_id, [*(i.profile for i in instances), p.name])
    except LayoutError:
        return False
    return True
