"""The reference ``nvidia-smi`` (``build/bin/nvidia-smi-py``): the real tool's output formats
and error strings for the commands tessera's node daemon uses, computed from NVML calls
(pynvml) into the loaded ``libnvidia-ml.so.1``.  NVML owns all state and all MIG rules; this
module only formats.  The installed ``build/bin/nvidia-smi`` is the C tool (``tools/smi/``);
``tests/test_smi_c.py`` compares the two byte for byte, which is all this one is kept for.

Exit status: 0 on success, otherwise the NVML error code of the failure (2 for bad usage).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pynvml as nv

NAME_WIDTH = 16
INVALID_ARGS = (
    'Invalid combination of input arguments. Please run "nvidia-smi -h" for help.'
)


class UsageError(Exception):
    pass


class SmiFailure(Exception):
    """Already reported on stdout/stderr; carries the exit code."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def err_text(e: nv.NVMLError) -> str:
    return str(nv.nvmlErrorString(e.value))


# ----------------------------------------------------------------- devices

def all_devices() -> list[int]:
    return list(range(nv.nvmlDeviceGetCount()))


def select_devices(spec: str | None) -> list[int]:
    if spec is None:
        return all_devices()
    out: list[int] = []
    for item in spec.split(","):
        item = item.strip()
        if item.isdigit():
            if int(item) >= nv.nvmlDeviceGetCount():
                raise UsageError(f"Invalid GPU index: {item}")
            out.append(int(item))
            continue
        for i in all_devices():
            h = nv.nvmlDeviceGetHandleByIndex(i)
            bus = str(nv.nvmlDeviceGetPciInfo(h).busId)
            if item in (nv.nvmlDeviceGetUUID(h), bus) or bus.endswith(item.upper()):
                out.append(i)
                break
        else:
            raise UsageError(f"No devices were found matching {item}")
    return out


def handle(i: int) -> Any:
    return nv.nvmlDeviceGetHandleByIndex(i)


def bus_id(i: int) -> str:
    return str(nv.nvmlDeviceGetPciInfo(handle(i)).busId)


# ----------------------------------------------------------------- MIG helpers

@dataclass
class GIProfile:
    nvml_id: int
    smi_id: int
    name: str
    info: Any


def gi_profiles(dev: Any) -> list[GIProfile]:
    """Profiles the GPU supports, in the order nvidia-smi lists them (small to large)."""
    out: list[GIProfile] = []
    for pid in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(dev, pid)
        except nv.NVMLError as e:
            if e.value in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_INVALID_ARGUMENT):
                continue
            raise
        name = info.name.decode() if isinstance(info.name, bytes) else str(info.name)
        out.append(GIProfile(pid, int(info.id), name.removeprefix("MIG "), info))
    out.sort(key=lambda p: (p.info.sliceCount, p.info.memorySizeMB, p.smi_id))
    return out


def find_gi_profile(dev: Any, token: str) -> GIProfile:
    profiles = gi_profiles(dev)
    for p in profiles:
        if token.isdigit() and p.smi_id == int(token):
            return p
        if token.removeprefix("MIG ") == p.name:
            return p
    raise UsageError(f"Invalid GPU instance profile: {token}")


def gi_list(dev: Any, profile_id: int) -> list[Any]:
    count = ctypes.c_uint(8)
    arr = (nv.c_nvmlGpuInstance_t * 8)()
    nv.nvmlDeviceGetGpuInstances(dev, profile_id, arr, ctypes.byref(count))
    return [arr[k] for k in range(count.value)]


def placements(dev: Any, profile_id: int) -> list[Any]:
    count = ctypes.c_uint(8)
    arr = (nv.c_nvmlGpuInstancePlacement_t * 8)()
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(dev, profile_id, arr, ctypes.byref(count))
    return [arr[k] for k in range(count.value)]


def gpu_instances(dev: Any) -> list[tuple[Any, Any, GIProfile]]:
    out = []
    for p in gi_profiles(dev):
        for gi in gi_list(dev, p.smi_id):
            out.append((gi, nv.nvmlGpuInstanceGetInfo(gi), p))
    out.sort(key=lambda t: t[1].id)
    return out


@dataclass
class CIProfile:
    nvml_id: int
    name: str
    info: Any


