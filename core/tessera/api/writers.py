"""Who may write each ``tessera.dev/`` key: the one table the pod webhook, the admission
policies and ``docs/operator.md`` read.

A key tessera trusts is written only by tessera; what a user writes is input, never
authority.  Three writers:

* ``user``: the object's owner (a namespace user, GitOps); tessera validates it;
* ``operator``: the operator's ServiceAccount (its webhook at admission, its leader after);
* ``node``: a node daemon's ServiceAccount, on its own Node and the pods bound to it.

How each is held: the pod webhook removes every pod key a user may not write from a pod it
admits (:func:`tessera_only_pod_keys`); the ValidatingAdmissionPolicies rendered from this
table (:mod:`tessera_operator.webhooks.policy`) refuse changing them after admission, creating them
in pod templates, and creating or touching growth holders, to everyone but their writers;
Nodes, ResourceQuotas, Secrets and GPUPartitions are not writable by namespace users at all
(RBAC), and tessera-node may write only its own Node (``tessera-node-restriction``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from tessera.api import names as n


class Writer(StrEnum):
    USER = "user"
    OPERATOR = "operator"
    NODE = "node"


USER, OPERATOR, NODE = Writer.USER, Writer.OPERATOR, Writer.NODE

KeyKind = Literal["annotation", "label", "finalizer", "scheduling gate"]


@dataclass(frozen=True)
class Key:
    name: str
    kind: KeyKind
    on: str
    """The kind of object it is found on."""
    writers: frozenset[Writer]
    what: str
    at_admission: bool = False
    """Written by the operator's webhook into the pod it admits (so present at create)."""
    instead: str = ""
    """What a user who wants to change it does instead (refusals say so)."""

    @property
    def user_writable(self) -> bool:
        return USER in self.writers


def _k(name: str, kind: KeyKind, on: str, writers: set[Writer], what: str,
       at_admission: bool = False, instead: str = "") -> Key:
    return Key(name, kind, on, frozenset(writers), what, at_admission, instead)


