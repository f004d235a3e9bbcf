"""A pod's placement policy, from its six ``tessera.dev/`` policy annotations.

==================================  ====================================================
``tessera.dev/node-policy``         ``binpack`` (the fullest node that holds the pod) or
                                    ``spread`` (the emptiest)
``tessera.dev/gpu-policy``          ``binpack`` (per container the unit left with the
                                    least free memory) or ``spread`` (the most)
``tessera.dev/gpu-models``          comma-separated model IDs the pod may use
``tessera.dev/gpu-models-exclude``  comma-separated model IDs it must not use
``tessera.dev/gpu-uuids-exclude``   comma-separated GPU UUIDs (``GPU-…``) it must not use
``tessera.dev/gpu-topology``        ``prefer``, ``nvlink`` or ``none`` (containers of several
                                    units; see :mod:`tessera.placement.choose`)
==================================  ====================================================

:func:`parse` is the one reader of these keys. An absent key takes the ``default`` policy's
value (the chart's cluster default). Lists are trimmed of whitespace around items; an
empty item, an unknown model ID (:mod:`tessera.models`) or a UUID not starting with ``GPU-``
is refused, and every error names the key, the bad value and what is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

from tessera.api.names import (
    ANNOTATION_GPU_MODELS,
    ANNOTATION_GPU_MODELS_EXCLUDE,
    ANNOTATION_GPU_POLICY,
    ANNOTATION_GPU_TOPOLOGY,
    ANNOTATION_GPU_UUIDS_EXCLUDE,
    ANNOTATION_NODE_POLICY,
)
from tessera.models import model_ids

Packing = Literal["binpack", "spread"]
Topology = Literal["prefer", "nvlink", "none"]
PACKINGS: tuple[Packing, ...] = ("binpack", "spread")
TOPOLOGIES: tuple[Topology, ...] = ("prefer", "nvlink", "none")
GPU_UUID_PREFIX = "GPU-"


class PolicyError(ValueError):
    """A policy annotation has a value tessera does not accept (message names the key)."""


@dataclass(frozen=True)
class Policy:
    node: Packing = "binpack"
    gpu: Packing = "binpack"
    models: frozenset[str] = frozenset()
    """Only these models (empty: any)."""
    exclude_models: frozenset[str] = frozenset()
    exclude_gpus: frozenset[str] = frozenset()
    """GPU UUIDs; every unit on such a GPU is excluded."""
    topology: Topology = "prefer"

    def allows(self, model: str, gpu_uuid: str) -> bool:
        """Whether a unit of a GPU of ``model`` with ``gpu_uuid`` may be used."""
        return ((not self.models or model in self.models)
                and model not in self.exclude_models and gpu_uuid not in self.exclude_gpus)


DEFAULT = Policy()


def _or(words: tuple[str, ...]) -> str:
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0]


def _choice(key: str, raw: str, allowed: tuple[str, ...]) -> str:
    value = raw.strip()
    if value not in allowed:
        raise PolicyError(f"{key}: {raw!r} is not {_or(allowed)}")
    return value


def _items(key: str, raw: str) -> frozenset[str]:
    items = [item.strip() for item in raw.split(",")]
    if any(not item for item in items):
        raise PolicyError(f"{key}: {raw!r} has an empty item (a comma-separated list)")
    return frozenset(items)


def _models(key: str, raw: str) -> frozenset[str]:
    items = _items(key, raw)
    known = model_ids()
    for item in sorted(items):
        if item not in known:
            raise PolicyError(
                f"{key}: {item!r} is not a GPU model; known models: {', '.join(known)}")
    return items


def _gpus(key: str, raw: str) -> frozenset[str]:
    items = _items(key, raw)
    for item in sorted(items):
        if not item.startswith(GPU_UUID_PREFIX) or item == GPU_UUID_PREFIX:
            raise PolicyError(f"{key}: {item!r} is not a GPU UUID (GPU-…)")
    return items


def parse(annotations: Mapping[str, str], default: Policy = DEFAULT) -> Policy:
    """The policy the annotations ask for; absent keys keep ``default``'s values."""
    a = annotations
    node = a.get(ANNOTATION_NODE_POLICY)
    gpu = a.get(ANNOTATION_GPU_POLICY)
    models = a.get(ANNOTATION_GPU_MODELS)
    exclude_models = a.get(ANNOTATION_GPU_MODELS_EXCLUDE)
    exclude_gpus = a.get(ANNOTATION_GPU_UUIDS_EXCLUDE)
    topology = a.get(ANNOTATION_GPU_TOPOLOGY)
    return Policy(
        node=default.node if node is None
        else cast(Packing, _choice(ANNOTATION_NODE_POLICY, node, PACKINGS)),
        gpu=default.gpu if gpu is None
        else cast(Packing, _choice(ANNOTATION_GPU_POLICY, gpu, PACKINGS)),
        models=default.models if models is None else _models(ANNOTATION_GPU_MODELS, models),
        exclude_models=default.exclude_models if exclude_models is None
        else _models(ANNOTATION_GPU_MODELS_EXCLUDE, exclude_models),
        exclude_gpus=default.exclude_gpus if exclude_gpus is None
        else _gpus(ANNOTATION_GPU_UUIDS_EXCLUDE, exclude_gpus),
        topology=default.topology if topology is None
        else cast(Topology, _choice(ANNOTATION_GPU_TOPOLOGY, topology, TOPOLOGIES)),
    )


def to_annotations(policy: Policy) -> dict[str, str]:
    """The annotations that :func:`parse` reads back as ``policy`` (empty sets omitted)."""
    out: dict[str, str] = {
        ANNOTATION_NODE_POLICY: policy.node, ANNOTATION_GPU_POLICY: policy.gpu,
        ANNOTATION_GPU_TOPOLOGY: policy.topology}
    for key, values in ((ANNOTATION_GPU_MODELS, policy.models),
                        (ANNOTATION_GPU_MODELS_EXCLUDE, policy.exclude_models),
                        (ANNOTATION_GPU_UUIDS_EXCLUDE, policy.exclude_gpus)):
        if values:
            out[key] = ",".join(sorted(values))
    return out
