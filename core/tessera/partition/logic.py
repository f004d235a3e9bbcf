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
    layout_summary,
)
from tessera.mig import planner
from tessera.mig.catalog import UnknownProfileError
from tessera.models import MODELS

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
    return tuple(sorted(layout.profile_names()))


@lru_cache(maxsize=4096)
def _fit_error(model_id: str, mig_disabled: bool, names: tuple[str, ...]) -> str | None:
    if mig_disabled:
        return None
    try:
        planner.fit(model_id, list(names))
    except (planner.LayoutError, UnknownProfileError) as exc:
        return str(exc)
    return None


def layout_problem(model_id: str, layout: Layout) -> str | None:
    """Why a GPU of ``model_id`` cannot hold ``layout`` (None when it can)."""
    return _fit_error(model_id, layout.mig_mode == "Disabled", _layout_names(layout))


def spec_errors(spec: GPUPartitionSpec) -> list[tuple[str, str]]:
    """(field, reason) for what is wrong whatever the cluster holds.

    The layout must fit at least one GPU model the partition may land on: the models in
    ``spec.gpus.models``, else those a ``tessera.dev/gpu.product`` matchLabel names, else
    any model tessera knows.
    """
    if spec.layout.mig_mode == "Disabled":
        return []
    candidates: list[str]
    if spec.gpus is not None and spec.gpus.models:
        candidates = list(spec.gpus.models)
        where = "spec.gpus.models"
    else:
        product = (spec.node_selector.match_labels or {}).get(LABEL_GPU_PRODUCT)
        candidates = [product] if product else [m.id for m in MODELS if m.mig_capable]
        where = "the node selector" if product else "any GPU model tessera knows"
    known = {m.id for m in MODELS}
    unknown = [m for m in candidates if m not in known]
    if unknown:
        return [("spec.nodeSelector.matchLabels", f"unknown GPU model {unknown[0]!r}")]
    reasons = {m: layout_problem(m, spec.layout) for m in candidates}
    if all(r is not None for r in reasons.values()):
        detail = "; ".join(f"{m}: {r}" for m, r in reasons.items())
        if len(candidates) > 2:
            detail = next(iter(reasons.values())) or ""
            detail = f"e.g. {candidates[0]}: {detail}"
        return [("spec.layout", f"fits no GPU model of {where} ({detail})")]
    return []


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
