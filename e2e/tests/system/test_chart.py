"""The chart as the tests install it: rendered without Helm, accepted by a real API server."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.kube.client import Kube, load_credentials
from tessera_e2e.chart import docs as chartdocs
from tessera_e2e.chart import helm, tessera_images
from tessera_e2e.chart import render as chart
from tessera_e2e.chart.tessera_images import DEBIAN_PACKAGES
from tessera_e2e.controlplane.build import ensure_helm
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.controlplane.errors import ControlPlaneError
from tessera_e2e.controlplane.pins import RELEASES, load_pins
from tessera_node.settings import DEFAULTS as DAEMON_DEFAULTS
from tessera_operator.placement import config as placement_config
from tessera_operator.webhooks import config as webhook_config
from tessera_operator.webhooks.config import ClientConfig


def _kinds(text: str) -> list[str]:
    return [d["kind"] for d in yaml.safe_load_all(text) if d]


def test_the_network_policy_is_optional_and_lists_the_api_server() -> None:
    assert "NetworkPolicy" not in _kinds(chart.render("ts"))
    docs = list(yaml.safe_load_all(chart.render("ts", {"networkPolicy": {
        "enabled": True, "apiServerCIDRs": ["10.1.0.0/24", "192.168.7.4/32"]}})))
    policy: dict[str, Any] = next(d for d in docs if d["kind"] == "NetworkPolicy")
    assert policy["metadata"]["namespace"] == "ts"
    webhook, health = policy["spec"]["ingress"]
    assert webhook["ports"] == [{"port": 9443, "protocol": "TCP"}]
    # the API server; tessera-scheduler calling the extender; a replica forwarding to the
    # leader
    assert webhook["from"] == [
        {"ipBlock": {"cidr": "10.1.0.0/24"}}, {"ipBlock": {"cidr": "192.168.7.4/32"}},
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "tessera",
                                         "app.kubernetes.io/component": "scheduler"}}},
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "tessera",
                                         "app.kubernetes.io/component": "operator"}}}]
    assert health == {"ports": [{"port": 8080, "protocol": "TCP"}]}


def test_the_renderer_refuses_what_it_does_not_know() -> None:
    with pytest.raises(chart.TemplateError, match="unsupported"):
        chart.render_template("{{ include \"x\" . }}", {})
    with pytest.raises(chart.TemplateError, match="is not set"):
        chart.render_template("{{ .Values.nope }}", {"Values": {}})
    assert chart.render_template("a\n{{- if .V }}\nb{{ end }}\n{{- range .L }} {{ . }}{{ end }}",
                                 {"V": False, "L": [1, 2]}) == "a 1 2"
    text = "{{ if .V }}yes{{ if .W }}w{{ else }}not w{{ end }}{{ else }}no{{ end }}."
    assert [chart.render_template(text, {"V": v, "W": w})
            for v, w in ((True, True), (True, False), (False, True))] == [
        "yesw.", "yesnot w.", "no."]


@pytest.mark.integration
def test_the_rendered_chart_is_accepted_by_the_api_server(cluster: LocalCluster,
                                                          namespace: str) -> None:
    text = chart.render(namespace, {"networkPolicy": {"enabled": True,
                                                      "apiServerCIDRs": ["10.0.0.0/24"]}})
    out = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=text)
    assert out.returncode == 0, out.stderr
    assert "networkpolicy.networking.k8s.io/tessera-webhook created (server dry run)" in out.stdout


# -- the whole chart, through the real helm ------------------------------------------------


@pytest.fixture(scope="module")
def helm_binary() -> Path:
    try:
        return ensure_helm()
    except ControlPlaneError as error:
        pytest.fail(str(error), pytrace=False)


def test_helm_lint_is_clean(helm_binary: Path) -> None:
    out = subprocess.run([str(helm_binary), "lint", "--strict", str(chart.CHART)],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout
    assert "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout


def test_the_chart_installs_from_the_oldest_supported_release_on(helm_binary: Path) -> None:
    """kubeVersion is the oldest release the suite runs on (TESSERA_KUBERNETES=oldest): below
    it the kubelet's PodResources Get is off by default (docs/node-daemon.md)."""
    oldest = load_pins(RELEASES["oldest"].controlplane)
    assert helm.template(helm_binary, "ts", None, "--kube-version", oldest.kubernetes)
    below = f"v1.{int(oldest.kubernetes_minor) - 1}.9"
    required = f"chart requires kubeVersion: >=1.{oldest.kubernetes_minor}."
    with pytest.raises(RuntimeError, match=re.escape(required)):
        helm.template(helm_binary, "ts", None, "--kube-version", below)


