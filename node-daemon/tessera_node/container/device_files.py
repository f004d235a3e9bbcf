"""Which device files give a container its units, as the NVIDIA driver names them (pure).

On a GPU node a container reaches a GPU only through the GPU's device file,
``/dev/nvidia<minor>``, and a MIG device only through two more, the device files of the
access capabilities of its GPU instance and of its compute instance,
``/dev/nvidia-caps/nvidia-cap<N>``; NVML and CUDA inside enumerate what these open, re-indexed
from 0. The capabilities' minors ``N`` are listed by the driver in
``/proc/driver/nvidia-caps/mig-minors``, one ``<name> <minor>`` line each
(``gpu0/gi1/access 12``, ``gpu0/gi1/ci0/access 13``; the format is restated in
sim/README.md, "Device files and visibility"). NVIDIA's container toolkit mounts these files
for the devices a container is given; the ``sim`` visibility mounts the simulated node's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

CAPS_DIR = "nvidia-caps"


class Unit(Protocol):
    """What names a unit's device files (the device plugin's ``Unit`` is one)."""

    @property
    def uuid(self) -> str: ...
    @property
    def profile(self) -> str | None: ...
    @property
    def minor(self) -> int | None: ...
    @property
    def gi_id(self) -> int | None: ...
    @property
    def ci_id(self) -> int | None: ...


class DeviceFilesError(ValueError):
    """A unit whose device files cannot be named (unknown minor or instance IDs)."""


def parse_mig_minors(text: str) -> dict[str, int]:
    """``mig-minors`` as a map from capability name to minor; malformed lines are skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, minor = line.strip().partition(" ")
        if name and minor.strip().isdigit():
            out[name] = int(minor)
    return out


def unit_files(unit: Unit, minors: Mapping[str, int]) -> tuple[str, ...]:
    """A unit's device files, relative to the device directory: a GPU's ``nvidia<minor>``;
    a MIG instance's, its GPU's and its GI and CI access capabilities'."""
    if unit.minor is None:
        raise DeviceFilesError(f"the minor number of {unit.uuid}'s GPU is unknown")
    files = [f"nvidia{unit.minor}"]
    if unit.profile is None:
        return tuple(files)
    if unit.gi_id is None or unit.ci_id is None:
        raise DeviceFilesError(f"the GPU and compute instance IDs of {unit.uuid} are unknown")
    gi = f"gpu{unit.minor}/gi{unit.gi_id}"
    for cap in (f"{gi}/access", f"{gi}/ci{unit.ci_id}/access"):
        if cap not in minors:
            raise DeviceFilesError(f"{cap} ({unit.uuid}) is not in the driver's mig-minors")
        files.append(f"{CAPS_DIR}/nvidia-cap{minors[cap]}")
    return tuple(files)


def container_files(units: Sequence[str], known: Sequence[Unit],
                    minors: Mapping[str, int]) -> tuple[str, ...]:
    """The device files of a container's units (UUIDs), each once, in the units' order."""
    by_uuid = {u.uuid: u for u in known}
    out: list[str] = []
    for uuid in units:
        unit = by_uuid.get(uuid)
        if unit is None:
            raise DeviceFilesError(f"{uuid} is not a unit of this node")
        out += [f for f in unit_files(unit, minors) if f not in out]
    return tuple(out)