def ci_profiles(gi: Any) -> list[CIProfile]:
    out = []
    for pid in range(nv.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, pid, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
        except nv.NVMLError as e:
            if e.value in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_INVALID_ARGUMENT):
                continue
            raise
        name = info.name.decode() if isinstance(info.name, bytes) else str(info.name)
        out.append(CIProfile(pid, name.removeprefix("MIG "), info))
    return out


def compute_instances(gi: Any) -> list[tuple[Any, Any, CIProfile]]:
    out = []
    for p in ci_profiles(gi):
        count = ctypes.c_uint(8)
        arr = (nv.c_nvmlComputeInstance_t * 8)()
        nv.nvmlGpuInstanceGetComputeInstances(gi, p.nvml_id, arr, ctypes.byref(count))
        for ci in [arr[k] for k in range(count.value)]:
            out.append((ci, nv.nvmlComputeInstanceGetInfo(ci), p))
    out.sort(key=lambda t: t[1].id)
    return out


def select_gis(dev: Any, gi_spec: str | None) -> list[tuple[Any, Any, GIProfile]]:
    gis = gpu_instances(dev)
    if gi_spec is None:
        return gis
    want = {int(x) for x in gi_spec.split(",")}
    return [g for g in gis if g[1].id in want]


def is_mig_enabled(i: int) -> bool:
    try:
        return bool(nv.nvmlDeviceGetMigMode(handle(i))[0])
    except nv.NVMLError:
        return False


# ----------------------------------------------------------------- boxes

def box(title: str, header: list[str], rows: list[list[str]], width: int, sep_each: bool) -> None:
    line = "+" + "-" * (width - 2) + "+"
    print(line)
    print("| " + title.ljust(width - 3) + "|")
    for h in header:
        print("|" + h.ljust(width - 2) + "|")
    print("|" + "=" * (width - 2) + "|")
    for group in rows:
        for r in group:
            print("|" + r.ljust(width - 2) + "|")
        if sep_each:
            print(line)
    if not sep_each:
        print(line)


def mig_lgip(gpus: list[int]) -> int:
    groups: list[list[str]] = []
    for i in gpus:
        dev = handle(i)
        if not is_mig_enabled(i):
            continue
        for p in gi_profiles(dev):
            info = p.info
            free = nv.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, p.smi_id)
            gib = f"{info.memorySizeMB / 1024:.2f}"
            p2p = "Yes" if info.isP2pSupported else "No"
            name = f"MIG {p.name}"
            first = (
                f"{i:>4}  {name:<{NAME_WIDTH}}{p.smi_id:>4}{f'{free}/{info.instanceCount}':>8}"
                f"{gib:>12}{p2p:>9}{info.multiprocessorCount:>7}{info.decoderCount:>6}"
                f"{info.encoderCount:>6}   "
            )
            second = " " * 55 + f"{info.copyEngineCount:>7}{info.jpegCount:>6}{info.ofaCount:>6}   "
            groups.append([first, second])
    if not groups:
        print("No MIG-enabled devices found.")
        return 0
    box(
        "GPU instance profiles:",
        [
            " GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  ",
            "                              Free/Total   GiB              CE    JPEG  OFA  ",
        ],
        groups,
        79,
        True,
    )
    return 0


def mig_lgipp(gpus: list[int]) -> int:
    for i in gpus:
        if not is_mig_enabled(i):
            continue
        dev = handle(i)
        for p in gi_profiles(dev):
            pl = placements(dev, p.smi_id)
            starts = ",".join(str(x.start) for x in pl)
            size = pl[0].size if pl else 0
            label = "Placements:" if len(pl) > 1 else "Placement :"
            print(f"GPU {i:>2} Profile ID {p.smi_id:>2} {label} {{{starts}}}:{size}")
    return 0


def mig_lgi(gpus: list[int], gi_spec: str | None) -> int:
    rows: list[list[str]] = []
    for i in gpus:
        if not is_mig_enabled(i):
            continue
        for _gi, info, p in select_gis(handle(i), gi_spec):
            place = f"{info.placement.start}:{info.placement.size}"
            rows.append(
                [
                    f"{i:>4}  {'MIG ' + p.name:<{NAME_WIDTH}}{p.smi_id:>6}{info.id:>9}"
                    f"{place:>13}     "
                ]
            )
    if not rows:
        print("No GPU instances found: Not Found")
        return int(nv.NVML_ERROR_NOT_FOUND)
    box(
        "GPU instances:",
        [
            " GPU   Name             Profile  Instance   Placement  ",
            "                          ID       ID       Start:Size ",
        ],
        [[r for g in rows for r in g]],
        57,
        False,
    )
    return 0