def test_the_chart_webhooks_are_the_operators_and_it_sets_only_their_ca(
        helm_binary: Path) -> None:
    docs = helm.template(helm_binary, "ts")
    cc = ClientConfig(b"CA", service_name="tessera-webhook", service_namespace="ts")
    for want in (webhook_config.mutating(cc), webhook_config.validating(cc)):
        got = next(d for d in docs if d["kind"] == want["kind"])
        assert got["metadata"]["name"] == want["metadata"]["name"]
        for hook in want["webhooks"]:
            del hook["clientConfig"]["caBundle"]  # the operator's part, set at run time
        assert got["webhooks"] == want["webhooks"]
    patches = webhook_config.ca_bundle_patches(cc)
    assert len(patches) == 2
    for body in patches.values():
        for hook in body["webhooks"]:
            assert set(hook) == {"name", "clientConfig"}
            assert hook["clientConfig"] == {"caBundle": "Q0E="}


def test_the_chart_carries_the_generated_crds(helm_binary: Path) -> None:
    docs = helm.template(helm_binary, "ts", None, "--include-crds")
    crds = {d["metadata"]["name"]: d for d in docs if d["kind"] == "CustomResourceDefinition"}
    generated = {d["metadata"]["name"]: d for f in sorted((chart.REPO / "crds").glob("*.yaml"))
                 for d in yaml.safe_load_all(f.read_text()) if d}
    assert crds == generated and len(crds) == 2


