"""The DRA kubelet plugin's committed gRPC modules are what ``make protos`` generates, with the
wire names the kubelets 1.34 and 1.37 call."""

from __future__ import annotations

from pathlib import Path

from tessera_node.protogen import DRA


def test_generated_modules_are_not_stale(tmp_path: Path) -> None:
    fresh = DRA.generate(tmp_path)
    assert [p.name for p in fresh] == DRA.generated_names()
    stale = [p.name for p in fresh if p.read_bytes() != (DRA.dir / p.name).read_bytes()]
    assert not stale, f"run `make protos`: {stale} differ from their .proto files"


def test_services_have_the_kubelet_wire_names() -> None:
    from tessera_node.dra.proto import dra_v1_pb2, pluginregistration_pb2

    reg = pluginregistration_pb2.DESCRIPTOR.services_by_name["Registration"]
    assert reg.full_name == "pluginregistration.Registration"
    assert [m.name for m in reg.methods] == ["GetInfo", "NotifyRegistrationStatus"]
    info = pluginregistration_pb2.DESCRIPTOR.message_types_by_name["PluginInfo"]
    assert {f.name: f.number for f in info.fields} == {
        "type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}
    dra = dra_v1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"]
    assert dra.full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert [m.name for m in dra.methods] == ["NodePrepareResources", "NodeUnprepareResources"]
    device = dra_v1_pb2.DESCRIPTOR.message_types_by_name["Device"]
    assert {f.name: f.number for f in device.fields} == {
        "request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4,
        "share_id": 5}
    claim = dra_v1_pb2.DESCRIPTOR.message_types_by_name["Claim"]
    assert {f.name: f.number for f in claim.fields} == {"namespace": 1, "uid": 2, "name": 3}
