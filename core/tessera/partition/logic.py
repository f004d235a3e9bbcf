"""Which GPUs a GPUPartition gets, and what its status and conditions say about it.

Claims: a GPU selected by several partitions belongs to the oldest (creationTimestamp, then
name); every later one loses that GPU and reports it as a conflict.  The rule is a pure
function of the partitions, so a node daemon computes exactly the same owner as the operator
(:func:`resolve`) without waiting for the operator's status.

Readiness: a partition is Ready when it selects at least one node, every selected node
reports phase Ready for the current generation, and nothing is degraded.  It is Progressing
while any selected node has no report, or reports Pending/Applying/WaitingForIdle, or reports
an older generation.  It is Degraded, naming the nodes and reasons, for GPUs lost to an older
partition, GPUs whose model cannot hold the layout, unreadable node inventories, and nodes
that report Failed.

Reports come from the node daemons' ``tessera.dev/partition-status`` annotations on their
Nodes (:mod:`tessera.api.node_report`); the operator alone writes the partition's status,
``status.nodes`` included: the reports of the selected nodes, nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache

from tessera.api.conditions import DEGRADED, PROGRESSING, READY, Condition, set_condition
from tessera.api.inventory import NodeInventory
from tessera.api.names import LABEL_GPU_PRODUCT
from tessera.api.partition import (
    GPUPartitionSpec,
    GPUPartitionStatus,
    Layout,
    NodePartitionStatus,
    OnDemand,
    layout_summary,
)
from tessera.mig import catalog, planner
from tessera.mig.catalog import UnknownProfileError
from tessera.models import MODELS, UnknownModelError, get_model

MAX_NAMES = 8
"""Nodes named in one condition message before '… and N more' (messages stay readable)."""
NODE_DETAIL_BUDGET = 256 * 1024
"""Bytes of node reports copied with their GPU detail into one partition's status."""


@dataclass(frozen=True)
class PartitionView:
    """What resolution needs from one GPUPartition object."""

    name: str
    spec: GPUPartitionSpec
    generation: int = 1
    created: str = ""
    """metadata.creationTimestamp (RFC 3339 sorts as text)."""
    nodes: Mapping[str, NodePartitionStatus] = field(default_factory=dict)
    """The daemons' reports for this partition, by node (any node, selected or not)."""


@dataclass(frozen=True)
class Claim:
    node: str
    index: int
    model: str


@dataclass(frozen=True)
class NodeProblem:
    """Why one node (or one of its GPUs) does not follow a partition."""

    node: str
    reason: str
    """CamelCase: GPUClaimed, LayoutDoesNotFit, InventoryUnreadable, NodeFailed."""
    message: str


@dataclass
class Resolution:
    """One partition's share of the cluster, before the daemons' reports are looked at."""

    selected: list[str] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    problems: list[NodeProblem] = field(default_factory=list)

    def claimed_nodes(self) -> list[str]:
        return sorted({c.node for c in self.claims})


def claim_order(p: PartitionView) -> tuple[str, str]:
    """Older partitions win contested GPUs; the name breaks ties between equal timestamps."""
    return (p.created, p.name)


def _layout_names(layout: Layout) -> tuple[str, ...]:
    if layout.mig_mode == "OnDemand":
        bounds = layout.on_demand
        return tuple(bounds.profiles) if bounds is not None and bounds.profiles else ()
    return tuple(sorted(layout.profile_names()))


def _needs_mig(mig_mode: str, model_id: str) -> str:
    return (f"migMode {mig_mode} needs MIG; {model_id} has none: select MIG-capable GPUs or "
            f"use migMode Disabled")


def _own_profiles(model_id: str) -> list[str]:
    return [p.name for p in catalog.profiles(model_id)]


@lru_cache(maxsize=4096)
def _fit_error(model_id: str, mig_mode: str, names: tuple[str, ...]) -> str | None:
    """``names``: the declared layout (Enabled), or the onDemand.profiles bound (OnDemand;
    empty when every profile of the model may be created)."""
    if mig_mode == "Disabled":
        return None
    if not get_model(model_id).mig_capable:
        return _needs_mig(mig_mode, model_id)
    if mig_mode == "OnDemand":
        # nothing is declared, so any MIG GPU holds it; only a bound that leaves this model
        # no profile to create makes its GPUs useless to the partition
        own = _own_profiles(model_id)
        if names and not set(names) & set(own):
            return (f"none of onDemand.profiles ({', '.join(names)}) is a MIG profile of "
                    f"{model_id}; its profiles: {', '.join(own)}")
        return None
    try:
        planner.fit(model_id, list(names))
    except (planner.LayoutError, UnknownProfileError) as exc:
        return str(exc)
    return None


