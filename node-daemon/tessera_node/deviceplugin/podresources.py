"""A small client of the kubelet's PodResources API (v1 ``Get`` and ``List``) on its unix
socket (``<kubelet-root>/pod-resources/kubelet.sock``).

``answers`` asks with ``Get``, one pod at a time, wherever the kubelet has it (beta and on
by default from Kubernetes 1.34): ``List`` makes the kubelet rebuild its table of allocated
devices, which can make it hand one device to two pods (``listgate``). Where ``Get`` is off
or unknown, it falls back to ``List`` through the gate. Every call waits for its turn on a
:class:`~tessera_node.deviceplugin.pacing.Pacer`, and the kubelet's refusal
(RESOURCE_EXHAUSTED: its rate limit) ends the questions with :class:`KubeletBusy`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import grpc

from tessera_node import metrics
from tessera_node.deviceplugin.listgate import AllocationGate
from tessera_node.deviceplugin.matcher import ContainerRef, Held
from tessera_node.deviceplugin.pacing import Pacer
from tessera_node.deviceplugin.proto import podresources_pb2
from tessera_node.deviceplugin.proto import podresources_pb2_grpc as _pr_grpc

podresources_pb2_grpc: Any = _pr_grpc  # generated without types

log = logging.getLogger("tessera_node.deviceplugin")

GET_DISABLED = "Get method disabled"
"""The kubelet's answer to ``Get`` while its KubeletPodResourcesGet feature gate is off."""


class KubeletBusy(Exception):
    """The kubelet refused a call (RESOURCE_EXHAUSTED: past its rate limit)."""


def rows(pod: Any, asked_at: float) -> list[Held]:
    """One row per container and resource, asked at ``asked_at`` (wall clock, before the
    call). The kubelet answers one ``ContainerDevices`` per device (each with its own
    topology), so a container's devices of one resource, which one Allocate gave it, are
    gathered again here."""
    out: dict[tuple[str, str], list[str]] = {}
    for c in pod.containers:
        for d in c.devices:
            out.setdefault((c.name, d.resource_name), []).extend(d.device_ids)
    return [Held(ContainerRef(pod.namespace, pod.name, c), r, tuple(ids), asked_at)
            for (c, r), ids in out.items()]


class PodResourcesClient:
    def __init__(self, socket: str, timeout: float = 5.0,
                 gate: AllocationGate | None = None, list_wait_s: float = 5.0,
                 pacer: Pacer | None = None) -> None:
        self.socket = socket
        self.timeout = timeout
        self.gate = gate or AllocationGate()
        self.list_wait_s = list_wait_s
        self.pacer = pacer
        self._pace_lock = threading.Lock()
        self.method: str | None = None
        """``Get`` or ``List``: what ``held`` used last (None before its first call)."""

    def _channel(self) -> grpc.Channel:
        """One connection per round of questions (a kubelet restarted meanwhile has a new
        socket)."""
        return grpc.insecure_channel(f"unix://{self.socket}")

    def held(self, pods: Iterable[tuple[str, str]]) -> list[Held]:
        """What these pods' containers hold (namespace, name); a pod the kubelet does not
        know (not admitted yet, or gone) holds nothing. Raises grpc.RpcError."""
        return [h for got in self.answers(pods).values() for h in got]

    def answers(self, pods: Iterable[tuple[str, str]],
                enough: Callable[[Mapping[tuple[str, str], list[Held]]], bool] | None = None
                ) -> dict[tuple[str, str], list[Held]]:
        """Per pod asked about, in order, what its containers hold; ``enough`` (given the
        answers so far) ends the questions early. Raises KubeletBusy when the kubelet
        refuses a call (with the answers before it in ``KubeletBusy.args[1]``), or
        grpc.RpcError."""
        pods = list(pods)
        out: dict[tuple[str, str], list[Held]] = {}
        if not pods:
            return out
        if self.method != "List":
            try:
                with self._channel() as ch:
                    stub = podresources_pb2_grpc.PodResourcesListerStub(ch)
                    for namespace, name in pods:
                        out[(namespace, name)] = self._get(stub, namespace, name)
                        self.method = "Get"
                        if enough is not None and enough(out):
                            break
                return out
            except KubeletBusy as exc:
                raise KubeletBusy(str(exc), out) from None
            except grpc.RpcError as exc:
                if not _get_missing(exc):
                    raise
                log.warning("the kubelet has no PodResources Get (KubeletPodResourcesGet "
                            "is off, or the kubelet is older than 1.27): asking with List, "
                            "kept away from allocations in flight",
                            extra={"error": exc.details() or exc.code().name})
                self.method = "List"
        every = self.list_held()
        for key in pods:
            out[key] = [h for h in every if (h.ref.namespace, h.ref.pod) == key]
        return out

    def list_held(self) -> list[Held]:
        """Every pod's containers (the kubelet's List, through the gate)."""
        with self.gate.listing(self.list_wait_s), self._channel() as ch:
            self._turn("List")
            asked_at = time.time()
            try:
                resp = podresources_pb2_grpc.PodResourcesListerStub(ch).List(
                    podresources_pb2.ListPodResourcesRequest(), timeout=self.timeout)
            except grpc.RpcError as exc:
                _raise_busy(exc)
                raise
        return [h for p in resp.pod_resources for h in rows(p, asked_at)]

    def _turn(self, method: str) -> None:
        """Wait for this call's turn on the pacer, then count it."""
        if self.pacer is not None:
            with self._pace_lock:
                wait = self.pacer.take()
            if wait > 0:
                time.sleep(wait)
        metrics.PODRESOURCES_CALLS.labels(method).inc()

    def _get(self, stub: Any, namespace: str, name: str) -> list[Held]:
        """One pod (the kubelet's ``Get``); [] when the kubelet does not know the pod."""
        self._turn("Get")
        asked_at = time.time()
        try:
            resp = stub.Get(
                podresources_pb2.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace),
                timeout=self.timeout,
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNKNOWN and "not found" in (exc.details() or ""):
                return []
            _raise_busy(exc)
            raise
        return rows(resp.pod_resources, asked_at)


def _get_missing(exc: grpc.RpcError) -> bool:
    return exc.code() == grpc.StatusCode.UNIMPLEMENTED or GET_DISABLED in (exc.details() or "")


def _raise_busy(exc: grpc.RpcError) -> None:
    if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        metrics.PODRESOURCES_REFUSED.inc()
        raise KubeletBusy(exc.details() or "RESOURCE_EXHAUSTED", {}) from None
