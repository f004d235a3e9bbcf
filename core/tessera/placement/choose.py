"""One pod on one node: which units each of its containers uses, or why none fit.

Rules of :func:`place` (``used`` is what other pods hold, :func:`tessera.placement.usage.usage`;
it must not include the pod being placed):

- **Eligible units.** A demand of resource R may use a unit advertised as R, healthy, of a
  model the policy allows (``gpu-models``, ``gpu-models-exclude``) on a GPU it does not
  exclude (``gpu-uuids-exclude``). A container of count k gets k *different* units.
- **Shares** (``tessera.dev/vgpu``). Each container takes one share of each of its units,
  with its per-share memory and cores. A unit holds a container when, with it added, the
  unit's shares, memory (MiB) and cores (Σ ≤ 100) stay within what it has. Containers of
  one pod may share a unit; what the pod's other containers already took there counts,
  combined as :mod:`tessera.placement.usage` says (init containers run alone).
- **Whole MIG instances** (``tessera.dev/mig-<profile>``). A container takes instances no
  other pod holds, one container per instance at a time (an init container may reuse an
  instance of its own pod's app containers). Among free instances the choice is the one
  with the least fragmentation (:mod:`tessera.placement.fragmentation`), whatever the
  GPU policy.
- **Order.** App containers and sidecars first, largest per-unit memory first, then regular
  init containers in declaration order, each preferring units its pod already holds (the
  kubelet hands an init container's devices on to the app containers). Containers are
  placed one after another, never re-paired: a pod that would fit only with another
  pairing of containers to units is refused.
- **GPU policy** (shares). ``binpack``: the unit left with the least free memory, then the
  fewest free shares, then the UUID; ``spread``: the most free memory, then the most free
  shares, then the UUID.
- **Topology** (a container of k > 1 units). ``prefer``: units whose GPUs are all joined by
  NVLink if such a set fits, else units on one NUMA node, else any; ``nvlink``: only an
  NVLink set (else refused); ``none``: the GPU policy alone. Units on one GPU (MIG
  instances) are always together. Among several groups that fit, the one whose best k
  units rank best under the GPU policy (whole instances: least fragmentation) wins.
- **Score** (0..10, for the node by the node policy). The node's fullness after placement:
  memory held on its shared units plus the memory of held whole instances, over all its
  units' memory, rounded to tenths. ``binpack`` scores it as is, ``spread`` as 10 minus it.
- **Refusal.** :class:`NoFit` names the first container that does not fit and why in one
  line (e.g. ``largest free unit 9984 MiB < 12000 MiB``: the most free memory of any
  eligible unit vs the asked memory per share); ``unresolvable`` when it would not fit on
  the node even with no other pod (preemption cannot help).
- **Determinism.** The same input gives the same output.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tessera.placement.demand import Demand
from tessera.placement.fragmentation import instance_key, node_usefulness
from tessera.placement.policy import Policy
from tessera.placement.record import PlacementRecord
from tessera.placement.topology import numa_groups, nvlink_groups
from tessera.placement.units import Unit
from tessera.placement.usage import EMPTY, Assignment, UnitUsage, add, pod_usage

MAX_CORES = 100.0
_EPSILON = 1e-9


@dataclass(frozen=True)
class Fit:
    record: PlacementRecord
    score: int
    """0..10 for the node by the node policy (higher: better)."""


@dataclass(frozen=True)
class NoFit:
    reason: str
    """One short line; the caller prefixes the node name."""
    unresolvable: bool
    """Even with every other pod removed it could not fit (preemption cannot help)."""


@dataclass(frozen=True)
class _Option:
    unit: Unit
    total: UnitUsage
    """Everything on the unit with the container added."""
    own: bool
    """The pod already holds the unit."""


class _Placement:
    """The pod's containers placed so far (declaration index -> units)."""

    def __init__(self, demands: Sequence[Demand]) -> None:
        self.demands = demands
        self.taken: dict[int, tuple[str, ...]] = {}

    def assignments(self, extra: tuple[int, tuple[str, ...]] | None = None) -> list[Assignment]:
        taken = dict(self.taken)
        if extra is not None:
            taken[extra[0]] = extra[1]
        return [(self.demands[i], taken[i]) for i in sorted(taken)]

    def units(self) -> frozenset[str]:
        return frozenset(u for us in self.taken.values() for u in us)


def _fits(unit: Unit, total: UnitUsage, others: UnitUsage) -> bool:
    if not unit.shared:
        return others.free and total.shares <= 1
    return (total.shares <= unit.shares and total.memory_mib <= unit.memory_mib
            and total.cores <= MAX_CORES + _EPSILON)


def _kind(demand: Demand) -> str:
    return "unit" if demand.resource.endswith("/vgpu") else "instance"


