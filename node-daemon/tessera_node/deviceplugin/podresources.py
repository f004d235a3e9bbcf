"""A small client of the kubelet's PodResources API (v1 ``Get`` and ``List``) on its unix
socket (``<kubelet-root>/pod-resources/kubelet.sock``).

``held`` asks with ``Get``, one pod at a time, wherever the kubelet has it (beta and on by
default from Kubernetes 1.34): ``List`` makes the kubelet rebuild its table of allocated
devices, which can make it hand one device to two pods (``listgate``). Where ``Get`` is off
or unknown, ``held`` falls back to ``List`` through the gate.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import grpc

from tessera_node import metrics
from tessera_node.deviceplugin.listgate import AllocationGate
from tessera_node.deviceplugin.matcher import ContainerRef, Held
from tessera_node.deviceplugin.proto import podresources_pb2
from tessera_node.deviceplugin.proto import podresources_pb2_grpc as _pr_grpc

podresources_pb2_grpc: Any = _pr_grpc  # generated without types

log = logging.getLogger("tessera_node.deviceplugin")

GET_DISABLED = "Get method disabled"
"""The kubelet's answer to ``Get`` while its KubeletPodResourcesGet feature gate is off."""


def rows(pod: Any) -> list[Held]:
    return [
        Held(ContainerRef(pod.namespace, pod.name, c.name), d.resource_name,
             tuple(d.device_ids))
        for c in pod.containers
        for d in c.devices
    ]


class PodResourcesClient:
    def __init__(self, socket: str, timeout: float = 5.0,
                 gate: AllocationGate | None = None, list_wait_s: float = 5.0) -> None:
        self.socket = socket
        self.timeout = timeout
        self.gate = gate or AllocationGate()
        self.list_wait_s = list_wait_s
        self.method: str | None = None
        """``Get`` or ``List``: what ``held`` used last (None before its first call)."""

    def _channel(self) -> grpc.Channel:
        """One connection per question (a kubelet restarted meanwhile has a new socket)."""
        return grpc.insecure_channel(f"unix://{self.socket}")

    def held(self, pods: Iterable[tuple[str, str]]) -> list[Held]:
        """What these pods' containers hold (namespace, name); a pod the kubelet does not
        know (not admitted yet, or gone) holds nothing. Raises grpc.RpcError."""
        pods = list(pods)
        if not pods:
            return []
        if self.method != "List":
            try:
                with self._channel() as ch:
                    stub = podresources_pb2_grpc.PodResourcesListerStub(ch)
                    out = [h for namespace, name in pods
                           for h in self._get(stub, namespace, name)]
                self.method = "Get"
                return out
            except grpc.RpcError as exc:
                if not _get_missing(exc):
                    raise
                log.warning("the kubelet has no PodResources Get (KubeletPodResourcesGet "
                            "is off, or the kubelet is older than 1.27): asking with List, "
                            "kept away from allocations in flight",
                            extra={"error": exc.details() or exc.code().name})
                self.method = "List"
        wanted = set(pods)
        return [h for h in self.list_held() if (h.ref.namespace, h.ref.pod) in wanted]

    def list_held(self) -> list[Held]:
        """Every pod's containers (the kubelet's List, through the gate)."""
        with self.gate.listing(self.list_wait_s), self._channel() as ch:
            metrics.PODRESOURCES_CALLS.labels("List").inc()
            resp = podresources_pb2_grpc.PodResourcesListerStub(ch).List(
                podresources_pb2.ListPodResourcesRequest(), timeout=self.timeout)
        return [h for p in resp.pod_resources for h in rows(p)]

    def _get(self, stub: Any, namespace: str, name: str) -> list[Held]:
        """One pod (the kubelet's ``Get``); [] when the kubelet does not know the pod."""
        metrics.PODRESOURCES_CALLS.labels("Get").inc()
        try:
            resp = stub.Get(
                podresources_pb2.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace),
                timeout=self.timeout,
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNKNOWN and "not found" in (exc.details() or ""):
                return []
            raise
        return rows(resp.pod_resources)


def _get_missing(exc: grpc.RpcError) -> bool:
    return exc.code() == grpc.StatusCode.UNIMPLEMENTED or GET_DISABLED in (exc.details() or "")