def mig_lci(gpus: list[int], gi_spec: str | None, ci_spec: str | None) -> int:
    rows: list[str] = []
    want_ci = None if ci_spec is None else {int(x) for x in ci_spec.split(",")}
    for i in gpus:
        if not is_mig_enabled(i):
            continue
        for gi, gi_info, _p in select_gis(handle(i), gi_spec):
            for _ci, info, cp in compute_instances(gi):
                if want_ci is not None and info.id not in want_ci:
                    continue
                place = f"{info.placement.start}:{info.placement.size}"
                rows.append(
                    f"{i:>4}{gi_info.id:>7}       {'MIG ' + cp.name:<{NAME_WIDTH}}"
                    f"{cp.nvml_id:>6}{info.id:>10}{place:>13}     "
                )
    if not rows:
        print("No compute instances found: Not Found")
        return int(nv.NVML_ERROR_NOT_FOUND)
    box(
        "Compute instances:",
        [
            " GPU     GPU       Name             Profile   Instance   Placement  ",
            "       Instance                       ID        ID       Start:Size ",
            "         ID                                                         ",
        ],
        [rows],
        70,
        False,
    )
    return 0


def mig_lcip(gpus: list[int], gi_spec: str | None) -> int:
    groups: list[list[str]] = []
    for i in gpus:
        if not is_mig_enabled(i):
            continue
        for gi, gi_info, gp in select_gis(handle(i), gi_spec):
            for cp in ci_profiles(gi):
                info = cp.info
                free = nv.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, cp.nvml_id)
                star = "*" if info.sliceCount == gp.info.sliceCount else " "
                first = (
                    f"{i:>4}{gi_info.id:>7}       {'MIG ' + cp.name:<{NAME_WIDTH}}"
                    f"{cp.nvml_id:>6}{star}{f'{free}/{info.instanceCount}':>9}"
                    f"{info.multiprocessorCount:>13}{info.sharedDecoderCount:>9}"
                    f"{info.sharedEncoderCount:>6}{info.sharedOfaCount:>6}   "
                )
                second = (
                    " " * 62
                    + f"{info.sharedCopyEngineCount:>7}{info.sharedJpegCount:>6}"
                    + " " * 9
                )
                groups.append([first, second])
    if not groups:
        print("No GPU instances found: Not Found")
        return int(nv.NVML_ERROR_NOT_FOUND)
    box(
        "Compute instance profiles:",
        [
            " GPU     GPU       Name             Profile  Instances   Exclusive"
            "       Shared         ",
            "       Instance                       ID     Free/Total     SM     "
            "  DEC   ENC   OFA  ",
            "         ID                                                        "
            "  CE    JPEG       ",
        ],
        groups,
        88,
        True,
    )
    return 0


def default_ci(gi: Any, gp: GIProfile) -> CIProfile:
    for cp in ci_profiles(gi):
        if cp.info.sliceCount == gp.info.sliceCount:
            return cp
    raise UsageError("no default compute instance profile")


def create_ci(i: int, gi: Any, gi_id: int, cp: CIProfile, start: int | None) -> None:
    if start is None:
        ci = nv.nvmlGpuInstanceCreateComputeInstance(gi, cp.nvml_id)
    else:
        pl = nv.c_nvmlComputeInstancePlacement_t()
        pl.start = start
        pl.size = cp.info.sliceCount
        ci = nv.nvmlGpuInstanceCreateComputeInstanceWithPlacement(gi, cp.nvml_id, ctypes.byref(pl))
    info = nv.nvmlComputeInstanceGetInfo(ci)
    print(
        f"Successfully created compute instance ID {info.id:>2} on GPU {i:>2} GPU instance ID "
        f"{gi_id:>2} using profile MIG {cp.name} (ID {cp.nvml_id:>2})"
    )