def test_the_daemon_runs_on_gpu_nodes_with_the_privileges_it_needs(helm_binary: Path) -> None:
    docs = helm.template(helm_binary, "ts", {"nodeDaemon": {"driverRoot": "/run/nvidia/driver"},
                                             "image": {"tag": "9.9"}})
    ds = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    assert ds["priorityClassName"] == "system-node-critical" and ds["hostPID"] is True
    term = ds["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == "nvidia.com/gpu.present"
    volumes = {v["name"]: v["hostPath"]["path"] for v in ds["volumes"] if "hostPath" in v}
    assert volumes == {"driver-root": "/run/nvidia/driver", "state": "/var/lib/tessera",
                       "device-plugins": "/var/lib/kubelet/device-plugins",
                       "pod-resources": "/var/lib/kubelet/pod-resources"}
    assert "initContainers" not in ds  # the daemon installs libtessera itself
    daemon = ds["containers"][0]
    assert daemon["image"].endswith("/tessera-node:9.9")
    mounts = {m["name"]: m for m in daemon["volumeMounts"]}
    assert mounts["driver-root"] == {"name": "driver-root", "mountPath": "/driver-root",
                                     "readOnly": True}
    # Allocate hands the kubelet host paths below the state directory: the same path inside
    for name in ("state", "device-plugins", "pod-resources"):
        assert mounts[name]["mountPath"] == volumes[name] and not mounts[name].get("readOnly")
    args = daemon["args"]
    for arg in ("--driver-root=/driver-root", "--state-dir=/var/lib/tessera",
                "--libtessera=/opt/tessera/lib/libtessera.so", "--device-plugin=true",
                "--device-visibility=volume-mounts", "--shares-per-unit=10",
                "--share-policy=pack",
                "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock"):
        assert arg in args, args
    assert [e["name"] for e in daemon["env"]] == ["NODE_NAME"]
    operator = next(d for d in docs if d["kind"] == "Deployment")["spec"]
    assert operator["replicas"] == 2
    pod = operator["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert "--webhook-configurations=ca-bundle" in pod["containers"][0]["args"]
    assert pod["affinity"]["podAntiAffinity"]
    assert any(d["kind"] == "PodDisruptionBudget" for d in docs)
    rules = next(d for d in docs if d["kind"] == "ClusterRole"
                 and d["metadata"]["name"] == "tessera-operator")["rules"]
    assert not any("create" in r["verbs"] for r in rules
                   if r["apiGroups"] == ["admissionregistration.k8s.io"])  # only patch


def test_the_daemon_values_default_to_the_daemons_own_defaults() -> None:
    daemon = yaml.safe_load((chart.CHART / "values.yaml").read_text())["nodeDaemon"]
    assert daemon["stateDir"] == DAEMON_DEFAULTS.state_dir
    assert daemon["deviceVisibility"] == DAEMON_DEFAULTS.device_visibility
    assert daemon["devicePlugin"] == {"enabled": DAEMON_DEFAULTS.device_plugin,
                                      "sharesPerGPU": DAEMON_DEFAULTS.shares_per_unit,
                                      "sharePolicy": DAEMON_DEFAULTS.share_policy}
    assert f"{daemon['kubeletDir']}/device-plugins" == DAEMON_DEFAULTS.device_plugin_dir
    assert (f"{daemon['kubeletDir']}/pod-resources/kubelet.sock"
            == DAEMON_DEFAULTS.pod_resources_socket)
    # the daemon installs the library where the node image has it
    assert DAEMON_DEFAULTS.libtessera == f"/{tessera_images.LIBTESSERA}"
    template = (chart.CHART / "templates" / "_node-daemon.tpl").read_text()  # the DaemonSets'
    assert f"--libtessera={DAEMON_DEFAULTS.libtessera}" in template


def test_sim_visibility_mounts_the_simulated_driver_at_its_host_path(helm_binary: Path
                                                                      ) -> None:
    values: dict[str, Any] = {"nodeDaemon": {"driverRoot": "/var/lib/tessera/gpu",
                                             "deviceVisibility": "sim",
                                             "devicePlugin": {"sharesPerGPU": 4,
                                                              "sharePolicy": "spread"}}}
    with pytest.raises(RuntimeError, match="simNode is required"):
        helm.template(helm_binary, "ts", values)
    values["nodeDaemon"]["simNode"] = "/var/lib/tessera/gpu/node.conf"
    docs = helm.template(helm_binary, "ts", values)
    daemon = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"][
        "containers"][0]
    # Allocate mounts the simulated libraries into GPU containers by their host path
    assert {"name": "driver-root", "mountPath": "/var/lib/tessera/gpu", "readOnly": False
            } in daemon["volumeMounts"]
    for arg in ("--driver-root=/var/lib/tessera/gpu", "--device-visibility=sim",
                "--shares-per-unit=4", "--share-policy=spread"):
        assert arg in daemon["args"], daemon["args"]
    # the daemon's --sim-node and the simulator's libnvidia-ml both read the environment
    assert {"name": "TESSERA_SIM_NODE", "value": "/var/lib/tessera/gpu/node.conf"} in daemon[
        "env"]


def test_a_service_monitor_only_when_its_crd_exists(helm_binary: Path) -> None:
    assert "ServiceMonitor" not in {d["kind"] for d in helm.template(helm_binary, "ts")}
    with_crd = helm.template(helm_binary, "ts", None, "--api-versions",
                             "monitoring.coreos.com/v1/ServiceMonitor")
    assert "ServiceMonitor" in {d["kind"] for d in with_crd}
    off = helm.template(helm_binary, "ts", {"serviceMonitor": {"enabled": False}},
                        "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor")
    assert "ServiceMonitor" not in {d["kind"] for d in off}


def test_the_uninstall_hook_runs_before_delete_with_its_own_rbac(helm_binary: Path) -> None:
    hooks = [d for d in helm.template(helm_binary, "ts")
             if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "pre-delete"]
    kinds = sorted(d["kind"] for d in hooks)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Job", "Role", "RoleBinding",
                     "ServiceAccount"]
    job = next(d for d in hooks if d["kind"] == "Job")["spec"]["template"]["spec"]
    assert job["containers"][0]["args"][0] == "uninstall"
    # with placement on (the default) the hook also stops tessera-scheduler and deletes its
    # leader Lease, which its Role may do for that name only; off, neither
    for values, scheduler in (({}, True), ({"placement": {"enabled": False}}, False)):
        docs = helm.template(helm_binary, "ts", values)
        hook = [d for d in docs if (d["metadata"].get("annotations") or {}).get(
            "helm.sh/hook") == "pre-delete"]
        args = next(d for d in hook if d["kind"] == "Job")["spec"]["template"]["spec"][
            "containers"][0]["args"]
        assert ("--deployment=tessera-scheduler" in args) is scheduler, args
        assert ("--lease=tessera-scheduler" in args) is scheduler, args
        assert "--lease=tessera-operator" in args
        rules = next(d for d in hook if d["kind"] == "Role")["rules"]
        named = {(r["resources"][0], n) for r in rules for n in r.get("resourceNames", ())}
        assert {("deployments", "tessera-scheduler"), ("leases", "tessera-scheduler")} <= \
            named if scheduler else named.isdisjoint({("leases", "tessera-scheduler")})
    assert not [d for d in helm.template(helm_binary, "ts", {"uninstallHook": {"enabled": False}})
                if "helm.sh/hook" in (d["metadata"].get("annotations") or {})]


