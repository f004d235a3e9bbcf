"""Whether a pod may run on a node at all, apart from its GPUs (pure): its ``nodeSelector``,
its required node affinity, and the node's taints and cordon.

kube-scheduler decides this itself for every node it filters; tessera needs it only where
it acts *before* the scheduler finds a node, for a pending pod that no node can hold yet:
MIG on demand makes an instance for such a pod only on a node the pod could then be placed
on (:mod:`tessera.placement.on_demand`). The rules restated from the scheduler's
``NodeAffinity``, ``TaintToleration`` and ``NodeUnschedulable`` plugins:

* every ``nodeSelector`` label must be on the node with that value;
* of ``requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`` one term must
  match (terms are ORed; an empty list matches nothing); a term's ``matchExpressions`` and
  ``matchFields`` (only ``metadata.name``) all must hold (ANDed; a term with neither matches
  nothing); operators ``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``, ``Lt``
  (integers);
* every taint with effect ``NoSchedule`` or ``NoExecute`` must be tolerated (a toleration
  with an empty key and ``Exists`` tolerates everything; an empty effect matches every
  effect; ``Equal`` compares values, ``Exists`` ignores them);
* a cordoned node (``spec.unschedulable``) needs a toleration of
  ``node.kubernetes.io/unschedulable:NoSchedule``.

Preferred affinity, pod (anti-)affinity and topology spread only rank or spread where the
scheduler puts a pod that fits; they never make a node impossible by themselves and are not
evaluated (an instance made on a node the scheduler then ranks lower still holds the pod).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def _int(raw: str) -> int | None:
    try:
        return int(raw)
    except ValueError:
        return None


def _expression(req: Mapping[str, Any], value: str | None) -> bool:
    op = req.get("operator")
    values = [str(v) for v in req.get("values") or []]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        have, bound = _int(value), _int(values[0])
        if have is None or bound is None:
            return False
        return have > bound if op == "Gt" else have < bound
    return False  # an operator the API server would have refused


def _term(term: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False
    for req in exprs:
        if not _expression(req, labels.get(str(req.get("key")))):
            return False
    for req in fields:
        if req.get("key") != "metadata.name" or not _expression(req, name):
            return False
    return True


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    op = toleration.get("operator") or "Equal"
    if not key:
        return op == "Exists"
    if key != taint.get("key"):
        return False
    return op == "Exists" or str(toleration.get("value") or "") == str(taint.get("value") or "")


def eligible(pod_spec: Mapping[str, Any], node_name: str, labels: Mapping[str, str],
             taints: Sequence[Mapping[str, Any]], unschedulable: bool = False) -> bool:
    """Whether kube-scheduler's node filters (selector, required affinity, taints, cordon)
    let a pod with ``pod_spec`` onto the node."""
    for k, v in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(str(k)) != str(v):
            return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required is not None and not any(
            _term(t, node_name, labels) for t in required.get("nodeSelectorTerms") or []):
        return False
    tolerations = pod_spec.get("tolerations") or []
    hard = [t for t in taints if t.get("effect") in ("NoSchedule", "NoExecute")]
    if unschedulable:
        hard.append(UNSCHEDULABLE_TAINT)
    return all(any(_tolerates(tol, t) for tol in tolerations) for t in hard)
