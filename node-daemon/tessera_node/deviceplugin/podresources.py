"""A small client of the kubelet's PodResources API (v1 ``List`` and ``Get``) on its unix
socket (``<kubelet-root>/pod-resources/kubelet.sock``)."""

from __future__ import annotations

from typing import Any

import grpc

from tessera_node.deviceplugin.matcher import ContainerRef, Held
from tessera_node.deviceplugin.proto import podresources_pb2
from tessera_node.deviceplugin.proto import podresources_pb2_grpc as _pr_grpc

podresources_pb2_grpc: Any = _pr_grpc  # generated without types


def rows(pod: Any) -> list[Held]:
    return [
        Held(ContainerRef(pod.namespace, pod.name, c.name), d.resource_name,
             tuple(d.device_ids))
        for c in pod.containers
        for d in c.devices
    ]


class PodResourcesClient:
    def __init__(self, socket: str, timeout: float = 5.0) -> None:
        self.socket = socket
        self.timeout = timeout

    def list_held(self) -> list[Held]:
        with grpc.insecure_channel(f"unix://{self.socket}") as ch:
            resp = podresources_pb2_grpc.PodResourcesListerStub(ch).List(
                podresources_pb2.ListPodResourcesRequest(), timeout=self.timeout
            )
        return [h for p in resp.pod_resources for h in rows(p)]

    def get_held(self, namespace: str, name: str) -> list[Held]:
        """One pod (the kubelet's ``Get``, beta in 1.34; UNIMPLEMENTED where it is off)."""
        with grpc.insecure_channel(f"unix://{self.socket}") as ch:
            resp = podresources_pb2_grpc.PodResourcesListerStub(ch).Get(
                podresources_pb2.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace),
                timeout=self.timeout,
            )
        return rows(resp.pod_resources)
