"""What the GPUs of a node look like at one moment, as NVML reports them (plain data).

The reader (:mod:`tessera_node.device.nvml`) produces a :class:`DeviceSnapshot`; everything
that decides something from it (inventory, plans, reports, metrics) is pure and takes it as
input, so the same logic runs against the simulator, a real GPU and a unit test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tessera.models import GPUModel, model_for_nvml

MigMode = Literal["enabled", "disabled", "unsupported"]


@dataclass(frozen=True)
class MigInstanceState:
    """One MIG GPU instance (and the MIG device of its first compute instance)."""

    profile_id: int
    """GPU-instance profile ID as NVML reports it (what ``nvidia-smi mig -lgi`` prints)."""
    profile: str
    """Profile name (``3g.40gb``) as the GPU reports it; empty when NVML gave none."""
    start: int
    size: int
    gi_id: int
    uuid: str = ""
    """MIG device UUID; empty while the instance has no compute instance."""
    ci_id: int | None = None
    """The compute instance of that MIG device (None: none, or NVML did not say)."""
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    processes: tuple[str, ...] = ()
    """Processes NVML shows on this GPU instance (``pid 4242 (python3)``)."""

    @property
    def has_compute_instance(self) -> bool:
        """A MIG device exists (a compute instance): what a GPU instance needs to be used."""
        return bool(self.uuid)

    def __str__(self) -> str:
        return f"{self.profile}@{self.start} (GI {self.gi_id})"


@dataclass(frozen=True)
class ProfileInfo:
    """One GPU-instance profile as NVML describes it on one GPU."""

    profile_id: int
    name: str
    memory_mib: int
    compute_slices: int
    max_count: int
    sm_count: int


@dataclass(frozen=True)
class ProcessUsage:
    """One record of NVML's compute process list (``nvmlDeviceGetComputeRunningProcesses``
    on the GPU's handle: every process, with its GPU instance on a MIG-enabled GPU)."""

    pid: int
    """Host PID (NVML reports PIDs as the host's PID namespace numbers them)."""
    gi_id: int | None
    """GPU instance the memory is on; None outside MIG."""
    used_bytes: int | None
    """``usedGpuMemory`` (everything the process holds there, contexts included); None
    where NVML does not say."""


@dataclass(frozen=True)
class GPUState:
    """One physical GPU."""

    index: int
    uuid: str
    name: str
    pci_device_id: int
    memory_total_bytes: int
    memory_used_bytes: int
    utilization_percent: int | None
    """Busy share of the last second; None where NVML does not say (MIG-enabled GPUs)."""
    mig_mode: MigMode
    mig_pending: MigMode | None = None
    """The mode after the next GPU reset, when it differs from the current one."""
    instances: tuple[MigInstanceState, ...] = ()
    profiles: tuple[ProfileInfo, ...] = ()
    """NVML's GPU-instance profiles (read while MIG is enabled; empty otherwise)."""
    processes: tuple[str, ...] = ()
    """Processes NVML shows on the GPU outside any MIG instance (``pid 4242 (python3)``)."""
    usage: tuple[ProcessUsage, ...] = ()
    """NVML's per-process records on this GPU and its MIG instances (the audit's input)."""
    pci_bus_id: str = ""
    """NVML's PCI bus ID (``00000000:17:00.0``)."""
    numa_node: int | None = None
    """The host NUMA node the GPU is attached to; None where NVML does not say."""
    nvlink_peers: tuple[str, ...] = ()
    """UUIDs of the node's GPUs at the far end of this GPU's active NVLinks (empty: none, or
    NVML did not say)."""
    minor: int | None = None
    """The driver's minor number (its device file ``/dev/nvidia<minor>``); None where NVML
    does not say."""


@dataclass(frozen=True)
class DeviceSnapshot:
    """Every GPU of the node, read in one pass."""

    gpus: tuple[GPUState, ...]
    driver_version: str = ""


def model_of(gpu: GPUState) -> GPUModel | None:
    """The GPU's entry in tessera's model table (by NVML's name and PCI device ID); None for
    a model the table does not know."""
    return model_for_nvml(gpu.name, gpu.pci_device_id)