def split_placement(token: str) -> tuple[str, int | None]:
    name, sep, start = token.rpartition(":")
    if sep and start.isdigit():
        return name, int(start)
    return token, None


def mig_cgi(gpus: list[int], spec: str, with_ci: bool) -> int:
    for i in gpus:
        dev = handle(i)
        for token in [t.strip() for t in spec.split(",") if t.strip()]:
            ptoken, start = split_placement(token)
            p = find_gi_profile(dev, ptoken)
            try:
                if start is None:
                    gi = nv.nvmlDeviceCreateGpuInstance(dev, p.smi_id)
                else:
                    pl = nv.c_nvmlGpuInstancePlacement_t()
                    pl.start = start
                    pl.size = placements(dev, p.smi_id)[0].size
                    gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(
                        dev, p.smi_id, ctypes.byref(pl)
                    )
            except nv.NVMLError as e:
                print(
                    f"Unable to create a GPU instance on GPU {i:>2} using profile {ptoken}: "
                    f"{err_text(e)}"
                )
                print(f"Failed to create GPU instances: {err_text(e)}")
                return int(e.value)
            info = nv.nvmlGpuInstanceGetInfo(gi)
            print(
                f"Successfully created GPU instance ID {info.id:>2} on GPU {i:>2} using profile "
                f"MIG {p.name} (ID {p.smi_id:>2})"
            )
            if with_ci:
                try:
                    create_ci(i, gi, info.id, default_ci(gi, p), None)
                except nv.NVMLError as e:
                    return ci_create_failed(i, info.id, p.name, e)
    return 0


def ci_create_failed(gpu: int, gi_id: int, profile: str, e: nv.NVMLError) -> int:
    """Print nvidia-smi's two lines for a failed compute-instance creation; its exit status."""
    print(
        f"Unable to create a compute instance on GPU {gpu:>2} GPU instance ID "
        f"{gi_id:>2} using profile {profile}: {err_text(e)}"
    )
    print(f"Failed to create compute instances: {err_text(e)}")
    return int(e.value)


def mig_cci(gpus: list[int], spec: str | None, gi_spec: str | None) -> int:
    for i in gpus:
        for gi, gi_info, gp in select_gis(handle(i), gi_spec):
            tokens = [t.strip() for t in spec.split(",")] if spec else [""]
            for token in tokens:
                ptoken, start = split_placement(token)
                if not ptoken:
                    cp = default_ci(gi, gp)
                else:
                    matches = [
                        c for c in ci_profiles(gi)
                        if (ptoken.isdigit() and c.nvml_id == int(ptoken))
                        or ptoken.removeprefix("MIG ") == c.name
                    ]
                    if not matches:
                        raise UsageError(f"Invalid compute instance profile: {ptoken}")
                    cp = matches[0]
                try:
                    create_ci(i, gi, gi_info.id, cp, start)
                except nv.NVMLError as e:
                    return ci_create_failed(i, gi_info.id, ptoken or cp.name, e)
    return 0


def mig_dci(gpus: list[int], gi_spec: str | None, ci_spec: str | None) -> int:
    want = None if ci_spec is None else {int(x) for x in ci_spec.split(",")}
    found = False
    for i in gpus:
        for gi, gi_info, _p in select_gis(handle(i), gi_spec):
            for ci, info, _cp in compute_instances(gi):
                if want is not None and info.id not in want:
                    continue
                found = True
                try:
                    nv.nvmlComputeInstanceDestroy(ci)
                except nv.NVMLError as e:
                    print(
                        f"Unable to destroy compute instance ID {info.id:>2} from GPU {i:>2} GPU "
                        f"instance ID {gi_info.id:>2}: {err_text(e)}"
                    )
                    print(f"Failed to destroy compute instances: {err_text(e)}")
                    return int(e.value)
                print(
                    f"Successfully destroyed compute instance ID {info.id:>2} from GPU {i:>2} GPU "
                    f"instance ID {gi_info.id:>2}"
                )
    if not found:
        print("No compute instances found: Not Found")
        return int(nv.NVML_ERROR_NOT_FOUND)
    return 0


