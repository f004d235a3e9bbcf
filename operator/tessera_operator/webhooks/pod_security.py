"""What a GPU pod may not ask for, because it would let its containers go around their
budgets; and the seccomp profile a GPU pod gets when it names none (pure).

A budget is held inside the container: libtessera counts what the container's processes
allocate, and the node daemon's audit checks them against NVML.  A container that may
make its own mount namespace (``unshare``, blocked by the runtime's default seccomp
profile) can lay a budget file of its own over the one the runtime mounted; a privileged
container, or one with ``CAP_SYS_ADMIN`` or an unmasked ``/proc``, can do that and more
(every device of the node, other mounts).  The audit catches such processes after the fact
(``hook/README.md``, threat model); admission keeps them from being set up at all:

* refused in a pod that asks for a tessera resource: ``privileged: true``,
  ``capabilities.add`` of ``SYS_ADMIN`` or ``ALL``, ``procMount: Unmasked``, a
  ``seccompProfile`` of type ``Unconfined`` (pod or container level);
* given when the pod names no seccomp profile anywhere: the pod's
  ``securityContext.seccompProfile: RuntimeDefault`` (what kubelets with
  ``seccompDefault: true`` give every container; most clusters' kubelets do not).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from tessera.api.names import PREFIX

RUNTIME_DEFAULT = {"type": "RuntimeDefault"}
ESCAPES = "a container that can make its own mounts or reach every device can go around its " \
          "GPU budget"


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for kind in ("initContainers", "containers"):
        for c in spec.get(kind) or []:
            if isinstance(c, Mapping):
                yield str(c.get("name", "")), c


def _sc(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    sc = obj.get("securityContext")
    return sc if isinstance(sc, Mapping) else {}


def _unconfined(sc: Mapping[str, Any]) -> bool:
    profile = sc.get("seccompProfile")
    return isinstance(profile, Mapping) and profile.get("type") == "Unconfined"


def problems(spec: Mapping[str, Any]) -> list[str]:
    """What a GPU pod asks for that would let it go around its budget (empty: nothing)."""
    out = []
    if _unconfined(_sc(spec)):
        out.append("spec.securityContext.seccompProfile is Unconfined")
    for name, c in _containers(spec):
        sc = _sc(c)
        if sc.get("privileged") is True:
            out.append(f"container {name!r} is privileged")
        caps = sc.get("capabilities")
        added = caps.get("add") if isinstance(caps, Mapping) else None
        for cap in added if isinstance(added, list) else []:
            if str(cap).upper().removeprefix("CAP_") in ("SYS_ADMIN", "ALL"):
                out.append(f"container {name!r} adds capability {cap}")
        if sc.get("procMount") == "Unmasked":
            out.append(f"container {name!r} asks for an unmasked /proc")
        if _unconfined(sc):
            out.append(f"container {name!r} has seccompProfile Unconfined")
    return out


def refusal(found: list[str]) -> str:
    return (f"{'; '.join(found)}: not allowed in a pod with a GPU budget ({ESCAPES}); remove "
            f"it, or run the pod without {PREFIX} resources")


def seccomp_patch(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch giving the pod RuntimeDefault, when no seccomp profile is named at
    the pod or in any container (a container's own profile is its author's choice)."""
    if "seccompProfile" in _sc(spec) or any("seccompProfile" in _sc(c)
                                            for _, c in _containers(spec)):
        return []
    if not isinstance(spec.get("securityContext"), Mapping):
        return [{"op": "add", "path": "/spec/securityContext",
                 "value": {"seccompProfile": dict(RUNTIME_DEFAULT)}}]
    return [{"op": "add", "path": "/spec/securityContext/seccompProfile",
             "value": dict(RUNTIME_DEFAULT)}]