def _eligible(demand: Demand, units: Sequence[Unit], policy: Policy) -> list[Unit] | str:
    res, kind = demand.resource, _kind(demand)
    pool = [u for u in units if u.resource == res]
    if not pool:
        return f"no {res} {kind} on the node"
    pool = [u for u in pool if u.healthy]
    if not pool:
        return f"no healthy {res} {kind}"
    if policy.models:
        pool = [u for u in pool if u.model in policy.models]
        if not pool:
            return f"no {' or '.join(sorted(policy.models))} GPU (gpu-models)"
    models = sorted({u.model for u in pool})
    pool = [u for u in pool if u.model not in policy.exclude_models]
    if not pool:
        return f"no GPU but {', '.join(models)} (gpu-models-exclude)"
    pool = [u for u in pool if u.gpu_uuid not in policy.exclude_gpus]
    if not pool:
        return f"every {res} {kind} is on an excluded GPU (gpu-uuids-exclude)"
    if len(pool) < demand.count:
        return f"{demand.count} {res} {kind}s needed, the node has {len(pool)}"
    return pool


@dataclass(frozen=True)
class _Room:
    """How much a container could still take on a unit, its pod's other containers counted."""

    memory_mib: int
    cores: float
    share: bool


_BIG = 1 << 40


def _room(unit: Unit, placement: _Placement, index: int, others: UnitUsage) -> _Room:
    """The pod's use is max(A, B + m) in the container's own amount m (usage rule), so the
    room is what is left above B, provided the rest (m = 0) fits at all."""
    demand = placement.demands[index]

    def with_amount(amount: int) -> UnitUsage:
        taken = {**placement.taken, index: (unit.uuid,)}
        trial = replace(demand, memory_mib=amount, cores=float(amount))
        return pod_usage(unit, [(trial if i == index else placement.demands[i], taken[i])
                                for i in sorted(taken)])

    zero, big = with_amount(0), with_amount(_BIG)
    memory = (unit.memory_mib - others.memory_mib - (big.memory_mib - _BIG)
              if others.memory_mib + zero.memory_mib <= unit.memory_mib else 0)
    cores = (MAX_CORES - others.cores - (big.cores - _BIG)
             if others.cores + zero.cores <= MAX_CORES + _EPSILON else 0.0)
    return _Room(max(0, memory), max(0.0, cores), others.shares + zero.shares <= unit.shares)


def _short_of(demand: Demand, pool: Sequence[Unit], options: Sequence[_Option],
              used: Mapping[str, UnitUsage], rooms: Sequence[_Room]) -> str:
    """Why fewer than ``demand.count`` units of ``pool`` hold the container."""
    res, k = demand.resource, demand.count
    if _kind(demand) == "instance":
        in_use = sum(1 for u in pool if not used.get(u.uuid, EMPTY).free)
        if k == 1:
            return f"no {res} instance free ({in_use} of {len(pool)} in use)"
        return (f"{k} {res} instances needed, {len(options)} free "
                f"({in_use} of {len(pool)} in use)")
    memory_ok = [r for r in rooms if r.memory_mib >= demand.memory_mib]
    if len(memory_ok) < k:
        largest = max(r.memory_mib for r in rooms)
        if largest < demand.memory_mib:
            return f"largest free unit {largest} MiB < {demand.memory_mib} MiB"
        return f"{k} units with {demand.memory_mib} MiB free needed, {len(memory_ok)} have it"
    share_ok = [r for r in memory_ok if r.share]
    if len(share_ok) < k:
        return (f"{k} {res} units with a free share and {demand.memory_mib} MiB needed, "
                f"{len(share_ok)} have them")
    largest_cores = max(r.cores for r in share_ok)
    if largest_cores + _EPSILON < demand.cores:
        return f"largest free cores {largest_cores:g}% < {demand.cores:g}%"
    return (f"{k} {res} units with {demand.memory_mib} MiB, a share and {demand.cores:g}% "
            f"cores free needed, {len(options)} have them")


def _shared_key(option: _Option, policy: Policy, prefer_own: bool) -> tuple[Any, ...]:
    u, t = option.unit, option.total
    free_memory, free_shares = u.memory_mib - t.memory_mib, u.shares - t.shares
    own = 0 if (prefer_own and option.own) else 1
    if policy.gpu == "spread":
        return (own, -free_memory, -free_shares, u.uuid)
    return (own, free_memory, free_shares, u.uuid)




