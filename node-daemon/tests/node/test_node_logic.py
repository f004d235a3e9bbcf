"""The node daemon's pure parts: inventory from NVML snapshots, plans, reports and their
Events, the Node patch, coexistence detection, settings."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from tessera.api.inventory import node_labels, parse_gpus, to_annotation
from tessera.api.names import ANNOTATION_GPUS, ANNOTATION_PARTITION_STATUS, LABEL_GPU_COUNT
from tessera.api.partition import NodePartitionStatus
from tessera.mig.catalog import profiles
from tessera.mig.planner import fit
from tessera.models import get_model
from tessera_node.cli import build_parser, options
from tessera_node.device.state import DeviceSnapshot, GPUState, MigInstanceState, ProfileInfo
from tessera_node.layout.desired import GPUTarget
from tessera_node.layout.plan import Outcome
from tessera_node.node import reports
from tessera_node.node.coexistence import detect
from tessera_node.node.content import node_content
from tessera_node.node.inventory import node_gpus
from tessera_node.node.patch import node_patch

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def gpu(index: int = 0, model: str = "H100-80GB", mig: str = "disabled",
        instances: tuple[str, ...] = (), with_profiles: bool = True) -> GPUState:
    m = get_model(model)
    table = {p.name: p for p in profiles(model)}
    placed = fit(model, list(instances)) if instances else []
    insts = tuple(MigInstanceState(table[p.profile].smi_profile_id, p.profile, p.start,
                                   p.size, 20 + k, f"MIG-{index}-{k}")
                  for k, p in enumerate(placed))
    infos = tuple(ProfileInfo(p.smi_profile_id, p.name, p.memory_mib, p.compute_slices,
                              p.max_count, p.sm_count) for p in profiles(model))
    return GPUState(index, f"GPU-{index}", m.nvml_name, m.pci_device_id, m.memory_mib << 20,
                    0, None, mig, None, insts, infos if mig == "enabled" and with_profiles
                    else ())


def test_inventory_follows_the_contract_and_round_trips() -> None:
    snap = DeviceSnapshot((gpu(0, mig="enabled", instances=("3g.40gb", "1g.10gb")), gpu(1)))
    inv = node_gpus(snap)
    assert inv.findings == ()
    assert parse_gpus(to_annotation(inv.gpus)) == inv.gpus
    assert inv.gpus[0].instances[0].profile == "3g.40gb"
    assert inv.gpus[1].memory_mib == 81559
    assert node_labels(inv.gpus)[LABEL_GPU_COUNT] == "2"


def test_unknown_models_are_left_out_and_reported() -> None:
    odd = replace(gpu(1), name="NVIDIA Mystery", pci_device_id=0x12345678)
    inv = node_gpus(DeviceSnapshot((gpu(0), odd)))
    assert [g.index for g in inv.gpus] == [0]
    assert [(f.kind, f.gpu) for f in inv.findings] == [("UnknownModel", 1)]
    assert "NVIDIA Mystery" in inv.findings[0].message


def test_a_profile_table_nvml_disagrees_with_is_one_finding() -> None:
    g = gpu(0, mig="enabled")
    wrong = tuple(replace(p, memory_mib=p.memory_mib + 1) if p.name == "1g.10gb" else p
                  for p in g.profiles)
    inv = node_gpus(DeviceSnapshot((replace(g, profiles=wrong),)))
    assert [f.kind for f in inv.findings] == ["ProfileMismatch"]
    assert "1g.10gb memory_mib 9984 in the table, 9985 by NVML" in inv.findings[0].message
    assert node_gpus(DeviceSnapshot((g,))).findings == ()


def situation(*gpus: GPUState, **kw: object) -> reports.Situation:
    return reports.Situation(DeviceSnapshot(gpus), **kw)  # type: ignore[arg-type]


def test_reports_are_ready_only_when_every_owned_gpu_has_the_layout() -> None:
    want = GPUTarget("p", 3, True, ("3g.40gb", "3g.40gb"))
    done = gpu(0, mig="enabled", instances=("3g.40gb", "3g.40gb"))
    out = reports.build({"p": {0: want, 1: want}}, situation(done, gpu(1)))
    assert out["p"].phase == "Applying"
    assert out["p"].message == "GPU 1: has MIG disabled, wants 2x3g.40gb"
    refused = situation(done, gpu(1), outcomes={1: Outcome("Pending", "not yet")})
    entry = reports.build({"p": {0: want, 1: want}}, refused)["p"]
    assert (entry.phase, entry.message) == ("Pending", "GPU 1: has MIG disabled, wants "
                                            "2x3g.40gb (not yet)")
    failed = situation(done, gpu(1), outcomes={1: Outcome("Failed", "GPU 1: boom", "X")})
    entry = reports.build({"p": {0: want, 1: want}}, failed)["p"]
    assert (entry.phase, entry.message, entry.reason) == ("Failed", "GPU 1: boom", "X")

    ready = reports.build({"p": {0: want}}, situation(done, gpu(1)))["p"]
    assert (ready.phase, ready.observed_generation, ready.message) == ("Ready", 3, None)
    assert [len(g.instances) for g in ready.gpus] == [2]
    off = GPUTarget("q", 1, False)
    assert reports.build({"q": {1: off}}, situation(done, gpu(1)))["q"].phase == "Ready"


def test_unreadable_gpus_and_foreign_mig_managers_fail_the_report() -> None:
    want = {"p": {0: GPUTarget("p", 1, True, ("7g.80gb",))}}
    e = reports.build(want, reports.Situation(None, "NVML: Unknown Error"))["p"]
    assert (e.phase, e.message) == ("Failed", "cannot read the GPUs: NVML: Unknown Error")
    node = {"metadata": {"labels": {"nvidia.com/mig.config": "all-1g.10gb"}}}
    e = reports.build(want, situation(gpu(0), findings=tuple(detect(node, (), "/x"))))["p"]
    assert e.phase == "Failed" and "other MIG manager" in (e.message or "")


def test_merge_keeps_unchanged_entries_and_drops_gone_partitions() -> None:
    old = {"a": NodePartitionStatus(phase="Ready", observed_generation=1,
                                    last_update_time=datetime(2025, 1, 1, tzinfo=UTC)),
           "gone": NodePartitionStatus(phase="Ready", observed_generation=1)}
    new = {"a": NodePartitionStatus(phase="Ready", observed_generation=1),
           "b": NodePartitionStatus(phase="Pending", observed_generation=2, message="m")}
    merged = reports.merge(old, new, NOW)
    assert merged["a"] == old["a"]
    assert merged["b"].last_update_time == NOW
    assert set(merged) == {"a", "b"}


def test_events_only_for_new_phases_generations_or_failures() -> None:
    e = NodePartitionStatus
    old = {"a": e(phase="Pending", observed_generation=1, message="GPU 0: x"),
           "b": e(phase="Failed", observed_generation=1, message="one")}
    same = {"a": e(phase="Pending", observed_generation=1, message="GPU 0: y"),
            "b": e(phase="Failed", observed_generation=1, message="one")}
    assert reports.events("n", old, same) == []
    changed = {"a": e(phase="Ready", observed_generation=1),
               "b": e(phase="Failed", observed_generation=1, message="two")}
    assert [(x.partition, x.reason, x.type) for x in reports.events("n", old, changed)] == [
        ("a", "NodeReady", "Normal"), ("b", "NodeFailed", "Warning")]


def test_node_patch_touches_owned_keys_only_and_carries_the_resource_version() -> None:
    node = {"metadata": {"resourceVersion": "7", "labels": {"team": "x", LABEL_GPU_COUNT: "2"},
                         "annotations": {"note": "y", ANNOTATION_PARTITION_STATUS: "{}"}}}
    assert node_patch(node, {LABEL_GPU_COUNT: "2"}, {ANNOTATION_PARTITION_STATUS: "{}"}) is None
    patch = node_patch(node, {LABEL_GPU_COUNT: "3", "team": "z"}, {ANNOTATION_GPUS: "[]"})
    assert patch == {"metadata": {"resourceVersion": "7", "labels": {LABEL_GPU_COUNT: "3"},
                                  "annotations": {ANNOTATION_GPUS: "[]",
                                                  ANNOTATION_PARTITION_STATUS: None}}}


def partition_obj(name: str, created: str, layout: dict[str, object],
                  **meta: object) -> dict[str, object]:
    return {"metadata": {"name": name, "generation": 2, "creationTimestamp": created, **meta},
            "spec": {"nodeSelector": {}, "layout": layout}}


def test_wanted_is_stable_once_written_and_follows_claims_and_deletions() -> None:
    snap = DeviceSnapshot((gpu(0), gpu(1)))
    node: dict[str, object] = {"metadata": {"name": "n", "resourceVersion": "1"}}
    old = partition_obj("old", "2026-01-01T00:00:00Z", {"migMode": "Disabled"})
    new = partition_obj("new", "2026-01-02T00:00:00Z",
                        {"profiles": [{"name": "7g.80gb", "count": 1}]})
    w = node_content(node, [old, new], snap, None, (), "/x", lambda p: None, NOW)
    assert set(w.reports) == {"old"} and w.reports["old"].phase == "Ready"
    written = {"metadata": {"name": "n", "resourceVersion": "2", "labels": w.labels,
                            "annotations": w.annotations}}
    again = node_content(written, [old, new], snap, None, (), "/x", lambda p: None,
                   datetime(2026, 2, 1, tzinfo=UTC))
    assert node_patch(written, again.labels, again.annotations) is None
    retained = {**old, "metadata": {**old["metadata"],  # type: ignore[dict-item]
                                    "deletionTimestamp": "2026-01-03T00:00:00Z"}}
    w = node_content(written, [retained, new], snap, None, (), "/x", lambda p: None, NOW)
    assert set(w.reports) == {"new"} and w.reports["new"].phase == "Applying"
    assert json.loads(w.annotations[ANNOTATION_PARTITION_STATUS]).keys() == {"new"}
    down = node_content(written, [old], None, "NVML: Unknown Error", (), "/x", lambda p: None, NOW)
    assert down.annotations[ANNOTATION_GPUS] == w.annotations[ANNOTATION_GPUS]
    assert down.reports["old"].phase == "Failed"


def test_coexistence_detection() -> None:
    assert detect({"metadata": {}}, (), "/dp") == []
    found = detect({"metadata": {"labels": {"nvidia.com/gpu.deploy.mig-manager": "true"}},
                    "status": {"capacity": {"nvidia.com/gpu": "8"}}},
                   ("kubelet.sock", "nvidia-gpu.sock"), "/dp")
    assert sorted(f.kind for f in found) == ["OtherDevicePlugin", "OtherDevicePlugin",
                                             "OtherMigManager"]
    assert any("/dp/nvidia-gpu.sock" in f.message for f in found)


def test_flags_fall_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-7")
    monkeypatch.setenv("TESSERA_METRICS_PORT", "9999")
    opts = options(build_parser().parse_args(["run"]))
    assert (opts.node_name, opts.metrics_port, opts.driver_root) == ("gpu-7", 9999, "/")
    opts = options(build_parser().parse_args(["run", "--node-name", "x", "--poll-interval",
                                              "2"]))
    assert (opts.node_name, opts.poll_interval_s) == ("x", 2.0)
    monkeypatch.delenv("NODE_NAME")
    with pytest.raises(ValueError, match="node-name"):
        options(build_parser().parse_args(["run"]))
