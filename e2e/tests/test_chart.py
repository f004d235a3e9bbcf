"""The chart as the tests install it: rendered without Helm, accepted by a real API server."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tessera_e2e import chart
from tessera_e2e.cluster import LocalCluster


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
    assert webhook["from"][1:] == [{"ipBlock": {"cidr": "10.1.0.0/24"}},
                                   {"ipBlock": {"cidr": "192.168.7.4/32"}}]
    assert "podSelector" in webhook["from"][0]  # the other replicas hand reservations over
    assert health == {"ports": [{"port": 8080, "protocol": "TCP"}]}


def test_the_renderer_refuses_what_it_does_not_know() -> None:
    with pytest.raises(chart.TemplateError, match="unsupported"):
        chart.render_template("{{ include \"x\" . }}", {})
    with pytest.raises(chart.TemplateError, match="is not set"):
        chart.render_template("{{ .Values.nope }}", {"Values": {}})
    assert chart.render_template("a\n{{- if .V }}\nb{{ end }}\n{{- range .L }} {{ . }}{{ end }}",
                                 {"V": False, "L": [1, 2]}) == "a 1 2"


@pytest.mark.integration
def test_the_rendered_chart_is_accepted_by_the_api_server(cluster: LocalCluster,
                                                          namespace: str) -> None:
    text = chart.render(namespace, {"networkPolicy": {"enabled": True,
                                                      "apiServerCIDRs": ["10.0.0.0/24"]}})
    out = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=text)
    assert out.returncode == 0, out.stderr
    assert "networkpolicy.networking.k8s.io/tessera-webhook created (server dry run)" in out.stdout