KEYS: tuple[Key, ...] = (
    _k(n.ANNOTATION_BUDGET_REQUEST, "annotation", "Pod", {USER},
       "a live resize request: new memory/cores totals per container"),
    _k(n.ANNOTATION_BUDGET, "annotation", "Pod", {OPERATOR},
       "the budget admission granted, which a resize changes and the node daemon enforces",
       at_admission=True, instead=f"ask for a resize with {n.ANNOTATION_BUDGET_REQUEST}, or "
       f"create the pod again with other {n.PREFIX} limits"),
    _k(n.LABEL_BUDGETED, "label", "Pod", {OPERATOR},
       "marks an admitted GPU pod (true), or a pod a claim of tessera's is reserved for "
       "(claims), which the operator's pod watch and count select on",
       at_admission=True, instead="GPUQuota usage is counted through it"),
    _k(n.ANNOTATION_CLAIM_BUDGET, "annotation", "Pod", {OPERATOR},
       "the live budget of the DRA claims the pod owns, once a resize changed one, which "
       "the node daemon enforces",
       instead=f"ask for a resize with {n.ANNOTATION_BUDGET_REQUEST}"),
    _k(n.ANNOTATION_BUDGET_RESIZE, "annotation", "Pod", {OPERATOR, NODE},
       "the outcome of the last resize request, whose sealed part the operator acts on",
       instead=f"ask for a resize with {n.ANNOTATION_BUDGET_REQUEST}"),
    _k(n.LABEL_GROWTH_OF, "label", "Pod", {OPERATOR},
       "on a growth holder, the UID of the resized pod whose growth it holds"),
    _k(n.LABEL_CLAIM_OF, "label", "Pod", {OPERATOR},
       "on a claim holder, which holds what a DRA claim counts in its GPUQuota (capacity, "
       "one GPU pod, MIG instances) as a growth holder does: the claim's UID"),
    _k(n.SCHEDULING_GATE_GROWTH, "scheduling gate", "Pod", {OPERATOR},
       "keeps a growth holder from ever being scheduled"),
    _k(n.ANNOTATION_PLACEMENT, "annotation", "Pod", {OPERATOR},
       "which GPU or MIG instance each container uses, recorded in the pod's Binding by the "
       "placement service; the device plugin gives a container only those",
       instead=f"choose with {n.ANNOTATION_GPU_POLICY}, {n.ANNOTATION_GPU_MODELS} and "
       f"{n.ANNOTATION_GPU_UUIDS_EXCLUDE}"),
    _k(n.ANNOTATION_NODE_POLICY, "annotation", "Pod", {USER},
       "placement: binpack or spread over nodes"),
    _k(n.ANNOTATION_GPU_POLICY, "annotation", "Pod", {USER},
       "placement: binpack or spread over GPUs and MIG instances"),
    _k(n.ANNOTATION_GPU_MODELS, "annotation", "Pod", {USER},
       "placement: the GPU models the pod may use"),
    _k(n.ANNOTATION_GPU_MODELS_EXCLUDE, "annotation", "Pod", {USER},
       "placement: GPU models the pod must not use"),
    _k(n.ANNOTATION_GPU_UUIDS_EXCLUDE, "annotation", "Pod", {USER},
       "placement: GPUs the pod must not use"),
    _k(n.ANNOTATION_GPU_TOPOLOGY, "annotation", "Pod", {USER},
       "placement: prefer, nvlink or none, for containers of several GPUs"),
    _k(n.ANNOTATION_PLACEMENT_URL, "annotation", "Lease", {OPERATOR},
       "where the leader answers the scheduler extender (other replicas forward there)"),
    _k(n.LABEL_GPU_PRODUCT, "label", "Node", {NODE}, "GPU model ID (first GPU's)"),
    _k(n.LABEL_GPU_COUNT, "label", "Node", {NODE}, "number of GPUs"),
    _k(n.LABEL_MIG_CAPABLE, "label", "Node", {NODE}, "every GPU supports MIG"),
    _k(n.ANNOTATION_GPUS, "annotation", "Node", {NODE}, "the GPU inventory (JSON)"),
    _k(n.ANNOTATION_PARTITION_STATUS, "annotation", "Node", {NODE},
       "what the daemon did for each GPUPartition (JSON)"),
    _k(n.ANNOTATION_NODE_FINDINGS, "annotation", "Node", {NODE},
       "other GPU stacks and inconsistencies found on the node (JSON)"),
    _k(n.ANNOTATION_GPU_COMMITMENTS, "annotation", "Node", {NODE},
       "memory budgets committed per GPU or MIG instance (JSON)"),
    _k(n.LABEL_GPUQUOTA, "label", "ResourceQuota", {OPERATOR},
       "the GPUQuota a managed ResourceQuota belongs to"),
    _k(n.ANNOTATION_GPUQUOTA_NAME, "annotation", "ResourceQuota", {OPERATOR},
       "that GPUQuota's full name"),
    _k(n.ANNOTATION_CERT_STEP_AT, "annotation", "Secret", {OPERATOR},
       "when the leader wrote the last step of a webhook certificate renewal"),
    _k(n.FINALIZER_RESET, "finalizer", "GPUPartition", {OPERATOR},
       "held on deletionPolicy: Reset partitions until their GPUs are reset"),
    _k(n.FINALIZER_MANAGED_QUOTA, "finalizer", "ResourceQuota", {OPERATOR},
       "held on a managed ResourceQuota while its GPUQuota exists (a delete cannot lapse "
       "the count)"),
)


def key(name: str) -> Key:
    for k in KEYS:
        if k.name == name:
            return k
    raise KeyError(name)


def tessera_only_pod_keys(kind: KeyKind) -> tuple[str, ...]:
    """The pod annotations (or labels) no user may write: a pod admitted with one has it
    removed (the webhook then writes what it trusts)."""
    return tuple(k.name for k in KEYS if k.on == "Pod" and k.kind == kind
                 and not k.user_writable)


def markdown_table() -> str:
    """The table ``docs/operator.md`` shows (between its markers; a test keeps it current)."""
    rows = ["| key | kind | on | who writes it | what |", "|---|---|---|---|---|"]
    for k in KEYS:
        who = ", ".join(w.value for w in Writer if w in k.writers)
        rows.append(f"| `{k.name}` | {k.kind} | {k.on} | {who} | {k.what} |")
    return "\n".join(rows) + "\n"
