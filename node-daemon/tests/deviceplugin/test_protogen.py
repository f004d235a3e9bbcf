"""The committed gRPC modules are what ``make protos`` generates from the .proto files now."""

from __future__ import annotations

from pathlib import Path

from tessera_node.protogen import DEVICE_PLUGIN


def test_generated_modules_are_not_stale(tmp_path: Path) -> None:
    fresh = DEVICE_PLUGIN.generate(tmp_path)
    assert [p.name for p in fresh] == DEVICE_PLUGIN.generated_names()
    stale = [
        p.name for p in fresh
        if p.read_bytes() != (DEVICE_PLUGIN.dir / p.name).read_bytes()
    ]
    assert not stale, f"run `make protos`: {stale} differ from their .proto files"


def test_services_have_the_kubelet_wire_names() -> None:
    from tessera_node.deviceplugin.proto import api_pb2, podresources_pb2

    dp = api_pb2.DESCRIPTOR.services_by_name
    assert dp["Registration"].full_name == "v1beta1.Registration"
    assert [m.name for m in dp["DevicePlugin"].methods] == [
        "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate",
        "PreStartContainer",
    ]
    pr = podresources_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert pr.full_name == "v1.PodResourcesLister"
    assert {m.name for m in pr.methods} == {"List", "Get"}
    resp = api_pb2.DESCRIPTOR.message_types_by_name["ContainerAllocateResponse"]
    assert {f.name: f.number for f in resp.fields} == {
        "envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5,
    }