def mig_dgi(gpus: list[int], gi_spec: str | None) -> int:
    found = False
    for i in gpus:
        for gi, info, _p in select_gis(handle(i), gi_spec):
            found = True
            try:
                nv.nvmlGpuInstanceDestroy(gi)
            except nv.NVMLError as e:
                print(
                    f"Unable to destroy GPU instance ID {info.id:>2} from GPU {i:>2}: "
                    f"{err_text(e)}"
                )
                print(f"Failed to destroy GPU instances: {err_text(e)}")
                return int(e.value)
            print(f"Successfully destroyed GPU instance ID {info.id:>2} from GPU {i:>2}")
    if not found:
        print("No GPU instances found: Not Found")
        return int(nv.NVML_ERROR_NOT_FOUND)
    return 0


# ----------------------------------------------------------------- top-level commands

def list_gpus() -> int:
    for i in all_devices():
        dev = handle(i)
        print(f"GPU {i}: {nv.nvmlDeviceGetName(dev)} (UUID: {nv.nvmlDeviceGetUUID(dev)})")
        if not is_mig_enabled(i):
            continue
        for k in range(nv.nvmlDeviceGetMaxMigDeviceCount(dev)):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(dev, k)
            except nv.NVMLError:
                break
            profile = str(nv.nvmlDeviceGetName(mig)).split(" MIG ", 1)[-1]
            print(f"  MIG {profile:<12} Device {k:>2}: (UUID: {nv.nvmlDeviceGetUUID(mig)})")
    return 0


def mib(b: int) -> int:
    return b // (1024 * 1024)


GPU_FIELDS: dict[str, tuple[str, Callable[[int], tuple[str, str]]]] = {}


def _mode(i: int, pending: bool) -> str:
    try:
        return "Enabled" if nv.nvmlDeviceGetMigMode(handle(i))[1 if pending else 0] else "Disabled"
    except nv.NVMLError:
        return "[N/A]"


def _util(i: int) -> tuple[str, str]:
    try:
        v = nv.nvmlDeviceGetUtilizationRates(handle(i)).gpu
        return f"{v} %", str(v)
    except nv.NVMLError:
        return "[N/A]", "[N/A]"


def _mem(i: int, what: str) -> tuple[str, str]:
    m = nv.nvmlDeviceGetMemoryInfo(handle(i))
    v = mib(getattr(m, what))
    return f"{v} MiB", str(v)


def _plain(f: Callable[[int], Any]) -> Callable[[int], tuple[str, str]]:
    return lambda i: (str(f(i)), str(f(i)))


GPU_FIELDS.update(
    {
        "index": ("index", _plain(lambda i: i)),
        "count": ("count", _plain(lambda i: nv.nvmlDeviceGetCount())),
        "name": ("name", _plain(lambda i: nv.nvmlDeviceGetName(handle(i)))),
        "gpu_name": ("name", _plain(lambda i: nv.nvmlDeviceGetName(handle(i)))),
        "uuid": ("uuid", _plain(lambda i: nv.nvmlDeviceGetUUID(handle(i)))),
        "gpu_uuid": ("uuid", _plain(lambda i: nv.nvmlDeviceGetUUID(handle(i)))),
        "pci.bus_id": ("pci.bus_id", _plain(bus_id)),
        "gpu_bus_id": ("pci.bus_id", _plain(bus_id)),
        "pci.device_id": ("pci.device_id", _plain(
            lambda i: f"0x{nv.nvmlDeviceGetPciInfo(handle(i)).pciDeviceId:08X}")),
        "driver_version": ("driver_version", _plain(lambda i: nv.nvmlSystemGetDriverVersion())),
        "memory.total": ("memory.total [MiB]", lambda i: _mem(i, "total")),
        "memory.used": ("memory.used [MiB]", lambda i: _mem(i, "used")),
        "memory.free": ("memory.free [MiB]", lambda i: _mem(i, "free")),
        "utilization.gpu": ("utilization.gpu [%]", _util),
        "mig.mode.current": ("mig.mode.current", _plain(lambda i: _mode(i, False))),
        "mig.mode.pending": ("mig.mode.pending", _plain(lambda i: _mode(i, True))),
        "compute_cap": ("compute_cap", _plain(
            lambda i: ".".join(map(str, nv.nvmlDeviceGetCudaComputeCapability(handle(i)))))),
    }
)