def layout_problem(model_id: str, layout: Layout) -> str | None:
    """Why a GPU of ``model_id`` cannot hold ``layout`` (None when it can).

    OnDemand declares no instances: it fits any MIG-capable model that has at least one of
    the profiles ``onDemand.profiles`` allows (every profile when absent).
    """
    return _fit_error(model_id, layout.mig_mode, _layout_names(layout))


@lru_cache(maxsize=256)
def max_instances(model_id: str, allowed: tuple[str, ...] | None = None) -> int:
    """Most GPU instances one GPU of ``model_id`` holds at once, using only the profiles in
    ``allowed`` (every profile when None; names the model does not have are ignored)."""
    names = None if allowed is None else set(allowed)
    return max((len(layout) for layout in planner.feasible_layouts(
        model_id, include_media_extensions=True)
        if names is None or set(layout) <= names), default=0)


SHARES_ON_DEMAND = (
    "sharing Shares does not apply to migMode OnDemand: each instance created on demand "
    "belongs to the one claim that asked for it; use sharing Whole, or migMode Enabled with "
    "declared profiles to share instances by budgets")


def _candidates(spec: GPUPartitionSpec) -> tuple[list[str], str, str | None]:
    """The models the partition may land on, how to name them, and the field they come
    from (None: every MIG-capable model tessera knows)."""
    if spec.gpus is not None and spec.gpus.models:
        return list(spec.gpus.models), "spec.gpus.models", "spec.gpus.models"
    product = (spec.node_selector.match_labels or {}).get(LABEL_GPU_PRODUCT)
    if product:
        return [product], "the node selector", "spec.nodeSelector.matchLabels"
    return [m.id for m in MODELS if m.mig_capable], "any GPU model tessera knows", None


def _examples(per_model: Mapping[str, str]) -> str:
    """Detail for a few models, all of them when two or fewer, else the first as an example."""
    if len(per_model) > 2:
        model, text = next(iter(per_model.items()))
        return f"e.g. {model}: {text}"
    return "; ".join(f"{m}: {t}" for m, t in per_model.items())


def _on_demand_errors(bounds: OnDemand | None, models: list[str],
                      scope: str) -> list[tuple[str, str]]:
    """onDemand.profiles must each exist on a candidate; maxInstances must fit one GPU."""
    if bounds is None or not models:  # no candidate with MIG: said already
        return []
    errors: list[tuple[str, str]] = []
    own = {m: _own_profiles(m) for m in models}
    valid: list[str] = []
    for i, name in enumerate(bounds.profiles or []):
        if any(name in names for names in own.values()):
            valid.append(name)
            continue
        if len(models) == 1:
            why = (f"unknown MIG profile {name!r} for {models[0]}; valid profiles: "
                   f"{', '.join(own[models[0]])}")
        else:
            why = (f"{name!r} is not a MIG profile of {scope} (names depend on the model; "
                   f"{_examples({m: ', '.join(n) for m, n in own.items()})})")
        errors.append((f"spec.layout.onDemand.profiles[{i}]", why))
    if bounds.max_instances is not None:
        allowed = tuple(valid) if bounds.profiles else None
        limits = {m: max_instances(m, allowed) for m in models}
        best = max(limits.values())
        if 0 < best < bounds.max_instances:  # 0: no valid profile, said above
            holder = next(m for m, n in limits.items() if n == best)
            of = f" of {', '.join(valid)}" if allowed else ""
            most = f", the most of {scope}" if len(models) > 1 else ""
            errors.append(("spec.layout.onDemand.maxInstances",
                           f"{bounds.max_instances} instances{of} never fit on one GPU: "
                           f"{holder} holds at most {best}{most}; set maxInstances to "
                           f"{best} or less"))
    if bounds.keep_whole and bounds.profiles:
        whole = {m: [n for n in _own_profiles(m) if _takes_whole_gpu(m, n)] for m in models}
        if not any(n in valid for names in whole.values() for n in names):
            errors.append(("spec.layout.onDemand.keepWhole", (
                "keepWhole keeps GPUs for an instance of the whole GPU, but onDemand.profiles "
                f"allows none ({_examples({m: ', '.join(n) for m, n in whole.items()})}): "
                "add one, or drop keepWhole")))
    return errors


