"""Other GPU stacks on this node: NVIDIA's device plugin and MIG manager (pure; the sockets
in the kubelet's device-plugin directory are read by :mod:`tessera_node.device.sockets`).

tessera-node never fights them: beside another MIG manager it changes no MIG layout (its
reports say so), and beside another GPU device plugin it only reports (two plugins handing
out the same GPUs would double-book them).  docs/node-daemon.md says how to run beside
NVIDIA's GPU Operator.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from tessera.api.names import (
    NVIDIA_DEVICE_PLUGIN_DEPLOY_LABEL,
    NVIDIA_DEVICE_PLUGIN_SOCKET,
    NVIDIA_GPU_RESOURCE,
    NVIDIA_MIG_CONFIG_LABEL,
    NVIDIA_MIG_MANAGER_DEPLOY_LABEL,
    NVIDIA_MIG_RESOURCE_PREFIX,
)
from tessera_node.node.findings import Finding


def detect(node: Mapping[str, Any] | None, sockets: Iterable[str], socket_dir: str
           ) -> list[Finding]:
    meta = (node or {}).get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    capacity: Mapping[str, str] = ((node or {}).get("status") or {}).get("capacity") or {}
    out: list[Finding] = []
    if NVIDIA_DEVICE_PLUGIN_SOCKET in set(sockets):
        out.append(Finding("OtherDevicePlugin", "NVIDIA's device plugin is registered with the "
                           f"kubelet ({os.path.join(socket_dir, NVIDIA_DEVICE_PLUGIN_SOCKET)})"))
    nvidia = sorted(k for k in capacity if k == NVIDIA_GPU_RESOURCE
                    or k.startswith(NVIDIA_MIG_RESOURCE_PREFIX))
    if nvidia:
        out.append(Finding("OtherDevicePlugin", "the node advertises "
                           f"{', '.join(f'{k}={capacity[k]}' for k in nvidia)} "
                           "(another GPU device plugin)"))
    if labels.get(NVIDIA_DEVICE_PLUGIN_DEPLOY_LABEL) == "true":
        out.append(Finding("OtherDevicePlugin", f"label {NVIDIA_DEVICE_PLUGIN_DEPLOY_LABEL}=true: "
                           "NVIDIA's GPU Operator runs its device plugin here"))
    if NVIDIA_MIG_CONFIG_LABEL in labels:
        out.append(Finding("OtherMigManager", f"label {NVIDIA_MIG_CONFIG_LABEL}="
                           f"{labels[NVIDIA_MIG_CONFIG_LABEL]}: NVIDIA's MIG manager owns MIG"))
    elif labels.get(NVIDIA_MIG_MANAGER_DEPLOY_LABEL) == "true":
        out.append(Finding("OtherMigManager", f"label {NVIDIA_MIG_MANAGER_DEPLOY_LABEL}=true: "
                           "NVIDIA's GPU Operator runs its MIG manager here"))
    return out
