"""The chart's DRA parts, through the real helm: per node pool the device plugin or DRA,
never both on one node; the DeviceClasses; the node daemon's ResourceSlice rights, narrowed
to its own node's slices by an admission policy. Defaults unchanged: the device plugin
everywhere, no DRA object."""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.api.names import (
    DRA_DEVICE_CLASS,
    DRA_DEVICE_CLASS_MIG,
    DRA_DEVICE_CLASSES,
    DRA_DRIVER,
)
from tessera_e2e.chart import helm
from tessera_e2e.chart import render as chart
from tessera_e2e.controlplane.build import ensure_helm

POOL = {"cloud.google.com/gke-nodepool": "gpu-dra", "tessera.test/zone": "a"}
DRA = {"nodeDaemon": {"dra": {"nodeLabels": POOL}}}


@pytest.fixture(scope="module")
def helm_binary() -> Path:
    try:
        return ensure_helm()
    except Exception as exc:  # no helm: the test fails, never skips
        pytest.fail(f"helm unavailable: {exc}")


def kinds(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def terms(ds: dict[str, Any]) -> list[dict[str, Any]]:
    aff = ds["spec"]["template"]["spec"].get("affinity") or {}
    out: list[dict[str, Any]] = (aff.get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])
    return out


def matches(node_terms: list[dict[str, Any]], labels: dict[str, str]) -> bool:
    """The kube-scheduler's reading of required node affinity (terms ORed, expressions
    ANDed; NotIn matches a node without the label); no terms: every node."""
    def expr(e: dict[str, Any]) -> bool:
        has, v = e["key"] in labels, labels.get(e["key"])
        return {"In": has and v in e.get("values", []),
                "NotIn": not has or v not in e.get("values", []),
                "Exists": has, "DoesNotExist": not has}[e["operator"]]
    return not node_terms or any(all(expr(e) for e in t.get("matchExpressions", []))
                                 for t in node_terms)


def args(ds: dict[str, Any]) -> list[str]:
    out: list[str] = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    return out


def node_rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = kinds(docs, "ClusterRole")["tessera-node"]["rules"]
    return rules


def test_by_default_the_device_plugin_runs_everywhere_and_no_dra_object_exists(
        helm_binary: Path) -> None:
    docs = helm.template(helm_binary, "ts")
    daemons = kinds(docs, "DaemonSet")
    assert list(daemons) == ["tessera-node"]
    assert "--device-plugin=true" in args(daemons["tessera-node"])
    assert not any(a.startswith("--dra") for a in args(daemons["tessera-node"]))
    assert kinds(docs, "DeviceClass") == {}
    assert "tessera-node-resourceslices" not in kinds(docs, "ValidatingAdmissionPolicy")
    assert not any("resourceslices" in r["resources"] for r in node_rules(docs))


