"""Which pod and container a process belongs to, from its ``/proc/<pid>/cgroup`` (pure).

The kubelet puts each pod in a cgroup named after the pod's UID, and the runtime each
container in a child named after the container's ID. The kernel writes this file; a
process cannot change it without the privilege to move itself between cgroups, so it names
a process's pod more reliably than anything the container writes (the hook's ledger is
writable from inside the container). Both kubelet cgroup drivers, cgroup v1 and v2, and
any prefix (nested runtimes, kind nodes) are understood:

    4:pids:/kubepods/besteffort/pod<uid>/<64 hex>                          cgroupfs
    0::/kubepods.slice/kubepods-burstable.slice/
        kubepods-burstable-pod<uid with _>.slice/cri-containerd-<64 hex>.scope   systemd
    0::/…/kubelet-kubepods-besteffort-pod<uid with _>.slice/cri-containerd-….scope   kind
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD_SEGMENT = re.compile(rf"^(?:[a-z]+(?:-[a-z]+)*-)?pod({_UID})(?:\.slice)?$")
_CONTAINER_SEGMENT = re.compile(
    r"^(?:(?:cri-containerd|docker|crio|cri-o)-)?([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True)
class CgroupOwner:
    pod_uid: str
    container_id: str | None
    """None: the process sits in the pod's cgroup itself, or a runtime names it otherwise."""


def owner_in_path(path: str) -> CgroupOwner | None:
    """The pod (and container) one cgroup path names; None outside any pod."""
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts) - 1, -1, -1):
        m = _POD_SEGMENT.match(parts[i])
        if m is None:
            continue
        uid = m.group(1).replace("_", "-")
        cid = None
        if i + 1 < len(parts):
            c = _CONTAINER_SEGMENT.match(parts[i + 1])
            cid = c.group(1) if c else None
        return CgroupOwner(uid, cid)
    return None


class ConflictingCgroups(ValueError):
    """The hierarchies of a cgroup v1 host put the process in different pods."""


def cgroup_owner(text: str) -> CgroupOwner | None:
    """The pod and container of a process from its ``/proc/<pid>/cgroup``; None when no
    hierarchy puts it in a pod. Hierarchies that name the pod but no container (cgroup v1)
    do not disagree with one that names it. Raises :class:`ConflictingCgroups` when two name
    different pods or containers (only a process allowed to move itself does that: trust
    neither)."""
    found: set[CgroupOwner] = set()
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        owner = owner_in_path(fields[2])
        if owner is not None:
            found.add(owner)
    if not found:
        return None
    pods = {o.pod_uid for o in found}
    containers = {o.container_id for o in found if o.container_id is not None}
    if len(pods) > 1 or len(containers) > 1:
        raise ConflictingCgroups(", ".join(sorted(
            f"pod {o.pod_uid} container {o.container_id}" for o in found)))
    return CgroupOwner(pods.pop(), containers.pop() if containers else None)
