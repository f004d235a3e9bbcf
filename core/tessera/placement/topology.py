"""Which units of a node sit together: GPUs joined by NVLink, GPUs on one NUMA node.

A unit counts as its GPU (a whole GPU's unit, or a MIG instance on it): units on one GPU
are always together. Two GPUs are joined when either lists the other among its NVLink
peers (the inventory's ``nvlinkPeers``); a set of GPUs is an NVLink group when every two
of them are joined. A GPU whose NUMA node is unknown is on no NUMA node.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from tessera.placement.units import Unit


def _joined(units: Sequence[Unit]) -> dict[str, set[str]]:
    gpus = {u.gpu_uuid for u in units}
    peers: dict[str, set[str]] = {g: set() for g in gpus}
    for u in units:
        for p in u.nvlink_peers:
            if p in gpus and p != u.gpu_uuid:
                peers[u.gpu_uuid].add(p)
                peers[p].add(u.gpu_uuid)
    return peers


def nvlink_groups(units: Sequence[Unit]) -> list[list[Unit]]:
    """The units of each maximal NVLink group of GPUs (every subset of a group is one too),
    in a deterministic order."""
    peers = _joined(units)
    cliques: list[frozenset[str]] = []

    def extend(clique: frozenset[str], candidates: set[str], excluded: set[str]) -> None:
        if not candidates and not excluded:
            cliques.append(clique)
            return
        for g in sorted(candidates):
            extend(clique | {g}, candidates & peers[g], excluded & peers[g])
            candidates = candidates - {g}
            excluded = excluded | {g}

    extend(frozenset(), set(peers), set())
    return [[u for u in units if u.gpu_uuid in c] for c in sorted(cliques, key=sorted)]


def numa_groups(units: Sequence[Unit]) -> list[list[Unit]]:
    """The units on each known NUMA node, by node number."""
    by_node: dict[int, list[Unit]] = defaultdict(list)
    for u in units:
        if u.numa_node is not None:
            by_node[u.numa_node].append(u)
    return [by_node[n] for n in sorted(by_node)]
