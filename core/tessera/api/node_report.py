"""The node report contract: how a node daemon tells the operator what it did per GPUPartition.

Each node daemon writes ONE annotation on its OWN Node object, ``tessera.dev/partition-status``:
a JSON object keyed by GPUPartition name, each value a :class:`NodePartitionStatus` (phase,
observedGeneration, message, lastUpdateTime, gpus) in the API's camelCase wire form::

    {"a100-training": {"phase": "Ready", "observedGeneration": 3,
                       "gpus": [{"index": 0, "migEnabled": true, "instances": [...]}]}}

The operator copies the entries of the nodes a partition selects into that partition's
``status.nodes.<node>`` and derives the counts and conditions from them, so users read the
same per-node status in the GPUPartition as before.

Why the Node and not the GPUPartition's status: a layout change makes every selected node's
daemon answer at about the same time.  Fifty daemons merge-patching one object make the API
server retry each write against every other (optimistic concurrency on one etcd key), so the
work grows with the square of the node count: measured on the local control plane, 50
concurrent patches of realistic entries (8 GPUs, 2 instances each) took 15-16 s on one
GPUPartition and 48-123 ms on the 50 Nodes.  With one writer per object nothing conflicts,
the operator writes each partition's status once per burst, and a daemon needs write access
to its own Node only, not to every partition's status.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from pydantic import ValidationError

from tessera.api.names import ANNOTATION_PARTITION_STATUS
from tessera.api.partition import NodePartitionStatus


class ReportError(ValueError):
    """The annotation as a whole cannot be read (message says why)."""


def parse_reports(raw: str) -> dict[str, NodePartitionStatus]:
    """Parse the annotation value.

    A value that is not a JSON object raises ReportError.  One unreadable entry does not
    hide the others: it becomes a Failed entry whose message says what is wrong, so the
    partition it belongs to turns Degraded naming the node instead of waiting forever.
    """
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ReportError(f"{ANNOTATION_PARTITION_STATUS} is not JSON: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise ReportError(f"{ANNOTATION_PARTITION_STATUS} must be a JSON object keyed by "
                          "GPUPartition name")
    out: dict[str, NodePartitionStatus] = {}
    for name, entry in data.items():
        try:
            out[str(name)] = NodePartitionStatus.model_validate(entry)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "entry"
            out[str(name)] = NodePartitionStatus(
                phase="Failed", message=f"unreadable report ({where}: {first['msg']})")
    return out


def to_annotation(reports: Mapping[str, NodePartitionStatus]) -> str:
    """Serialise reports as the annotation value (what a node daemon writes)."""
    return json.dumps({name: r.to_dict() for name, r in sorted(reports.items())},
                      separators=(",", ":"))