def test_each_gpu_node_runs_exactly_one_daemon_per_its_pool(helm_binary: Path) -> None:
    docs = helm.template(helm_binary, "ts", DRA)
    daemons = kinds(docs, "DaemonSet")
    plugin, dra = daemons["tessera-node"], daemons["tessera-node-dra"]
    assert "--device-plugin=true" in args(plugin) and "--dra=true" not in args(plugin)
    assert "--device-plugin=false" in args(dra) and "--dra=true" in args(dra)
    # the existing DaemonSet keeps its (immutable) selector; the DRA one selects its own pods
    assert plugin["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "tessera", "app.kubernetes.io/component": "node-daemon"}
    sel = dra["spec"]["selector"]["matchLabels"]
    assert sel["tessera.dev/node-daemon"] == "dra"
    assert sel.items() <= dra["spec"]["template"]["metadata"]["labels"].items()
    # every combination of the labels involved: a GPU node gets exactly one daemon, a node
    # without GPUs none, and the DRA one exactly on the pool's nodes
    keys = {"nvidia.com/gpu.present": ["true", "false", None],
            "cloud.google.com/gke-nodepool": ["gpu-dra", "other", None],
            "tessera.test/zone": ["a", "b", None]}
    for values in itertools.product(*keys.values()):
        labels = {k: v for k, v in zip(keys, values, strict=True) if v is not None}
        gpu = labels.get("nvidia.com/gpu.present") == "true"
        in_pool = all(labels.get(k) == v for k, v in POOL.items())
        assert matches(terms(dra), labels) == (gpu and in_pool), labels
        assert matches(terms(plugin), labels) == (gpu and not in_pool), labels


def test_without_gpu_node_terms_the_pools_still_split_every_node(helm_binary: Path) -> None:
    docs = helm.template(helm_binary, "ts", {"nodeDaemon": {
        "gpuNodeSelectorTerms": [], "dra": {"nodeLabels": {"pool": "dra"}}}})
    daemons = kinds(docs, "DaemonSet")
    for labels in ({}, {"pool": "dra"}, {"pool": "x"}):
        on = [n for n, d in daemons.items() if matches(terms(d), labels)]
        assert on == (["tessera-node-dra"] if labels.get("pool") == "dra"
                      else ["tessera-node"]), labels


def test_the_device_classes_select_tessera_devices_and_its_instances(helm_binary: Path
                                                                      ) -> None:
    classes = kinds(helm.template(helm_binary, "ts", DRA), "DeviceClass")
    # the classes the claims webhooks count and the kubelet plugin prepares for
    assert sorted(classes) == sorted(DRA_DEVICE_CLASSES) == [DRA_DEVICE_CLASS,
                                                             DRA_DEVICE_CLASS_MIG]
    any_, mig = (" ".join(s["cel"]["expression"] for s in classes[n]["spec"]["selectors"])
                 for n in (DRA_DEVICE_CLASS, DRA_DEVICE_CLASS_MIG))
    assert any_ == f'device.driver == "{DRA_DRIVER}"'
    assert f'device.driver == "{DRA_DRIVER}"' in mig
    assert f'device.attributes["{DRA_DRIVER}"].mig == true' in mig


def test_the_daemon_may_write_resourceslices_narrowed_to_its_node(helm_binary: Path) -> None:
    docs = helm.template(helm_binary, "ts", DRA)
    rule = next(r for r in node_rules(docs) if "resourceslices" in r["resources"])
    assert rule["apiGroups"] == ["resource.k8s.io"]
    assert sorted(rule["verbs"]) == ["create", "delete", "list", "update", "watch"]
    policy = kinds(docs, "ValidatingAdmissionPolicy")["tessera-node-resourceslices"]
    ops = policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"]
    assert sorted(ops) == ["CREATE", "DELETE", "UPDATE"]
    assert "tessera-node-resourceslices" in kinds(docs, "ValidatingAdmissionPolicyBinding")
    # the renderer the test bed applies the permissions with agrees with helm
    rendered = [d for d in yaml.safe_load_all(chart.render("ts", DRA)) if d]
    assert node_rules(rendered) == node_rules(docs)
    assert "tessera-node-resourceslices" in kinds(rendered, "ValidatingAdmissionPolicy")


def test_helm_lint_is_clean_with_dra_pools(helm_binary: Path, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(DRA))
    out = subprocess.run([str(helm_binary), "lint", "--strict", str(chart.CHART), "--values",
                          str(values)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_uninstall_stops_both_daemonsets_and_deletes_the_drivers_slices_only_with_dra(
        helm_binary: Path) -> None:
    """`helm uninstall` with DRA pools stopped tessera-node only: tessera-node-dra went on
    publishing, and its slices stayed for the scheduler to allocate."""
    for values, dra in ((None, False), (DRA, True)):
        docs = helm.template(helm_binary, "ts", values)
        job = kinds(docs, "Job")["tessera-uninstall"]
        job_args = job["spec"]["template"]["spec"]["containers"][0]["args"]
        daemonsets = [a.split("=", 1)[1] for a in job_args if a.startswith("--daemonset=")]
        assert daemonsets == (["tessera-node", "tessera-node-dra"] if dra else ["tessera-node"])
        assert set(daemonsets) == set(kinds(docs, "DaemonSet"))
        assert ("--dra-resource-slices" in job_args) is dra
        (ds_rule,) = [r for r in kinds(docs, "Role")["tessera-uninstall"]["rules"]
                      if r["resources"] == ["daemonsets"]]
        assert ds_rule["resourceNames"] == daemonsets
        slices = [r for r in kinds(docs, "ClusterRole")["tessera-uninstall"]["rules"]
                  if "resourceslices" in r["resources"]]
        assert slices == ([{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
                            "verbs": ["deletecollection"]}] if dra else [])


def test_the_dra_daemon_mounts_the_kubelets_plugin_sockets_and_the_cdi_directory(
        helm_binary: Path) -> None:
    """The DRA daemon serves its registration and DRA sockets in the kubelet's
    ``plugins_registry/`` and ``plugins/``, and writes each prepared claim's CDI spec where
    the runtime reads them: each a hostPath at the very path the daemon is told (its root
    filesystem is read-only). The device plugin's daemon has none of them."""
    docs = helm.template(helm_binary, "ts", {"nodeDaemon": {
        "kubeletDir": "/data/kubelet", "dra": {"nodeLabels": POOL, "cdiDir": "/etc/cdi"}}})
    sets = kinds(docs, "DaemonSet")
    dra = sets["tessera-node-dra"]["spec"]["template"]["spec"]
    (daemon,) = dra["containers"]
    assert {"--dra=true", "--kubelet-root=/data/kubelet", "--cdi-dir=/etc/cdi"} <= set(
        daemon["args"])
    mounts = {m["name"]: m["mountPath"] for m in daemon["volumeMounts"]}
    host = {v["name"]: v["hostPath"]["path"] for v in dra["volumes"] if "hostPath" in v}
    for name, where in (("plugins-registry", "/data/kubelet/plugins_registry"),
                        ("plugins", "/data/kubelet/plugins"), ("cdi", "/etc/cdi")):
        assert mounts[name] == host[name] == where, (name, mounts, host)
    plain = sets["tessera-node"]["spec"]["template"]["spec"]
    assert not {"plugins-registry", "plugins", "cdi"} & {v["name"] for v in plain["volumes"]}
    assert not any(a.startswith(("--kubelet-root", "--cdi-dir"))
                   for a in plain["containers"][0]["args"])
