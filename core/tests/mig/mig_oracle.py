"""Brute-force MIG oracle for the planner tests, written from docs/mig.md §1.3/§1.4 alone.

It shares nothing with ``tessera.mig``: its own geometry table, its own name table, and
slot-by-slot placement (walk the memory slices left to right; at each slice either leave it
empty or start an instance there).  Every set of non-overlapping placements is visited once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from functools import cache

# kind -> (compute slices, memory slices, valid starts, max count)
Geometry = dict[str, tuple[int, int, tuple[int, ...], int]]

EIGHT_SLICE: Geometry = {
    "1g": (1, 1, (0, 1, 2, 3, 4, 5, 6), 7),
    "1g+me": (1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    "1g-double": (1, 2, (0, 2, 4, 6), 4),
    "2g": (2, 2, (0, 2, 4), 3),
    "3g": (3, 4, (0, 4), 2),
    "4g": (4, 4, (0,), 1),
    "7g": (7, 8, (0,), 1),
}
FOUR_SLICE: Geometry = {
    "1g": (1, 1, (0, 1, 2, 3), 4),
    "1g+me": (1, 1, (0, 1, 2, 3), 1),
    "2g": (2, 2, (0, 2), 2),
    "2g+me": (2, 2, (0, 2), 1),
    "4g": (4, 4, (0,), 1),
}


def _eight(g1: str, g2: str, g4: str, g8: str) -> dict[str, str]:
    return {
        f"1g.{g1}gb": "1g", f"1g.{g1}gb+me": "1g+me", f"1g.{g2}gb": "1g-double",
        f"2g.{g2}gb": "2g", f"3g.{g4}gb": "3g", f"4g.{g4}gb": "4g", f"7g.{g8}gb": "7g",
    }


# Profile names per model, from the §1.3 tables.
NAMES: dict[str, dict[str, str]] = {
    "A100-40GB": _eight("5", "10", "20", "40"),
    "A100-80GB": _eight("10", "20", "40", "80"),
    "H100-80GB": _eight("10", "20", "40", "80"),
    "H100-94GB": _eight("12", "24", "47", "94"),
    "H100-96GB": _eight("12", "24", "48", "96"),
    "H200-141GB": _eight("18", "35", "71", "141"),
    "B200-180GB": _eight("23", "45", "90", "180"),
    "A30-24GB": {
        "1g.6gb": "1g", "1g.6gb+me": "1g+me", "2g.12gb": "2g", "2g.12gb+me": "2g+me",
        "4g.24gb": "4g",
    },
}


def geometry(model: str) -> tuple[int, int, dict[str, tuple[int, int, tuple[int, ...], int]]]:
    """(memory slices, compute slices, name -> (compute, size, starts, max)) of a model."""
    if model == "A30-24GB":
        return 4, 4, {n: FOUR_SLICE[k] for n, k in NAMES[model].items()}
    return 8, 7, {n: EIGHT_SLICE[k] for n, k in NAMES[model].items()}


def is_valid_state(model: str, instances: Iterable[tuple[str, int]]) -> bool:
    """Whether these (profile, start) instances can coexist on one GPU."""
    slots, compute_total, table = geometry(model)
    occupied = [False] * slots
    counts: Counter[str] = Counter()
    compute = 0
    for name, start in instances:
        if name not in table:
            return False
        c, size, starts, limit = table[name]
        if start not in starts:
            return False
        for slot in range(start, start + size):
            if slot >= slots or occupied[slot]:
                return False
            occupied[slot] = True
        counts[name] += 1
        compute += c
        if counts[name] > limit or compute > compute_total:
            return False
    # every +me instance takes the GPU's one OFA engine: at most one of them
    return sum(n for name, n in counts.items() if "+me" in name) <= 1


@cache
def all_states(model: str, with_me: bool) -> tuple[frozenset[tuple[str, int]], ...]:
    """Every valid set of placed instances (including the empty one), slot by slot."""
    slots, compute_total, table = geometry(model)
    names = [n for n in table if with_me or "+me" not in n]
    out: list[frozenset[tuple[str, int]]] = []

    def walk(slot: int, placed: list[tuple[str, int]], counts: Counter[str], compute: int) -> None:
        if slot >= slots:
            out.append(frozenset(placed))
            return
        walk(slot + 1, placed, counts, compute)  # leave this slice empty
        media = sum(n for name, n in counts.items() if "+me" in name)
        for name in names:
            c, size, starts, limit = table[name]
            if (slot in starts and slot + size <= slots and counts[name] < limit
                    and compute + c <= compute_total and not ("+me" in name and media)):
                counts[name] += 1
                placed.append((name, slot))
                walk(slot + size, placed, counts, compute + c)
                placed.pop()
                counts[name] -= 1

    walk(0, [], Counter(), 0)
    return tuple(out)


def layout_of(state: Iterable[tuple[str, int]]) -> tuple[str, ...]:
    return tuple(sorted(name for name, _ in state))


@cache
def feasible(model: str, with_me: bool) -> frozenset[tuple[str, ...]]:
    """Every non-empty multiset of profiles that has a valid placement."""
    return frozenset(layout_of(s) for s in all_states(model, with_me) if s)


@cache
def maximal(model: str, with_me: bool) -> frozenset[tuple[str, ...]]:
    """Feasible multisets that no single further profile can join."""
    ok = feasible(model, with_me)
    names = [n for n in geometry(model)[2] if with_me or "+me" not in n]
    return frozenset(
        layout for layout in ok
        if not any(tuple(sorted((*layout, n))) in ok for n in names)
    )


def min_destroys(
    model: str,
    current: Iterable[tuple[str, int]],
    desired: Iterable[str],
    must_keep: Iterable[tuple[str, int]] = (),
) -> int | None:
    """Fewest current instances any valid final placement of ``desired`` must drop.

    ``must_keep`` instances (the busy ones) have to stay; None if that is impossible.
    """
    cur = set(current)
    keep = set(must_keep)
    want = tuple(sorted(desired))
    best: int | None = None
    for state in all_states(model, True):
        if layout_of(state) != want or not keep <= state:
            continue
        dropped = len(cur - state)
        best = dropped if best is None else min(best, dropped)
    return best
