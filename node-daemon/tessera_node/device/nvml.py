"""Reading the GPUs through NVML (``pynvml``): the one place the daemon calls NVML.

:class:`GPUReader` is the interface the daemon depends on; :class:`NvmlReader` implements it
over whatever ``libnvidia-ml.so.1`` the driver root holds (the real driver's, or the
simulator's).  NVML calls block (the driver takes locks), so the daemon runs :meth:`read`
in a worker thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pynvml

from tessera_node.device.procfs import process_name
from tessera_node.device.state import (
    DeviceSnapshot,
    GPUState,
    MigInstanceState,
    MigMode,
    ProcessUsage,
    ProfileInfo,
)

LIBRARY = "libnvidia-ml.so.1"
LIBRARY_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib/aarch64-linux-gnu",
                "usr/lib", "lib64", "lib")
"""Where a driver root keeps NVML (distribution layouts, then the simulator's ``lib``)."""


log = logging.getLogger("tessera_node")


class DeviceError(Exception):
    """The GPUs cannot be read; the message says which call failed and why."""


class GPUReader(Protocol):
    def read(self) -> DeviceSnapshot:
        """Every GPU of the node now; raises :class:`DeviceError`."""
        ...

    def paused(self) -> contextlib.AbstractContextManager[None]:
        """NVML closed (no handle of ours open) and no read until the block ends: a GPU
        reset refuses while clients hold the GPU."""
        ...


NO_ID = 0xFFFFFFFF
"""NVML's "no GPU/compute instance" in a process record."""


def find_library(driver_root: str) -> str | None:
    """The NVML library below ``driver_root``; None for ``/`` (the system loader finds it)."""
    if driver_root in ("", "/"):
        return None
    for sub in LIBRARY_DIRS:
        candidate = Path(driver_root) / sub / LIBRARY
        if candidate.exists():
            return str(candidate)
    raise DeviceError(f"no {LIBRARY} below driver root {driver_root} "
                      f"(looked in {', '.join(LIBRARY_DIRS)})")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _usage(p: Any) -> ProcessUsage:
    """One NVML process record (pynvml gives None for NVML_VALUE_NOT_AVAILABLE)."""
    gi = getattr(p, "gpuInstanceId", NO_ID)
    used = p.usedGpuMemory
    return ProcessUsage(int(p.pid), None if gi is None or int(gi) == NO_ID else int(gi),
                        None if used is None else int(used))


def bus_key(bus_id: str) -> str:
    """A PCI bus ID in one spelling (NVML writes the domain with 8 or 4 digits)."""
    domain, _, rest = bus_id.strip().upper().partition(":")
    try:
        return f"{int(domain, 16):08X}:{rest}"
    except ValueError:
        return bus_id.strip().upper()


def _mig_mode(value: int) -> MigMode:
    return "enabled" if value == pynvml.NVML_DEVICE_MIG_ENABLE else "disabled"


class NvmlReader:
    """NVML, initialised on first use and kept open; thread-safe."""

    def __init__(self, driver_root: str = "/") -> None:
        self.driver_root = driver_root
        self._lock = threading.Lock()
        self._started = False
        self._profiles: dict[str, tuple[ProfileInfo, ...]] = {}
        """NVML's profile table per GPU UUID (fixed for a GPU: read once)."""
        self._unknowns: set[tuple[str, str]] = set()
        """(GPU UUID, field) whose topology read failed and was logged."""

    def read(self) -> DeviceSnapshot:
        with self._lock:
            try:
                self._start()
                return self._read()
            except pynvml.NVMLError as exc:
                if isinstance(exc, pynvml.NVMLError_Uninitialized |
                              pynvml.NVMLError_DriverNotLoaded):
                    self._started = False
                raise DeviceError(f"NVML: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._shutdown()

    def process_utilization(self, index: int, since_us: int
                            ) -> tuple[dict[int, float], int] | None:
        """Per host PID, the mean SM busy percent of NVML's samples of GPU ``index`` newer
        than ``since_us`` (0: every kept sample), and the newest sample's time to pass next;
        None where NVML does not say (MIG-enabled GPUs)."""
        with self._lock:
            try:
                self._start()
                h = pynvml.nvmlDeviceGetHandleByIndex(index)
                samples = pynvml.nvmlDeviceGetProcessUtilization(h, since_us)
            except pynvml.NVMLError_NotFound:
                return {}, since_us
            except pynvml.NVMLError_NotSupported:
                return None
            except pynvml.NVMLError as exc:
                raise DeviceError(f"NVML: {exc}") from exc
        sums: dict[int, list[float]] = {}
        newest = since_us
        for smp in samples:
            sums.setdefault(int(smp.pid), []).append(float(smp.smUtil))
            newest = max(newest, int(smp.timeStamp))
        return {pid: sum(v) / len(v) for pid, v in sums.items()}, newest

    def mig_profiles(self, index: int) -> tuple[ProfileInfo, ...]:
        """NVML's GPU-instance profile table of GPU ``index``, whatever its MIG mode (the
        snapshot carries it only while MIG is enabled); empty where the GPU has no MIG."""
        with self._lock:
            try:
                self._start()
                h = pynvml.nvmlDeviceGetHandleByIndex(index)
                return self._profile_table(h, _text(pynvml.nvmlDeviceGetUUID(h)))
            except pynvml.NVMLError as exc:
                raise DeviceError(f"NVML: {exc}") from exc

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self._lock:
            self._shutdown()
            yield

    def _shutdown(self) -> None:
        if self._started:
            self._started = False
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()

    def _start(self) -> None:
        if self._started:
            return
        lib = find_library(self.driver_root)
        if lib is not None and pynvml.nvmlLib is None:
            try:
                pynvml.nvmlLib = ctypes.CDLL(lib)
            except OSError as exc:
                raise DeviceError(f"cannot load {lib}: {exc}") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound as exc:
            raise DeviceError(f"NVML: {LIBRARY} not found (driver root "
                              f"{self.driver_root})") from exc
        self._started = True

    def _read(self) -> DeviceSnapshot:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        count = pynvml.nvmlDeviceGetCount()
        gpus = [self._gpu(i) for i in range(count)]
        by_bus = {bus_key(g.pci_bus_id): g.uuid for g in gpus}
        linked = [self._nvlinks(g) for g in gpus]
        return DeviceSnapshot(tuple(
            dataclasses.replace(g, nvlink_peers=tuple(sorted(
                {by_bus[b] for b in far if b in by_bus} - {g.uuid})))
            for g, far in zip(gpus, linked, strict=True)), driver)

    def _unknown(self, gpu: GPUState, what: str, exc: pynvml.NVMLError) -> None:
        """A topology read failed: the field stays unknown; said once per GPU and field."""
        if (gpu.uuid, what) not in self._unknowns:
            self._unknowns.add((gpu.uuid, what))
            log.warning("GPU topology unknown", extra={"gpu": gpu.index, "uuid": gpu.uuid,
                                                       "field": what, "error": str(exc)})

    def _numa_node(self, h: Any, gpu: GPUState) -> int | None:
        """The NUMA node the GPU is attached to: NVML's memory affinity (node scope), as
        ``nvidia-smi topo -m`` shows it (``nvmlDeviceGetNumaNodeId`` answers only where the
        GPU is a NUMA node itself, Grace platforms)."""
        try:
            mask = pynvml.nvmlDeviceGetMemoryAffinity(h, 1, pynvml.NVML_AFFINITY_SCOPE_NODE)
        except pynvml.NVMLError as exc:
            self._unknown(gpu, "numaNode", exc)
            return None
        word = int(mask[0])
        return (word & -word).bit_length() - 1 if word else None

    def _nvlinks(self, gpu: GPUState) -> set[str]:
        """The PCI bus IDs (:func:`bus_key`) at the far end of the GPU's active NVLinks; empty
        for a GPU without NVLink, or when a read fails (said once)."""
        far: set[str] = set()
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
            for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
                try:
                    if (pynvml.nvmlDeviceGetNvLinkState(h, link)
                            != pynvml.NVML_FEATURE_ENABLED):
                        continue
                except pynvml.NVMLError_NotSupported:
                    return set()  # no NVLink on this GPU
                except pynvml.NVMLError_InvalidArgument:
                    break  # past its last link
                far.add(bus_key(_text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)))
        except pynvml.NVMLError as exc:
            self._unknown(gpu, "nvlinkPeers", exc)
            return set()
        return far

    def _gpu(self, index: int) -> GPUState:
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(pynvml.nvmlDeviceGetUUID(h))
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        try:
            current, pending = pynvml.nvmlDeviceGetMigMode(h)
            mode: MigMode = _mig_mode(current)
            pending_mode: MigMode | None = (_mig_mode(pending) if pending != current
                                            else None)
        except pynvml.NVMLError_NotSupported:
            mode, pending_mode = "unsupported", None
        try:
            util: int | None = int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
        except pynvml.NVMLError_NotSupported:
            util = None
        instances: tuple[MigInstanceState, ...] = ()
        profiles: tuple[ProfileInfo, ...] = ()
        records = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        by_gi = self._processes(records)
        if mode == "enabled":
            profiles = self._profile_table(h, uuid)
            instances = self._instances(h, profiles, by_gi)
        pci = pynvml.nvmlDeviceGetPciInfo(h)
        gpu = GPUState(
            index=index, uuid=uuid, name=_text(pynvml.nvmlDeviceGetName(h)),
            pci_device_id=int(pci.pciDeviceId),
            memory_total_bytes=int(mem.total), memory_used_bytes=int(mem.used),
            utilization_percent=util, mig_mode=mode, mig_pending=pending_mode,
            instances=instances, profiles=profiles, processes=by_gi.get(NO_ID, ()),
            usage=tuple(_usage(p) for p in records), pci_bus_id=_text(pci.busId),
            minor=self._minor(h))
        return dataclasses.replace(gpu, numa_node=self._numa_node(h, gpu))

    @staticmethod
    def _minor(h: Any) -> int | None:
        try:
            return int(pynvml.nvmlDeviceGetMinorNumber(h))
        except pynvml.NVMLError_NotSupported:
            return None

    def _processes(self, records: list[Any]) -> dict[int, tuple[str, ...]]:
        """Processes on the GPU by GPU-instance ID (:data:`NO_ID`: outside MIG instances)."""
        out: dict[int, list[str]] = {}
        for p in records:
            gi = getattr(p, "gpuInstanceId", NO_ID)
            out.setdefault(NO_ID if gi is None else int(gi), []).append(
                process_name(int(p.pid)))
        return {k: tuple(sorted(set(v))) for k, v in out.items()}

    def _profile_table(self, h: Any, uuid: str) -> tuple[ProfileInfo, ...]:
        known = self._profiles.get(uuid)
        if known is not None:
            return known
        out = []
        for idx in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, idx)
            except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
                continue
            out.append(ProfileInfo(
                profile_id=int(info.id), name=_text(info.name).removeprefix("MIG "),
                memory_mib=int(info.memorySizeMB), compute_slices=int(info.sliceCount),
                max_count=int(info.instanceCount), sm_count=int(info.multiprocessorCount)))
        self._profiles[uuid] = table = tuple(out)
        return table

    def _instances(self, h: Any, profiles: tuple[ProfileInfo, ...],
                   by_gi: dict[int, tuple[str, ...]]) -> tuple[MigInstanceState, ...]:
        devices: dict[int, tuple[str, int | None, int | None, int | None]] = {}
        for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            except (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument):
                continue
            gi = int(pynvml.nvmlDeviceGetGpuInstanceId(m))
            if gi not in devices:
                mem = pynvml.nvmlDeviceGetMemoryInfo(m)
                devices[gi] = (_text(pynvml.nvmlDeviceGetUUID(m)), int(mem.total),
                               int(mem.used), int(pynvml.nvmlDeviceGetComputeInstanceId(m)))
        out = []
        for p in profiles:
            arr = (pynvml.c_nvmlGpuInstance_t * p.max_count)()
            n = ctypes.c_uint(p.max_count)
            pynvml.nvmlDeviceGetGpuInstances(h, p.profile_id, arr, ctypes.byref(n))
            for k in range(n.value):
                info = pynvml.nvmlGpuInstanceGetInfo(arr[k])
                uuid, total, used, ci = devices.get(int(info.id), ("", None, None, None))
                out.append(MigInstanceState(
                    profile_id=p.profile_id, profile=p.name,
                    start=int(info.placement.start), size=int(info.placement.size),
                    gi_id=int(info.id), uuid=uuid, ci_id=ci, memory_total_bytes=total,
                    memory_used_bytes=used, processes=by_gi.get(int(info.id), ())))
        return tuple(sorted(out, key=lambda i: (i.start, i.gi_id)))