def parse_format(fmt: str | None) -> tuple[bool, bool]:
    if fmt is None:
        raise UsageError('"--format=" switch is missing. Please try again.')
    parts = fmt.split(",")
    if parts[0] != "csv" or any(p not in ("csv", "noheader", "nounits") for p in parts):
        raise UsageError(INVALID_ARGS)
    return "noheader" in parts, "nounits" in parts


def query_gpu(fields: str, fmt: str | None, gpus: list[int]) -> int:
    noheader, nounits = parse_format(fmt)
    names = [f.strip() for f in fields.split(",") if f.strip()]
    for n in names:
        if n not in GPU_FIELDS:
            raise UsageError(f'Field "{n}" is not a valid field to query.')
    if not noheader:
        header = [GPU_FIELDS[n][0] for n in names]
        if nounits:
            header = [h.split(" [")[0] for h in header]
        print(", ".join(header))
    for i in gpus:
        row = []
        for n in names:
            with_unit, bare = GPU_FIELDS[n][1](i)
            row.append(bare if nounits else with_unit)
        print(", ".join(row))
    return 0


def query_apps(fields: str, fmt: str | None, gpus: list[int]) -> int:
    noheader, nounits = parse_format(fmt)
    names = [f.strip() for f in fields.split(",") if f.strip()]
    headers = {
        "pid": "pid", "process_name": "process_name", "name": "process_name",
        "used_gpu_memory": "used_gpu_memory [MiB]", "used_memory": "used_gpu_memory [MiB]",
        "gpu_uuid": "gpu_uuid", "gpu_bus_id": "gpu_bus_id", "gpu_name": "gpu_name",
    }
    for n in names:
        if n not in headers:
            raise UsageError(f'Field "{n}" is not a valid field to query.')
    if not noheader:
        hs = [headers[n] for n in names]
        print(", ".join(h.split(" [")[0] if nounits else h for h in hs))
    for i in gpus:
        dev = handle(i)
        for p in nv.nvmlDeviceGetComputeRunningProcesses(dev):
            values = {
                "pid": str(p.pid),
                "process_name": _proc_name(p.pid),
                "name": _proc_name(p.pid),
                "used_gpu_memory": str(mib(p.usedGpuMemory)) + ("" if nounits else " MiB"),
                "used_memory": str(mib(p.usedGpuMemory)) + ("" if nounits else " MiB"),
                "gpu_uuid": nv.nvmlDeviceGetUUID(dev),
                "gpu_bus_id": bus_id(i),
                "gpu_name": nv.nvmlDeviceGetName(dev),
            }
            print(", ".join(values[n] for n in names))
    return 0


def _proc_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0].decode() or "[Not Found]"
    except OSError:
        return "[Not Found]"


def set_mig_mode(gpus: list[int], mode: int) -> int:
    rc = 0
    for i in gpus:
        bus = bus_id(i)
        word = "enable" if mode else "disable"
        try:
            status = nv.nvmlDeviceSetMigMode(handle(i), mode)
        except nv.NVMLError as e:
            print(f"Unable to {word} MIG Mode for GPU {bus}: {err_text(e)}")
            rc = int(e.value)
            continue
        if status != nv.NVML_SUCCESS:
            print(f"Warning: MIG mode is in pending {word} state for GPU {bus}:"
                  f"{nv.nvmlErrorString(status)}")
            print(f"Reboot the system or try nvidia-smi --gpu-reset to make MIG mode effective "
                  f"on GPU {bus}")
        else:
            print(f"{'Enabled' if mode else 'Disabled'} MIG Mode for GPU {bus}")
    print("All done.")
    return rc


def reset(gpus: list[int]) -> int:
    lib = nv.nvmlLib
    fn = getattr(lib, "tesseraSimResetGpu", None)
    if fn is None:
        print("GPU reset is not supported by this NVML library.")
        return int(nv.NVML_ERROR_NOT_SUPPORTED)
    rc = 0
    for i in gpus:
        r = int(fn(ctypes.c_uint(i)))
        if r == nv.NVML_ERROR_IN_USE:
            print(
                f"Unable to reset GPU {bus_id(i)} because it's being used by some other process "
                "(e.g. CUDA application, graphics application like X server, monitoring "
                "application like other instance of nvidia-smi). Please first kill all processes "
                "using this "
                "GPU and all compute applications running in the system."
            )
            rc = r
        elif r != 0:
            print(f"Unable to reset GPU {bus_id(i)}: {nv.nvmlErrorString(r)}")
            rc = r
        else:
            print(f"GPU {bus_id(i)} was successfully reset.")
    if rc == 0:
        print("All done.")
    return rc