def _takes_whole_gpu(model_id: str, name: str) -> bool:
    return catalog.profile(model_id, name).memory_slices == catalog.slice_counts(model_id)[0]


def spec_errors(spec: GPUPartitionSpec) -> list[tuple[str, str]]:
    """(field, reason) for what is wrong whatever the cluster holds.

    The partition may land on the models in ``spec.gpus.models``, else those a
    ``tessera.dev/gpu.product`` matchLabel names, else any MIG-capable model tessera knows.
    Enabled: the layout must fit at least one of them.  OnDemand: every one must have MIG,
    each ``onDemand.profiles`` name must be a profile of at least one, ``maxInstances`` must
    fit one GPU of at least one, and ``sharing`` must be Whole.
    """
    layout = spec.layout
    if layout.mig_mode == "Disabled":
        return []
    errors: list[tuple[str, str]] = []
    if layout.mig_mode == "OnDemand" and spec.sharing == "Shares":
        errors.append(("spec.sharing", SHARES_ON_DEMAND))
    candidates, where, origin = _candidates(spec)
    for model in candidates:
        try:
            get_model(model)
        except UnknownModelError as exc:
            return [*errors, ("spec.nodeSelector.matchLabels", str(exc))]
    if layout.mig_mode == "OnDemand":
        with_mig = []
        for i, model in enumerate(candidates):
            if get_model(model).mig_capable:
                with_mig.append(model)
            else:
                fld = f"{origin}[{i}]" if origin == "spec.gpus.models" else str(origin)
                errors.append((fld, _needs_mig(layout.mig_mode, model)))
        scope = "any GPU model tessera knows" if origin is None else f"any model of {where}"
        return errors + _on_demand_errors(layout.on_demand, with_mig, scope)
    reasons = {m: layout_problem(m, layout) for m in candidates}
    if all(r is not None for r in reasons.values()):
        detail = _examples({m: r or "" for m, r in reasons.items()})
        return [*errors, ("spec.layout", f"fits no GPU model of {where} ({detail})")]
    return errors


def resolve(partitions: Iterable[PartitionView],
            nodes: Iterable[NodeInventory]) -> dict[str, Resolution]:
    """Selected nodes, owned GPUs and per-node problems of every partition at once.

    A node is selected when its labels match and it has at least one GPU that passes the
    partition's GPU filter (or its inventory is unreadable, which is then a problem).
    """
    node_list = sorted(nodes, key=lambda n: n.name)
    owner: dict[tuple[str, int], str] = {}
    out: dict[str, Resolution] = {}
    for p in sorted(partitions, key=claim_order):
        res = out[p.name] = Resolution()
        flt = p.spec.gpus
        for n in node_list:
            if not p.spec.node_selector.matches(dict(n.labels)):
                continue
            if n.error is not None:
                res.selected.append(n.name)
                res.problems.append(NodeProblem(n.name, "InventoryUnreadable", n.error))
                continue
            gpus = [g for g in n.gpus
                    if (flt is None or flt.models is None or g.model in flt.models)
                    and (flt is None or flt.indices is None or g.index in flt.indices)]
            if not gpus:
                continue
            res.selected.append(n.name)
            for g in gpus:
                holder = owner.get((n.name, g.index))
                if holder is not None:
                    res.problems.append(NodeProblem(
                        n.name, "GPUClaimed",
                        f"GPU {g.index} belongs to older gpupartition/{holder}"))
                    continue
                why = layout_problem(g.model, p.spec.layout)
                if why is not None:
                    res.problems.append(NodeProblem(
                        n.name, "LayoutDoesNotFit", f"GPU {g.index} ({g.model}): {why}"))
                    continue
                owner[(n.name, g.index)] = p.name
                res.claims.append(Claim(n.name, g.index, g.model))
    return out


def _names(items: Sequence[str]) -> str:
    shown = ", ".join(items[:MAX_NAMES])
    more = len(items) - MAX_NAMES
    return f"{shown} and {more} more" if more > 0 else shown