def _pick(demand: Demand, group: Sequence[_Option], units: Sequence[Unit], held: frozenset[str],
          policy: Policy) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    """The best ``demand.count`` units of ``group`` and how good they are (smaller: better)."""
    if _kind(demand) == "unit":
        ranked = sorted(group, key=lambda o: _shared_key(o, policy, demand.init))
        chosen = ranked[:demand.count]
        return (tuple(_shared_key(o, policy, demand.init) for o in chosen),
                tuple(o.unit.uuid for o in chosen))
    left = list(group)
    picked: list[_Option] = []
    now = held
    for _ in range(demand.count):
        best = min(left, key=lambda o: (0 if demand.init and o.own else 1,
                                        instance_key(o.unit, units, now)))
        picked.append(best)
        left.remove(best)
        now = now | {best.unit.uuid}
    quality = (tuple(sorted(0 if demand.init and o.own else 1 for o in picked)),
               tuple(-x for x in node_usefulness(units, now)),
               tuple(sorted(o.unit.uuid for o in picked)))
    return quality, tuple(o.unit.uuid for o in picked)


def _groups(demand: Demand, options: Sequence[_Option],
            policy: Policy) -> list[list[_Option]] | str:
    """The sets of options a container may take its units from (topology rule)."""
    k = demand.count
    if k == 1 or policy.topology == "none":
        return [list(options)]
    by_uuid = {o.unit.uuid: o for o in options}
    units = [o.unit for o in options]
    linked = [[by_uuid[u.uuid] for u in g] for g in nvlink_groups(units)]
    fitting = [g for g in linked if len(g) >= k]
    if fitting:
        return fitting
    if policy.topology == "nvlink":
        largest = max((len(g) for g in linked), default=0)
        return f"{k} GPUs joined by NVLink needed, largest NVLink group free: {largest}"
    numa = [[by_uuid[u.uuid] for u in g] for g in numa_groups(units)]
    return [g for g in numa if len(g) >= k] or [list(options)]


def _place_one(index: int, placement: _Placement, units: Sequence[Unit],
               used: Mapping[str, UnitUsage], policy: Policy) -> tuple[str, ...] | str:
    demand = placement.demands[index]
    pool = _eligible(demand, units, policy)
    if isinstance(pool, str):
        return pool
    mine = placement.units()
    options: list[_Option] = []
    for u in pool:
        after = pod_usage(u, placement.assignments((index, (u.uuid,))))
        others = used.get(u.uuid, EMPTY)
        total = add(others, after)
        if _fits(u, total, others):
            options.append(_Option(u, total, u.uuid in mine))
    if len(options) < demand.count:
        rooms = [_room(u, placement, index, used.get(u.uuid, EMPTY)) for u in pool]
        return _short_of(demand, pool, options, used, rooms)
    groups = _groups(demand, options, policy)
    if isinstance(groups, str):
        return groups
    held = frozenset(uuid for uuid, uu in used.items() if not uu.free) | mine
    return min(_pick(demand, g, units, held, policy) for g in groups)[1]


def _score(units: Sequence[Unit], used: Mapping[str, UnitUsage],
           assignments: Sequence[Assignment], policy: Policy) -> int:
    total = sum(u.memory_mib for u in units)
    filled = 0
    for u in units:
        both = add(used.get(u.uuid, EMPTY), pod_usage(u, assignments))
        if u.shared:
            filled += min(u.memory_mib, both.memory_mib)
        elif not both.free:
            filled += u.memory_mib
    fullness = (20 * filled + total) // (2 * total) if total else 0
    return fullness if policy.node == "binpack" else 10 - fullness


def _order(demands: Sequence[Demand]) -> list[int]:
    app = sorted((i for i, d in enumerate(demands) if not d.init),
                 key=lambda i: (-demands[i].memory_mib, -demands[i].cores, i))
    return app + [i for i, d in enumerate(demands) if d.init]


def _place(node: str, demands: Sequence[Demand], units: Sequence[Unit],
           used: Mapping[str, UnitUsage], policy: Policy) -> Fit | str:
    placement = _Placement(demands)
    for index in _order(demands):
        got = _place_one(index, placement, units, used, policy)
        if isinstance(got, str):
            d = demands[index]
            return f"container {d.container}: {got}" if len(demands) > 1 else got
        placement.taken[index] = got
    containers: dict[str, dict[str, tuple[str, ...]]] = {}
    for index, uuids in sorted(placement.taken.items()):
        d = demands[index]
        containers.setdefault(d.container, {})[d.resource] = uuids
    return Fit(record=PlacementRecord(node=node, containers=containers),
               score=_score(units, used, placement.assignments(), policy))


def place(node: str, demands: Sequence[Demand], units: Sequence[Unit],
          used: Mapping[str, UnitUsage], policy: Policy) -> Fit | NoFit:
    """The units for each of the pod's ``demands`` on ``node``, or why it does not fit."""
    outcome = _place(node, demands, units, used, policy)
    if isinstance(outcome, Fit):
        return outcome
    unresolvable = True
    if any(u != EMPTY for u in used.values()):
        unresolvable = not isinstance(_place(node, demands, units, {}, policy), Fit)
    return NoFit(reason=outcome, unresolvable=unresolvable)
