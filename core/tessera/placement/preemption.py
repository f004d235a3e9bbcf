"""Which pods to remove so that a pod fits a node: the fewest of strictly lower priority.

:func:`victims` considers only pods on the node with a priority strictly lower than the
incoming pod's. Among sets of equal size it prefers the one whose highest priority is
lowest, then the next highest, and so on; then the set whose sorted pod keys come first
(later-created pods cannot be told apart from keys alone, so keys break ties).

The search is exhaustive when the node has at most :data:`EXHAUSTIVE_CANDIDATES`
candidates (at most 2^12 subsets, smallest first, stopping at the first size that
works): the result is then minimal. With more candidates it is greedy: remove candidates in
preference order (lowest priority first, then key) until the pod fits, then put back every
victim the pod does not need, most important first; the result is then a working set from
which no single pod can be spared, not necessarily the smallest.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

from tessera.placement.choose import Fit, place
from tessera.placement.demand import Demand
from tessera.placement.policy import Policy
from tessera.placement.units import Unit
from tessera.placement.usage import Placed, usage

EXHAUSTIVE_CANDIDATES = 12


def _preference(pods: Sequence[Placed]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Smaller is better among sets of one size."""
    return (tuple(sorted((p.priority for p in pods), reverse=True)),
            tuple(sorted(p.key for p in pods)))


def victims(node: str, priority: int, demands: Sequence[Demand], units: Sequence[Unit],
            placed_on_node: Sequence[Placed], policy: Policy) -> list[Placed] | None:
    """The fewest lower-priority pods whose removal lets the pod fit; [] when it fits now;
    None when removing every lower-priority pod is not enough."""
    candidates = [i for i, p in enumerate(placed_on_node) if p.priority < priority]

    def fits_without(removed: frozenset[int]) -> bool:
        kept = [p for i, p in enumerate(placed_on_node) if i not in removed]
        return isinstance(place(node, demands, units, usage(units, kept), policy), Fit)

    if not fits_without(frozenset(candidates)):
        return None
    if len(candidates) <= EXHAUSTIVE_CANDIDATES:
        for size in range(len(candidates) + 1):
            working = [c for c in combinations(candidates, size) if fits_without(frozenset(c))]
            if working:
                best = min(working, key=lambda c: _preference([placed_on_node[i] for i in c]))
                return sorted((placed_on_node[i] for i in best), key=lambda p: p.key)
    order = sorted(candidates, key=lambda i: (placed_on_node[i].priority, placed_on_node[i].key))
    removed: list[int] = []
    for i in order:
        if fits_without(frozenset(removed)):
            break
        removed.append(i)
    for i in reversed(list(removed)):
        trial = frozenset(removed) - {i}
        if fits_without(trial):
            removed.remove(i)
    return sorted((placed_on_node[i] for i in removed), key=lambda p: p.key)
