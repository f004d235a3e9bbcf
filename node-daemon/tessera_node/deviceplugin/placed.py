"""The units tessera's scheduler placed a pod's containers on (pure): the
``tessera.dev/placement`` record (:mod:`tessera.placement.record`, parsed into
``PodView.placement``) as the device plugin honours it.

* ``GetPreferredAllocation`` for a container with a record offers a share of exactly each
  recorded unit (:func:`offer`);
* ``Allocate`` and the confirmation accept a container with a record only on its recorded
  units, as a set (:func:`check`); a record that cannot be read never matches (fail closed);
* recorded placements of pods not allocated yet hold their budgets on their units for pods
  without a record (:func:`reserved`): the extender reserved them already.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from tessera.api.budget import BudgetAnnotationError
from tessera.api.names import VGPU
from tessera_node.deviceplugin import budgets
from tessera_node.deviceplugin.devices import unit_of
from tessera_node.deviceplugin.matcher import ContainerRef, PodView


def recorded(pod: PodView, container: str, resource: str) -> tuple[str, ...] | None:
    """The units recorded for the container's ``resource``; None when the pod has no record
    (or one that cannot be read: :func:`check` says why); () when its record names none."""
    if pod.placement is None:
        return None
    return pod.placement.of(container, resource)


def check(pod: PodView, container: str, resource: str, units: Iterable[str]) -> str | None:
    """None when the container may be given these units (its pod has no record, or the
    units are its recorded ones), else why not."""
    if pod.placement_error is not None:
        return pod.placement_error
    want = recorded(pod, container, resource)
    got = sorted(set(units))
    if want is None or set(want) == set(got):
        return None
    return (f"devices on {', '.join(got)} are not the units tessera placed pod "
            f"{pod.namespace}/{pod.name} container {container} on "
            f"({', '.join(want) or 'none recorded'})")


def offer(units: Sequence[str], available: Sequence[str], must_include: Sequence[str],
          size: int) -> list[str]:
    """GetPreferredAllocation for a placed container: one share of each recorded unit (the
    ``must_include`` one where it is on that unit, else the lowest free one); fewer when a
    recorded unit has no free share (the kubelet fills in, Allocate then refuses)."""
    must = {unit_of(d): d for d in must_include}
    if not set(must) <= set(units):
        must = {}  # must-include elsewhere: not compatible with the record
    out = []
    for u in units[:size]:
        if u in must:
            out.append(must[u])
            continue
        free = sorted((d for d in available if unit_of(d) == u), key=_share_number)
        if free:
            out.append(free[0])
    return out


def _share_number(device_id: str) -> tuple[int, str]:
    k = device_id.partition("::")[2]
    return (int(k) if k.isdigit() else -1, device_id)


def reserved(pods: Iterable[PodView], node: str, resource: str, taken: frozenset[ContainerRef],
             unit_memory: Mapping[str, int | None]) -> dict[str, list[int]]:
    """Memory per unit that recorded placements of containers not allocated yet (not
    ``taken``, not started) hold: bound here, Pending, not terminating."""
    out: dict[str, list[int]] = {}
    for p in pods:
        if (p.placement is None or p.node_name != node or p.terminating
                or p.phase != "Pending"):
            continue
        for c, by_res in p.placement.containers.items():
            units = by_res.get(resource)
            if not units or c in p.started or ContainerRef(p.namespace, p.name, c) in taken:
                continue
            try:
                b = budgets.container_budget(p.annotations, c)
            except BudgetAnnotationError:
                continue
            for u in units:
                want = budgets.memory_wanted(b, resource != VGPU, unit_memory.get(u))
                out.setdefault(u, []).append(want or 0)
    return out
