"""What a container tessera sets up gets (pure): mounts, device visibility, environment; the
device plugin answers it from Allocate, the DRA driver writes it into a CDI spec.

* libtessera, read-only, from a **versioned** host directory (an upgrade installs a new
  directory and never rewrites a library a running container has mapped), and an
  ``ld.so.preload`` that loads it, mounted over ``/etc/ld.so.preload``;
* the container's ledger (the file alone, writable: it can be written and truncated but
  not removed or replaced) at ``/run/tessera/ledger``, its budget file (read-only) at
  ``/run/tessera/budget`` and tessera's marker (read-only) at ``/run/tessera/managed``: with
  the marker, libtessera refuses GPU memory rather than run without a budget;
* device visibility. ``cdi``: CDI device names (``nvidia.com/gpu=<UUID>``, the toolkit's
  CDI spec with UUID names). ``volume-mounts``: the NVIDIA container toolkit's
  volume-mount device list (``/var/run/nvidia-container-devices/<UUID>``), which, unlike a
  device list in ``NVIDIA_VISIBLE_DEVICES``, a pod cannot set for itself (the variable only
  names the folder, as NVIDIA's device plugin sets it). ``sim``: the simulated node
  (containerd without CDI): the simulator's libraries and node state are mounted, as the
  toolkit would mount the driver's, and, read-only in one device directory that
  ``TESSERA_SIM_DEV`` names, exactly the device files of the container's units
  (:mod:`~tessera_node.container.device_files`), as the toolkit would mount the
  ``/dev/nvidia*`` nodes: NVML and CUDA inside see only those units, re-indexed from 0. No
  ``CUDA_VISIBLE_DEVICES``: NVIDIA's plugin sets none either, the device files do the work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Literal

Visibility = Literal["cdi", "volume-mounts", "sim"]

CONTAINER_LIB_DIR = "/usr/local/lib/tessera"
LIB_NAME = "libtessera.so"
PRELOAD_NAME = "ld.so.preload"
CONTAINER_RUN = "/run/tessera"
CDI_KIND = "nvidia.com/gpu"
TOOLKIT_DEVICE_LIST_DIR = "/var/run/nvidia-container-devices"
SIM_CONTAINER_DIR = "/usr/local/tessera-sim"
SIM_DEV_DIR = f"{SIM_CONTAINER_DIR}/dev"
SIM_MIG_MINORS = "proc/driver/nvidia-caps/mig-minors"


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True)
class ContainerResponse:
    mounts: tuple[Mount, ...] = ()
    envs: dict[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostPaths:
    lib_dir: str
    """Versioned host directory holding ``libtessera.so`` and ``ld.so.preload`` (whose line
    names ``CONTAINER_LIB_DIR/libtessera.so``)."""
    budget: str
    ledger: str
    """The ledger file the daemon created."""
    marker: str


@dataclass(frozen=True)
class SimPaths:
    """The simulated node: its driver libraries' directory, node description and state, and
    below the state file's directory (the node's root) its device files and the driver's
    capability table (sim/README.md, "Device files and visibility")."""

    lib_dir: str
    node: str
    state: str
    dev_dir: str
    mig_minors: str

    @classmethod
    def of(cls, lib_dir: str, node: str) -> SimPaths:
        """The paths of the node described by ``node`` (its state beside it, as the
        simulator's default)."""
        state = f"{node}.state"
        root = PurePosixPath(state).parent
        return cls(lib_dir, node, state, str(root / "dev"), str(root / SIM_MIG_MINORS))


def preload_line() -> str:
    """The content of the ``ld.so.preload`` the plugin mounts."""
    return f"{CONTAINER_LIB_DIR}/{LIB_NAME}\n"


def container_response(
    paths: HostPaths,
    units: Sequence[str],
    visibility: Visibility,
    sim: SimPaths | None = None,
    device_files: Sequence[str] = (),
) -> ContainerResponse:
    """``units``: the container's GPU/MIG UUIDs, in the order of its device IDs;
    ``device_files``: with ``sim``, their device files (relative to ``sim.dev_dir``)."""
    lib = PurePosixPath(paths.lib_dir)
    mounts = [
        Mount(f"{CONTAINER_LIB_DIR}/{LIB_NAME}", str(lib / LIB_NAME), True),
        Mount("/etc/ld.so.preload", str(lib / PRELOAD_NAME), True),
        Mount(f"{CONTAINER_RUN}/ledger", paths.ledger, False),
        Mount(f"{CONTAINER_RUN}/budget", paths.budget, True),
        Mount(f"{CONTAINER_RUN}/managed", paths.marker, True),
    ]
    envs: dict[str, str] = {}
    cdi: tuple[str, ...] = ()
    if visibility == "cdi":
        cdi = tuple(f"{CDI_KIND}={u}" for u in units)
    elif visibility == "volume-mounts":
        mounts += [Mount(f"{TOOLKIT_DEVICE_LIST_DIR}/{u}", "/dev/null", True) for u in units]
        # what NVIDIA's device plugin sets with this strategy: the variable names the folder,
        # not devices; the toolkit (accept-nvidia-visible-devices-as-volume-mounts = true,
        # accept-nvidia-visible-devices-envvar-when-unprivileged = false) reads the mounts and
        # ignores a device list a pod sets itself
        envs = {"NVIDIA_VISIBLE_DEVICES": TOOLKIT_DEVICE_LIST_DIR}
    else:
        if sim is None:
            raise ValueError("the sim visibility needs the simulator's paths")
        mounts += [
            Mount(f"{SIM_CONTAINER_DIR}/lib", sim.lib_dir, True),
            Mount(f"{SIM_CONTAINER_DIR}/node.ini", sim.node, True),
            # the simulated driver's shared state is the node's, like /dev/nvidiactl
            Mount(f"{SIM_CONTAINER_DIR}/node.state", sim.state, False),
        ]
        # the units' device files, the same file for every container on a unit
        mounts += [Mount(f"{SIM_DEV_DIR}/{f}", f"{sim.dev_dir}/{f}", True)
                   for f in device_files]
        envs = {
            "LD_LIBRARY_PATH": f"{SIM_CONTAINER_DIR}/lib",
            "TESSERA_SIM_NODE": f"{SIM_CONTAINER_DIR}/node.ini",
            "TESSERA_SIM_STATE": f"{SIM_CONTAINER_DIR}/node.state",
            "TESSERA_SIM_DEV": SIM_DEV_DIR,
        }
    return ContainerResponse(mounts=tuple(mounts), envs=envs, cdi_devices=cdi)