# ----------------------------------------------------------------- argument parsing

def take(args: list[str], *names: str) -> str | None:
    """Remove `--name=value`, `--name value` or `-n value` from args; return the value."""
    for k, a in enumerate(args):
        for n in names:
            if a == n:
                if k + 1 >= len(args):
                    raise UsageError(f"Option {n} requires a value.")
                value = args[k + 1]
                del args[k : k + 2]
                return value
            if n.startswith("--") and a.startswith(n + "="):
                del args[k]
                return a[len(n) + 1 :]
    return None


def flag(args: list[str], *names: str) -> bool:
    for n in names:
        if n in args:
            args.remove(n)
            return True
    return False


def run(argv: list[str]) -> int:
    args = list(argv)
    if args and args[0] == "mig":
        args = args[1:]
        gpu_spec = take(args, "-i", "--id")
        gi_spec = take(args, "-gi", "--gpu-instance-id")
        ci_spec = take(args, "-ci", "--compute-instance-id")
        gpus = select_devices(gpu_spec)
        if flag(args, "-lgip", "--list-gpu-instance-profiles"):
            return mig_lgip(gpus)
        if flag(args, "-lgipp", "--list-gpu-instance-possible-placements"):
            return mig_lgipp(gpus)
        if flag(args, "-lgi", "--list-gpu-instances"):
            return mig_lgi(gpus, gi_spec)
        if flag(args, "-lcip", "--list-compute-instance-profiles"):
            return mig_lcip(gpus, gi_spec)
        if flag(args, "-lci", "--list-compute-instances"):
            return mig_lci(gpus, gi_spec, ci_spec)
        cgi = take(args, "-cgi", "--create-gpu-instance")
        if cgi is not None:
            return mig_cgi(gpus, cgi, flag(args, "-C", "--default-compute-instance"))
        if "-cci" in args or "--create-compute-instance" in args:
            k = args.index("-cci") if "-cci" in args else args.index("--create-compute-instance")
            spec = args[k + 1] if k + 1 < len(args) and not args[k + 1].startswith("-") else None
            return mig_cci(gpus, spec, gi_spec)
        if flag(args, "-dci", "--destroy-compute-instance"):
            return mig_dci(gpus, gi_spec, ci_spec)
        if flag(args, "-dgi", "--destroy-gpu-instance"):
            return mig_dgi(gpus, gi_spec)
        raise UsageError(INVALID_ARGS.replace("nvidia-smi -h", "nvidia-smi mig -h"))
    gpu_spec = take(args, "-i", "--id")
    if flag(args, "-L", "--list-gpus"):
        return list_gpus()
    mig = take(args, "-mig", "--multi-instance-gpu")
    if mig is not None:
        if mig not in ("0", "1"):
            raise UsageError(f"Invalid MIG mode: {mig}")
        return set_mig_mode(select_devices(gpu_spec), int(mig))
    if flag(args, "-r", "--gpu-reset"):
        if gpu_spec is None:
            raise UsageError("GPU reset requires -i.")
        return reset(select_devices(gpu_spec))
    fmt = take(args, "--format")
    q = take(args, "--query-gpu")
    if q is not None:
        return query_gpu(q, fmt, select_devices(gpu_spec))
    q = take(args, "--query-compute-apps")
    if q is not None:
        return query_apps(q, fmt, select_devices(gpu_spec))
    if not args:
        return list_gpus()
    raise UsageError(INVALID_ARGS)


def main(argv: Iterable[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        nv.nvmlInit()
    except nv.NVMLError as e:
        print(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running."
        )
        return int(e.value) if isinstance(e.value, int) else 9
    try:
        return run(argv)
    except UsageError as e:
        print(str(e))
        return 2
    except nv.NVMLError as e:
        print(err_text(e))
        return int(e.value)
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: stop quietly, as the real tool does.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        nv.nvmlShutdown()


if __name__ == "__main__":
    sys.exit(main())
