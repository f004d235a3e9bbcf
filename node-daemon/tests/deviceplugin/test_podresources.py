"""How tessera-node asks the kubelet which containers hold which devices: against a fake
kubelet's PodResources service over real gRPC on a unix socket (the real kubelet's answers
are in e2e/tests/system/test_device_plugin.py), and the gate that keeps a ``List`` away from
allocations in flight.

Why it matters: the kubelet's ``List`` rebuilds its table of allocated devices, and a
rebuild during an ``Allocate`` forgets the devices being allocated, which the kubelet can
then hand to a second pod (kubernetes/kubernetes#137534). In CI two pods ran on one share,
so one budget file and ledger: a pod saw another pod's 1000 MiB as its own use.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from tessera_node.deviceplugin.listgate import AllocationGate
from tessera_node.deviceplugin.matcher import ContainerRef, Held
from tessera_node.deviceplugin.podresources import GET_DISABLED, PodResourcesClient
from tessera_node.deviceplugin.proto import podresources_pb2
from tessera_node.deviceplugin.proto import podresources_pb2_grpc as _grpc

pr_grpc: Any = _grpc
VGPU = "tessera.dev/vgpu"


def pod_resources(namespace: str, name: str, devices: list[str]) -> Any:
    """As the kubelet answers: one ``ContainerDevices`` per device, whatever the Allocate."""
    return podresources_pb2.PodResources(
        name=name, namespace=namespace,
        containers=[podresources_pb2.ContainerResources(
            name="main", devices=[podresources_pb2.ContainerDevices(
                resource_name=VGPU, device_ids=[d]) for d in devices])])


class FakePodResources(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """The kubelet's PodResources service, as much of it as the daemon uses. ``get``: what
    the kubelet answers to Get: "on" (1.34+), "disabled" (the feature gate off) or
    "unimplemented" (a kubelet whose API has no Get)."""

    def __init__(self, socket: Path, pods: dict[tuple[str, str], list[str]], get: str) -> None:
        self.pods = pods
        self.get = get
        self.calls: list[str] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pr_grpc.add_PodResourcesListerServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{socket}")
        self.server.start()

    def List(self, request: Any, context: Any) -> Any:
        self.calls.append("List")
        return podresources_pb2.ListPodResourcesResponse(pod_resources=[
            pod_resources(ns, name, devs) for (ns, name), devs in self.pods.items()])

    def Get(self, request: Any, context: Any) -> Any:
        self.calls.append("Get")
        if self.get == "unimplemented":
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        if self.get == "disabled":  # what the kubelet returns: a plain Go error
            context.abort(grpc.StatusCode.UNKNOWN, f"PodResources API {GET_DISABLED}")
        key = (request.pod_namespace, request.pod_name)
        if key not in self.pods:
            context.abort(grpc.StatusCode.UNKNOWN,
                          f"pod {request.pod_name} in namespace {request.pod_namespace} "
                          "not found")
        return podresources_pb2.GetPodResourcesResponse(pod_resources=pod_resources(
            *key, self.pods[key]))

    def stop(self) -> None:
        self.server.stop(0).wait()


@pytest.fixture
def socket() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="pr", dir="/tmp"))  # unix socket paths are short
    yield d / "kubelet.sock"
    shutil.rmtree(d, ignore_errors=True)


PODS = {("ns", "a"): ["GPU-0::0"], ("ns", "b"): ["GPU-0::1"], ("other", "c"): ["GPU-0::2"]}


def held(ns: str, name: str, device: str) -> tuple[ContainerRef, str, tuple[str, ...]]:
    return (ContainerRef(ns, name, "main"), VGPU, (device,))


def rows_of(got: list[Held], after: float) -> list[tuple[ContainerRef, str, tuple[str, ...]]]:
    """The rows without their time, once every row is shown asked after ``after`` (wall
    clock) and no later than now."""
    assert all(after <= h.asked_at <= time.time() for h in got), got
    return [(h.ref, h.resource, h.device_ids) for h in got]


def test_get_is_used_where_the_kubelet_has_it_never_list(socket: Path) -> None:
    kubelet = FakePodResources(socket, PODS, get="on")
    try:
        client = PodResourcesClient(str(socket))
        t0 = time.time()
        got = client.held([("ns", "a"), ("ns", "b"), ("ns", "not-admitted-yet")])
        assert rows_of(got, t0) == [held("ns", "a", "GPU-0::0"), held("ns", "b", "GPU-0::1")]
        assert kubelet.calls == ["Get", "Get", "Get"]  # one per pod, no List
        assert client.method == "Get"
    finally:
        kubelet.stop()


@pytest.mark.parametrize("get", ["disabled", "unimplemented"])
def test_list_only_where_the_kubelet_has_no_get(socket: Path, get: str) -> None:
    kubelet = FakePodResources(socket, PODS, get=get)
    try:
        client = PodResourcesClient(str(socket))
        want = [held("ns", "a", "GPU-0::0"), held("other", "c", "GPU-0::2")]
        t0 = time.time()
        assert rows_of(client.held([("ns", "a"), ("other", "c")]), t0) == want
        t1 = time.time()
        assert rows_of(client.held([("ns", "a"), ("other", "c")]), t1) == want
        # Get tried once; then List, filtered to the pods asked about
        assert kubelet.calls == ["Get", "List", "List"]
        assert client.method == "List"
    finally:
        kubelet.stop()


def test_other_get_errors_are_errors(socket: Path) -> None:
    client = PodResourcesClient(str(socket), timeout=1)  # nothing listens there
    with pytest.raises(grpc.RpcError):
        client.held([("ns", "a")])
    assert client.method is None  # nothing learnt: Get is tried again next time


def test_a_containers_devices_are_one_row_as_one_allocate_gave_them(socket: Path) -> None:
    """The kubelet lists each device apart; the allocation they confirm is all of them."""
    kubelet = FakePodResources(socket, {("ns", "two"): ["GPU-0::3", "GPU-1::0"]}, get="on")
    try:
        t0 = time.time()
        assert rows_of(PodResourcesClient(str(socket)).held([("ns", "two")]), t0) == [
            (ContainerRef("ns", "two", "main"), VGPU, ("GPU-0::3", "GPU-1::0"))]
    finally:
        kubelet.stop()


def test_no_pods_no_calls(socket: Path) -> None:
    kubelet = FakePodResources(socket, PODS, get="on")
    try:
        assert PodResourcesClient(str(socket)).held([]) == []
        assert kubelet.calls == []
    finally:
        kubelet.stop()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_list_waits_for_an_allocation_in_flight_and_its_settling() -> None:
    clock = Clock()
    gate = AllocationGate(settle_s=0.2, window_s=2.0, clock=clock)
    with (gate.answering(then_allocate=False),
          pytest.raises(TimeoutError, match="without a pause"),
          gate.listing(max_wait_s=0.0)):
        pass  # pragma: no cover - never entered
    # answered just now: the kubelet records the allocation after Allocate returns
    with pytest.raises(TimeoutError), gate.listing(max_wait_s=0.0):
        pass  # pragma: no cover - never entered
    clock.now += 0.25
    with gate.listing(max_wait_s=0.0):
        pass


def test_preferred_opens_the_window_until_allocate_answers() -> None:
    clock = Clock()
    gate = AllocationGate(settle_s=0.2, window_s=2.0, clock=clock)
    with gate.answering(then_allocate=True):
        pass
    clock.now += 1.0  # the kubelet is choosing devices; Allocate comes next
    with pytest.raises(TimeoutError), gate.listing(max_wait_s=0.0):
        pass  # pragma: no cover - never entered
    with gate.answering(then_allocate=False):
        pass
    clock.now += 0.25
    with gate.listing(max_wait_s=0.0):
        pass
    # a GetPreferredAllocation the kubelet never follows with Allocate: the window closes
    with gate.answering(then_allocate=True):
        pass
    clock.now += 2.01
    with gate.listing(max_wait_s=0.0):
        pass


def test_allocate_waits_for_a_list_in_flight() -> None:
    gate = AllocationGate(settle_s=0.0, window_s=5.0)
    order: list[str] = []
    entered, release = threading.Event(), threading.Event()

    def lister() -> None:
        with gate.listing(max_wait_s=1.0):
            entered.set()
            release.wait(5)
            order.append("list done")

    t = threading.Thread(target=lister)
    t.start()
    assert entered.wait(5)

    def allocator() -> None:
        with gate.answering(then_allocate=False):
            order.append("allocate")

    a = threading.Thread(target=allocator)
    a.start()
    a.join(0.2)
    assert order == []  # Allocate is held while the List is in flight
    release.set()
    t.join(5)
    a.join(5)
    assert order == ["list done", "allocate"]
