"""The CDI spec of a prepared claim (pure): what the container runtime adds to each container
that uses the claim, named by the CDI device ID the plugin answers the kubelet.

The kubelet hands a claim's CDI device IDs to the runtime (CRI ``CDI_devices``; the
kubelets 1.34 to 1.37 pass them no other way), and containerd with CDI on resolves each in
the spec files of its CDI directories (``/var/run/cdi`` by default: a tmpfs, empty after a
reboot, so prepare writes the spec again whenever it is asked). One spec file per claim, one
device in it, ``gpu.tessera.dev/claim=<claim UID>``, whose ``containerEdits`` are what the
device plugin's Allocate gives a container (:mod:`tessera_node.container.response`):
libtessera and its ``ld.so.preload``, the claim's budget file (read-only) and ledger,
tessera's marker (so libtessera never runs without a budget), and the visibility of exactly
the allocated units. With the ``cdi`` visibility the units are the NVIDIA toolkit's own CDI
devices (``nvidia.com/gpu=<UUID>``), answered beside tessera's.
"""

from __future__ import annotations

from typing import Any

from tessera.api.names import DRA_DRIVER
from tessera_node.container.response import ContainerResponse, Mount

CDI_VERSION = "0.6.0"
"""The CDI spec version written: every field used here exists in it."""
CLASS = "claim"
KIND = f"{DRA_DRIVER}/{CLASS}"
BIND_OPTIONS = ("nosuid", "nodev", "rbind", "rprivate")


def device_id(claim_uid: str) -> str:
    """``gpu.tessera.dev/claim=<uid>``: the fully qualified CDI name of a claim's device."""
    return f"{KIND}={claim_uid}"


def file_name(claim_uid: str) -> str:
    """The claim's spec file in the CDI directory."""
    return f"{DRA_DRIVER}-{CLASS}-{claim_uid}.json"


def device_ids(claim_uid: str, response: ContainerResponse) -> list[str]:
    """Every CDI device a container of the claim gets: tessera's, then the toolkit's."""
    return [device_id(claim_uid), *response.cdi_devices]


def _mount(m: Mount) -> dict[str, Any]:
    return {"hostPath": m.host_path, "containerPath": m.container_path, "type": "bind",
            "options": ["ro" if m.read_only else "rw", *BIND_OPTIONS]}


def spec(claim_uid: str, response: ContainerResponse) -> dict[str, Any]:
    """The spec file's content (JSON)."""
    edits: dict[str, Any] = {"mounts": [_mount(m) for m in response.mounts]}
    if response.envs:
        edits["env"] = [f"{k}={v}" for k, v in sorted(response.envs.items())]
    return {"cdiVersion": CDI_VERSION, "kind": KIND,
            "devices": [{"name": claim_uid, "containerEdits": edits}]}
