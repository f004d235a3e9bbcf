"""The one table of GPU models tessera knows.

Model IDs are label-safe (they appear in the Node label ``tessera.dev/gpu.product``), and
every part -- CLI, planner, node labels, simulator -- maps NVML's names and PCI device IDs
to them through this table only.  Names differ between SKUs of one model (SXM vs PCIe), so
a model lists every NVML name and PCI ID that reports it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPUModel:
    """A GPU model as tessera schedules it: one MIG geometry, one memory size."""

    id: str
    """Label-safe model ID, e.g. ``H100-80GB``."""
    nvml_names: tuple[str, ...]
    """Names ``nvmlDeviceGetName`` reports for this model (first is canonical)."""
    pci_device_ids: tuple[int, ...]
    """``pciDeviceId`` values (device << 16 | vendor 0x10DE), first is canonical."""
    memory_mib: int
    """Total framebuffer memory NVML reports, in MiB."""
    sm_count: int
    """Streaming multiprocessors of the full GPU."""
    mig_capable: bool = True

    @property
    def nvml_name(self) -> str:
        return self.nvml_names[0]

    @property
    def pci_device_id(self) -> int:
        return self.pci_device_ids[0]


MODELS: tuple[GPUModel, ...] = (
    GPUModel(
        id="A100-40GB",
        nvml_names=("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),
        pci_device_ids=(0x20B010DE, 0x20F110DE),
        memory_mib=40960,
        sm_count=108,
    ),
    GPUModel(
        id="A100-80GB",
        nvml_names=("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
        pci_device_ids=(0x20B210DE, 0x20B510DE),
        memory_mib=81920,
        sm_count=108,
    ),
    GPUModel(
        id="A30-24GB",
        nvml_names=("NVIDIA A30",),
        pci_device_ids=(0x20B710DE,),
        memory_mib=24576,
        sm_count=56,
    ),
    GPUModel(
        id="H100-80GB",
        nvml_names=("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"),
        pci_device_ids=(0x233010DE, 0x233110DE),
        memory_mib=81559,
        sm_count=132,
    ),
    GPUModel(
        id="H100-94GB",
        nvml_names=("NVIDIA H100 NVL",),
        pci_device_ids=(0x232110DE,),
        memory_mib=95830,
        sm_count=132,
    ),
    GPUModel(
        id="H100-96GB",
        nvml_names=("NVIDIA GH200 480GB",),
        pci_device_ids=(0x234210DE,),
        memory_mib=97871,
        sm_count=132,
    ),
    GPUModel(
        id="H200-141GB",
        nvml_names=("NVIDIA H200", "NVIDIA H200 NVL"),
        pci_device_ids=(0x233510DE, 0x233B10DE),
        memory_mib=143771,
        sm_count=132,
    ),
    GPUModel(
        id="B200-180GB",
        nvml_names=("NVIDIA B200",),
        pci_device_ids=(0x290110DE,),
        memory_mib=183359,
        sm_count=148,
    ),
)

_BY_ID = {m.id: m for m in MODELS}
_BY_NAME = {name: m for m in MODELS for name in m.nvml_names}
_BY_PCI = {pci: m for m in MODELS for pci in m.pci_device_ids}


class UnknownModelError(KeyError):
    """A GPU model tessera has no table entry for."""

    def __str__(self) -> str:
        return str(self.args[0])


def model_ids() -> list[str]:
    return [m.id for m in MODELS]


def get_model(model_id: str) -> GPUModel:
    """Look a model up by its tessera ID; the error lists the known IDs."""
    try:
        return _BY_ID[model_id]
    except KeyError:
        known = ", ".join(model_ids())
        raise UnknownModelError(f"unknown GPU model {model_id!r}; known models: {known}") from None


def model_for_nvml(name: str | None = None, pci_device_id: int | None = None) -> GPUModel | None:
    """Identify a device from what NVML reports; PCI ID wins over the name."""
    if pci_device_id is not None and pci_device_id in _BY_PCI:
        return _BY_PCI[pci_device_id]
    if name is not None:
        return _BY_NAME.get(name)
    return None