def test_every_value_is_documented_and_the_readme_table_is_current() -> None:
    values = (chart.CHART / "values.yaml").read_text()
    assert chartdocs.undocumented(values) == []
    readme = chartdocs.README.read_text()
    assert chartdocs.rendered_readme(readme, values) == readme, "run `make chart-docs`"


def test_the_docs_table_generator_reads_nested_descriptions() -> None:
    text = ("a:\n  # -- the b\n  # continued\n  b: 1\n  c:\n    d: 2\n# -- e\ne: [1]\n")
    assert chartdocs.documented(text) == {"a.b": "the b continued", "e": "e"}
    assert chartdocs.undocumented(text) == ["a.c.d"]


def test_the_dockerfile_installs_the_packages_the_test_bed_images_have() -> None:
    text = (chart.REPO / "images" / "Dockerfile").read_text()
    install = text.split("--no-install-recommends", 1)[1].split("&&", 1)[0]
    assert sorted(install.replace("\\", " ").split()) == sorted(DEBIAN_PACKAGES)


@pytest.mark.integration
def test_the_operator_sets_only_the_ca_of_the_charts_webhooks(bin_dir: Path,
                                                              helm_binary: Path) -> None:
    """--webhook-configurations=ca-bundle against a real API server (a cluster of its own:
    these configurations' names are the ones the operator tests apply)."""
    with LocalCluster(bin_dir, controllers=False) as cluster:
        cc = ClientConfig(b"-----CA-----", service_name="tessera-webhook",
                          service_namespace="ts")

        async def patch() -> list[str]:
            kube = Kube(load_credentials(str(cluster.kubeconfig)))
            try:
                return await webhook_config.patch_ca_bundles(kube, cc)
            finally:
                await kube.close()

        assert len(asyncio.run(patch())) == 2  # nothing installed: nothing created
        assert "tessera-pods" not in cluster.kubectl("get", "mutatingwebhookconfigurations").stdout
        chart_docs = [d for d in helm.template(helm_binary, "ts")
                      if d["kind"].endswith("WebhookConfiguration")]
        text = "\n---\n".join(yaml.safe_dump(d) for d in chart_docs)
        assert cluster.kubectl("apply", "-f", "-", input=text).returncode == 0
        assert asyncio.run(patch()) == []
        for want in chart_docs:
            got = json.loads(cluster.kubectl("get", want["kind"], want["metadata"]["name"],
                                             "-o", "json").stdout)
            for hook in got["webhooks"]:
                assert hook["clientConfig"].pop("caBundle") == "LS0tLS1DQS0tLS0t"
            # everything the chart sets is the chart's (the API server adds its defaults)
            assert [{k: g[k] for k in w} for g, w in zip(got["webhooks"], want["webhooks"],
                                                          strict=True)] == want["webhooks"]
        # the installer re-applying its manifests (an upgrade) keeps the operator's CA
        assert cluster.kubectl("apply", "-f", "-", input=text).returncode == 0
        got = json.loads(cluster.kubectl("get", "mutatingwebhookconfiguration", "tessera-pods",
                                         "-o", "json").stdout)
        assert got["webhooks"][0]["clientConfig"]["caBundle"] == "LS0tLS1DQS0tLS0t"