def aggregate(p: PartitionView, res: Resolution, old: GPUPartitionStatus | None,
              now: datetime | None = None) -> GPUPartitionStatus:
    """The partition's whole status: counts, conditions and the selected nodes' reports.

    Only nodes holding at least one claimed GPU are expected to report; a node that lost
    every GPU to problems is Degraded, not Progressing.  Reports of nodes the partition no
    longer selects are left out (the caller removes them from the stored status).
    """
    old = old or GPUPartitionStatus()
    gen = p.generation
    expected = res.claimed_nodes()
    ready: list[str] = []
    waiting: list[str] = []
    problems = list(res.problems)
    for name in expected:
        entry = p.nodes.get(name)
        if entry is None:
            waiting.append(f"{name} (no report)")
        elif entry.phase == "Failed" and entry.observed_generation is None:
            # an unreadable report carries no generation: waiting would never end
            problems.append(NodeProblem(name, "NodeFailed", entry.message or "failed"))
        elif entry.observed_generation != gen:
            waiting.append(f"{name} (generation {entry.observed_generation}, want {gen})")
        elif entry.phase == "Ready":
            ready.append(name)
        elif entry.phase == "Failed":
            problems.append(NodeProblem(name, "NodeFailed", entry.message or "failed"))
        else:
            detail = f": {entry.message}" if entry.message else ""
            waiting.append(f"{name} ({entry.phase}{detail})")
    conds = list(old.conditions)
    if problems:
        reasons = sorted({pr.reason for pr in problems})
        by_node: dict[str, list[str]] = {}
        for pr in problems:
            by_node.setdefault(pr.node, []).append(pr.message)
        msgs = [f"{n}: {'; '.join(m)}" for n, m in sorted(by_node.items())]
        conds = set_condition(conds, DEGRADED, "True",
                              reasons[0] if len(reasons) == 1 else "MultipleProblems",
                              _names(msgs), gen, now)
    else:
        conds = set_condition(conds, DEGRADED, "False", "NoProblems", "", gen, now)
    if waiting:
        conds = set_condition(conds, PROGRESSING, "True", "Applying",
                              f"{len(waiting)} of {len(expected)} nodes have not applied "
                              f"generation {gen}: {_names(waiting)}", gen, now)
    else:
        conds = set_condition(conds, PROGRESSING, "False", "Settled", "", gen, now)
    if not res.selected:
        conds = set_condition(conds, READY, "False", "NoNodesSelected",
                              "no node with matching GPUs matches the node selector", gen, now)
    elif problems:
        conds = set_condition(conds, READY, "False", "Degraded",
                              "some selected GPUs cannot follow the layout (see Degraded)",
                              gen, now)
    elif waiting:
        conds = set_condition(conds, READY, "False", "Applying",
                              f"{len(ready)} of {len(expected)} nodes applied", gen, now)
    else:
        conds = set_condition(conds, READY, "True", "Applied",
                              f"all {len(expected)} selected nodes applied generation {gen}",
                              gen, now)
    order = {READY: 0, PROGRESSING: 1, DEGRADED: 2}
    conds.sort(key=lambda c: order.get(c.type, 3))
    status = GPUPartitionStatus(
        observed_generation=gen, conditions=conds, selected_nodes=list(res.selected),
        selected_node_count=len(res.selected), ready_node_count=len(ready),
        layout=layout_summary(p.spec.layout),
        nodes=bounded_reports({k: p.nodes[k] for k in res.selected if k in p.nodes}))
    return status


def bounded_reports(reports: dict[str, NodePartitionStatus],
                    budget: int = NODE_DETAIL_BUDGET) -> dict[str, NodePartitionStatus]:
    """The selected nodes' reports, without their per-GPU detail once that gets too big.

    etcd refuses objects over 1.5 MiB, and a node of 8 GPUs with seven 1g instances each
    reports about 6 KB: 250 such nodes in one partition would make its status unwritable.
    Past ``budget`` bytes the entries keep phase, generation and message, and the detail
    stays where the daemons wrote it, in each Node's ``tessera.dev/partition-status``.
    """
    size = sum(len(json.dumps(r.to_dict(), separators=(",", ":"))) for r in reports.values())
    if size <= budget:
        return reports
    return {k: r.model_copy(update={"gpus": []}) for k, r in reports.items()}


def transitions(old: Sequence[Condition], new: Sequence[Condition]) -> list[Condition]:
    """Conditions whose status or reason changed: each is worth an Event."""
    before = {c.type: (c.status, c.reason) for c in old}
    return [c for c in new if before.get(c.type) != (c.status, c.reason)]
