"""The one write a daemon makes to its own Node: the keys it owns, as a merge patch (pure).

The daemon owns the inventory labels, the inventory and report annotations and its findings;
every other key is someone else's and is never in the patch.  A key it owns but has nothing
for is removed.  The patch carries the Node's ``resourceVersion``, so it applies only to the
Node it was computed from (a conflict means: wait for the watch, compute again).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.api.names import (
    ANNOTATION_GPU_COMMITMENTS,
    ANNOTATION_GPUS,
    ANNOTATION_NODE_FINDINGS,
    ANNOTATION_PARTITION_STATUS,
    LABEL_GPU_COUNT,
    LABEL_GPU_PRODUCT,
    LABEL_MIG_CAPABLE,
)
from tessera.kube.merge import merge_diff

OWNED_LABELS = (LABEL_GPU_PRODUCT, LABEL_GPU_COUNT, LABEL_MIG_CAPABLE)
OWNED_ANNOTATIONS = (ANNOTATION_GPUS, ANNOTATION_PARTITION_STATUS, ANNOTATION_NODE_FINDINGS,
                     ANNOTATION_GPU_COMMITMENTS)


def _owned(values: Mapping[str, str] | None, keys: tuple[str, ...]) -> dict[str, str]:
    return {k: v for k, v in (values or {}).items() if k in keys}


def node_patch(node: Mapping[str, Any], labels: Mapping[str, str],
               annotations: Mapping[str, str]) -> dict[str, Any] | None:
    """The merge patch that gives ``node`` exactly these owned labels and annotations;
    None when it has them already."""
    meta = node.get("metadata") or {}
    have = {"labels": _owned(meta.get("labels"), OWNED_LABELS),
            "annotations": _owned(meta.get("annotations"), OWNED_ANNOTATIONS)}
    want = {"labels": _owned(labels, OWNED_LABELS),
            "annotations": _owned(annotations, OWNED_ANNOTATIONS)}
    diff = merge_diff(have, want)
    if diff == {}:
        return None
    return {"metadata": {"resourceVersion": meta.get("resourceVersion"), **diff}}
