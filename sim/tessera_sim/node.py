"""Node descriptions for the simulated GPU node, built from tessera's one GPU model table.

The C side reads this format (documented in sim/README.md)::

    # tessera-sim node v1
    [node]
    default_ns_per_block=1000
    [gpu]
    model=H100-80GB
    name=NVIDIA H100 80GB HBM3
    ...
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from tessera.models import GPUModel, get_model

# Compute capability by architecture; the model table does not carry it.
_CC_BY_PREFIX = (
    ("A100", "8.0"), ("A30", "8.0"), ("H100", "9.0"), ("H200", "9.0"), ("B200", "10.0"),
)
# Ampere needs a GPU reset for a MIG mode change; Hopper and later switch at once.
_RESET_FOR_MIG = ("A100", "A30")


@dataclass(frozen=True)
class GPUSpec:
    """One GPU of a simulated node."""

    model_id: str
    mig: bool = False
    uuid: str | None = None

    @classmethod
    def parse(cls, text: str) -> GPUSpec:
        """``MODEL`` or ``MODEL:mig`` (MIG mode enabled at start)."""
        model_id, _, flag = text.partition(":")
        if flag not in ("", "mig"):
            raise ValueError(f"bad GPU spec {text!r}: expected MODEL or MODEL:mig")
        get_model(model_id)
        return cls(model_id=model_id, mig=flag == "mig")


def compute_capability(model: GPUModel) -> str:
    for prefix, cc in _CC_BY_PREFIX:
        if model.id.startswith(prefix):
            return cc
    return "9.0"


def gpu_uuid(seed: str, index: int) -> str:
    h = hashlib.sha256(f"{seed}/{index}".encode()).hexdigest()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def node_description(
    gpus: list[GPUSpec],
    *,
    seed: str = "tessera-sim",
    default_ns_per_block: int = 1000,
    launch_queue_depth: int = 1024,
    context_mib: int = 0,
) -> str:
    """Text of a node description for these GPUs."""
    if not gpus:
        raise ValueError("a node needs at least one GPU")
    lines = [
        "# tessera-sim node v1",
        "[node]",
        f"default_ns_per_block={default_ns_per_block}",
        f"launch_queue_depth={launch_queue_depth}",
        f"context_mib={context_mib}",
    ]
    for i, spec in enumerate(gpus):
        model = get_model(spec.model_id)
        mig_change = "reset" if model.id.startswith(_RESET_FOR_MIG) else "immediate"
        lines += [
            "[gpu]",
            f"model={model.id}",
            f"name={model.nvml_name}",
            f"memory_mib={model.memory_mib}",
            f"sm_count={model.sm_count}",
            f"uuid={spec.uuid or gpu_uuid(seed, i)}",
            f"pci_bus_id=00000000:{0x17 + 0x10 * i:02X}:00.0",
            f"pci_device_id=0x{model.pci_device_id:08X}",
            f"compute_capability={compute_capability(model)}",
            f"mig_mode={1 if spec.mig and model.mig_capable else 0}",
            f"mig_mode_change={mig_change}",
        ]
    return "\n".join(lines) + "\n"


def write_node(path: Path, gpus: list[GPUSpec], **kwargs: int | str) -> Path:
    """Write a node description; its state file (``<path>.state``) starts afresh."""
    path.write_text(node_description(gpus, **kwargs))  # type: ignore[arg-type]
    state = Path(f"{path}.state")
    if state.exists():
        state.unlink()
    return path