def _operator_args(docs: list[dict[str, Any]]) -> list[str]:
    dep = next(d for d in docs if d["kind"] == "Deployment")
    args: list[str] = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def _secret_rules(docs: list[dict[str, Any]], name: str = "tessera-operator") -> list[Any]:
    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == name)
    return [r for r in role["rules"] if r["resources"] == ["secrets"]]


def test_the_operator_renews_its_certificate_with_the_lifetime_value(helm_binary: Path) -> None:
    from tessera_operator.webhooks.rotation import Policy

    docs = helm.template(helm_binary, "ts", {"webhook": {"certificate": {
        "lifetimeHours": 48, "checkIntervalSeconds": 30}}})
    args = _operator_args(docs)
    flags = dict(a.split("=", 1) for a in args if a.startswith("--cert-"))
    assert "--webhook-certificate=generate" in args
    assert flags == {"--cert-lifetime": "172800", "--cert-step": "90",
                     "--cert-check-interval": "30"}
    assert not Policy(float(flags["--cert-lifetime"]), 2 / 3, float(flags["--cert-step"]),
                      float(flags["--cert-check-interval"])).problems()
    assert not [d for d in docs if d["apiVersion"].startswith("cert-manager.io/")]
    assert not [d for d in docs if "WebhookConfiguration" in d["kind"]
                and d["metadata"].get("annotations")]
    # it creates the Secrets (the serving one, the seal key's) and patches the serving one
    # (the renewal); nothing else of the namespace's
    assert _secret_rules(docs) == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["tessera-seal-key"],
         "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["tessera-webhook-tls"],
         "verbs": ["get", "patch"]}]
    # the test bed's operator runs with the same Role, rendered without Helm
    assert yaml.safe_load_all(chart.render("ts")) and _secret_rules(
        [d for d in yaml.safe_load_all(chart.render("ts")) if d]) == _secret_rules(docs)


