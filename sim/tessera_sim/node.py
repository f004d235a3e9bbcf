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


NVLINKS_PER_GPU = 18
"""NVLink links per GPU (NVML_NVLINK_MAX_LINKS): a GPU's pairs may use at most this many."""


@dataclass(frozen=True)
class NvLink:
    """GPUs ``a`` and ``b`` (node indexes) joined directly by ``links`` NVLink links."""

    a: int
    b: int
    links: int = 1


@dataclass(frozen=True)
class Topology:
    """Where a node's GPUs are: each GPU's host NUMA node (``numa``: one per GPU, or empty for
    all on node 0) and the NVLinks between them (none by default)."""

    numa: tuple[int, ...] = ()
    nvlink: tuple[NvLink, ...] = ()

    @classmethod
    def parse(cls, nvlink: str = "", numa: str = "", gpus: int = 0) -> Topology:
        """The command line's forms: ``nvlink`` is ``all`` (every pair, one link each) or
        ``A-B[:LINKS],...`` (``0-1,2-3``, ``0-1:4``); ``numa`` is one node per GPU
        (``0,0,1,1``). ``gpus``: how many GPUs the node has (for ``all`` and the checks)."""
        pairs: list[NvLink] = []
        if nvlink.strip() == "all":
            pairs = [NvLink(a, b) for a in range(gpus) for b in range(a + 1, gpus)]
        elif nvlink.strip():
            for item in nvlink.split(","):
                pair, _, count = item.strip().partition(":")
                a, sep, b = pair.partition("-")
                try:
                    pairs.append(NvLink(int(a), int(b), int(count) if count else 1))
                except ValueError:
                    raise ValueError(f"bad NVLink {item!r}: expected A-B or A-B:LINKS") from None
                if not sep:
                    raise ValueError(f"bad NVLink {item!r}: expected A-B or A-B:LINKS")
        try:
            nodes = tuple(int(n) for n in numa.split(",")) if numa.strip() else ()
        except ValueError:
            raise ValueError(f"bad NUMA nodes {numa!r}: expected one integer per GPU") from None
        topology = cls(numa=nodes, nvlink=tuple(pairs))
        topology.check(gpus)
        return topology

    def check(self, gpus: int) -> None:
        """Raise ValueError unless this topology fits a node of ``gpus`` GPUs."""
        if self.numa and len(self.numa) != gpus:
            raise ValueError(f"{len(self.numa)} NUMA nodes given for {gpus} GPUs")
        if any(n < 0 or n > 1023 for n in self.numa):
            raise ValueError(f"NUMA nodes must be 0-1023: {self.numa}")
        used = [0] * gpus
        seen: set[tuple[int, int]] = set()
        for p in self.nvlink:
            if not (0 <= p.a < gpus and 0 <= p.b < gpus) or p.a == p.b:
                raise ValueError(f"NVLink {p.a}-{p.b}: not two GPUs of {gpus}")
            if p.links < 1:
                raise ValueError(f"NVLink {p.a}-{p.b}: at least one link")
            key = (min(p.a, p.b), max(p.a, p.b))
            if key in seen:
                raise ValueError(f"NVLink {p.a}-{p.b} given twice")
            seen.add(key)
            used[p.a] += p.links
            used[p.b] += p.links
        for i, n in enumerate(used):
            if n > NVLINKS_PER_GPU:
                raise ValueError(f"GPU {i} would have {n} NVLinks, at most {NVLINKS_PER_GPU}")

    def numa_node(self, index: int) -> int:
        return self.numa[index] if self.numa else 0

    def links(self, index: int) -> list[int]:
        """The GPU at the far end of each of GPU ``index``'s links, link 0 first (pairs in
        the order given, each taking the next free links at both ends)."""
        out: list[int] = []
        for p in self.nvlink:
            if index in (p.a, p.b):
                out += [p.b if index == p.a else p.a] * p.links
        return out


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
    topology: Topology | None = None,
) -> str:
    """Text of a node description for these GPUs (``topology``: none given, every GPU on
    NUMA node 0 and no NVLink)."""
    if not gpus:
        raise ValueError("a node needs at least one GPU")
    topology = topology or Topology()
    topology.check(len(gpus))
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
            f"numa_node={topology.numa_node(i)}",
            f"nvlink={','.join(str(peer) for peer in topology.links(i))}",
        ]
    return "\n".join(lines) + "\n"


def write_node(path: Path, gpus: list[GPUSpec], topology: Topology | None = None,
               **kwargs: int | str) -> Path:
    """Write a node description; its state file (``<path>.state``) starts afresh."""
    path.write_text(node_description(gpus, topology=topology, **kwargs))  # type: ignore[arg-type]
    state = Path(f"{path}.state")
    if state.exists():
        state.unlink()
    return path