def test_with_cert_manager_the_chart_asks_it_for_the_certificate(helm_binary: Path) -> None:
    docs = helm.template(helm_binary, "ts", {"webhook": {"certificate": {
        "certManager": True, "lifetimeHours": 720}}})
    cm = {(d["kind"], d["metadata"]["name"]): d for d in docs
          if d["apiVersion"] == "cert-manager.io/v1"}
    assert sorted(cm) == [("Certificate", "tessera-webhook"), ("Certificate", "tessera-webhook-ca"),
                          ("Issuer", "tessera-selfsigned"), ("Issuer", "tessera-webhook-ca")]
    assert all(d["metadata"]["namespace"] == "ts" for d in cm.values())
    ca = cm["Certificate", "tessera-webhook-ca"]["spec"]
    assert ca["isCA"] is True and ca["issuerRef"]["name"] == "tessera-selfsigned"
    assert cm["Issuer", "tessera-webhook-ca"]["spec"] == {"ca": {"secretName": ca["secretName"]}}
    serving = cm["Certificate", "tessera-webhook"]["spec"]
    assert serving["secretName"] == "tessera-webhook-tls"  # the Secret the operator reads
    assert serving["dnsNames"] == ["tessera-webhook.ts.svc", "tessera-webhook.ts.svc.cluster.local"]
    assert (serving["duration"], serving["renewBefore"]) == ("720h", "240h")
    assert serving["issuerRef"] == {"name": "tessera-webhook-ca", "kind": "Issuer",
                                    "group": "cert-manager.io"}
    assert serving["privateKey"]["rotationPolicy"] == "Always"
    hooks = [d for d in docs if "WebhookConfiguration" in d["kind"]]
    assert len(hooks) == 2 and all(d["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "ts/tessera-webhook"} for d in hooks)
    args = _operator_args(docs)
    assert "--webhook-certificate=external" in args
    assert not [a for a in args if a.startswith(("--cert-lifetime", "--cert-step"))]
    # the operator only reads the serving Secret (it makes only the seal key's)
    assert _secret_rules(docs) == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["tessera-seal-key"],
         "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["tessera-webhook-tls"],
         "verbs": ["get"]}]
    # uninstall: the Certificates go before their Secrets (else cert-manager issues them again)
    job = next(d for d in docs if d["kind"] == "Job")["spec"]["template"]["spec"]
    hook_args = job["containers"][0]["args"]
    assert [a for a in hook_args if a.startswith(("--cert-manager-certificate", "--secret"))] == [
        "--secret=tessera-webhook-tls", "--secret=tessera-seal-key",
        "--cert-manager-certificate=tessera-webhook",
        "--cert-manager-certificate=tessera-webhook-ca", "--secret=tessera-webhook-ca"]
    hook_role = next(d for d in docs if d["kind"] == "Role"
                     and d["metadata"]["name"] == "tessera-uninstall")
    assert {"apiGroups": ["cert-manager.io"], "resources": ["certificates"],
            "resourceNames": ["tessera-webhook", "tessera-webhook-ca"],
            "verbs": ["delete"]} in hook_role["rules"]


def test_with_cert_manager_an_issuer_of_ones_own(helm_binary: Path) -> None:
    docs = helm.template(helm_binary, "ts", {"webhook": {"certificate": {
        "certManager": True, "certManagerIssuer": {"name": "corp-ca", "kind": "ClusterIssuer"}}}})
    cm = [d for d in docs if d["apiVersion"] == "cert-manager.io/v1"]
    assert [(d["kind"], d["metadata"]["name"]) for d in cm] == [("Certificate", "tessera-webhook")]
    assert cm[0]["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer"}



def test_tessera_scheduler_calls_the_extender_as_the_operator_renders_it(
        helm_binary: Path) -> None:
    """The chart's scheduler configuration is the one tessera_operator.placement.config
    renders (the service URL and the mounted CA file aside), and the scheduler mounts that
    CA from the webhook serving Secret."""
    docs = helm.template(helm_binary, "ts", None, "--kube-version", "v1.37.2")
    cm = next(d for d in docs if d["kind"] == "ConfigMap"
              and d["metadata"]["name"] == "tessera-scheduler")
    conf = yaml.safe_load(cm["data"]["config.yaml"])
    want = placement_config.scheduler_configuration(
        "https://tessera-webhook.ts.svc:443", "ts", ca_file="/etc/tessera/webhook-ca/ca.crt")
    assert conf == want
    deploy = next(d for d in docs if d["kind"] == "Deployment"
                  and d["metadata"]["name"] == "tessera-scheduler")
    pod = deploy["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.k8s.io/kube-scheduler:v1.37.2"
    ca = next(v for v in pod["volumes"] if v["name"] == "webhook-ca")
    assert ca["secret"]["secretName"] == "tessera-webhook-tls"
    operator = next(d for d in docs if d["kind"] == "Deployment"
                    and d["metadata"]["name"] == "tessera-operator")
    assert "--scheduler-name=tessera-scheduler" in operator["spec"]["template"]["spec"][
        "containers"][0]["args"]
    off = helm.template(helm_binary, "ts", {"placement": {"enabled": False}})
    assert not any(d["metadata"]["name"] == "tessera-scheduler" for d in off)
    operator = next(d for d in off if d["kind"] == "Deployment")
    assert not any(a.startswith("--scheduler-name") for a in operator["spec"]["template"][
        "spec"]["containers"][0]["args"])
