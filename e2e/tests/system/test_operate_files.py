"""The operating files in deploy/ hold together without a cluster: the alerting rules pass
``promtool test rules``, every dashboard query is valid PromQL once expanded, every metric
they name is exported by a component or listed as pending, and the argo-cd values carry the
health script as it is in the repository.  (Against live metrics and real status objects:
``e2e/tests/system/test_operate.py``.)"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st

from tessera.api.names import GROUP
from tessera_e2e.operate import dashboard
from tessera_e2e.operate.argocd import HEALTH_SCRIPT, VALUES
from tessera_e2e.operate.prometheus import find_tool
from tessera_e2e.paths import REPO

RULES = REPO / "deploy" / "prometheus" / "tessera-rules.yaml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "tessera-rules.test.yaml"
DASHBOARD = REPO / "deploy" / "grafana" / "tessera-dashboard.json"
EXPORTERS = [REPO / "core" / "tessera", REPO / "operator" / "tessera_operator",
             REPO / "node-daemon" / "tessera_node"]


def load_dashboard() -> Any:
    return json.loads(DASHBOARD.read_text())


def rule_exprs() -> dict[str, str]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r["expr"] for g in doc["groups"] for r in g["rules"]}


def exported_metrics() -> set[str]:
    """Metric names the operator and the node daemon register (read from their source)."""
    names: set[str] = set()
    for root in EXPORTERS:
        for path in root.rglob("*.py"):
            names.update(re.findall(r'"(tessera_[a-z0-9_]+)"', path.read_text()))
    return names


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    promtool = find_tool("promtool")
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True,
                           text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(rule_exprs())} rules found" in check.stdout
    tested = subprocess.run([promtool, "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent,
                            capture_output=True, text=True, check=False)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout
    # every alert is exercised by at least one firing expectation
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {a["alertname"] for t in tests for a in t.get("alert_rule_test", [])
             if a.get("exp_alerts")}
    assert fired == set(rule_exprs())


def test_every_dashboard_query_expands_to_valid_promql(tmp_path: Path) -> None:
    """promtool parses each expanded query (as a recording rule), with every variable at
    "All" and at a value that needs escaping."""
    d = load_dashboard()
    names = {v.name for v in dashboard.variables(d)}
    rules = []
    for i, t in enumerate(dashboard.targets(d)):
        assert t.expr.strip() and t.ref, t
        assert dashboard.uses(t.expr) <= names, t
        for values in ({n: ".*" for n in names},
                       {n: dashboard.regex_value(["a.b", "c-d|e"]) for n in names}):
            expr = dashboard.expand(t.expr, values, interval_s=15, scrape_s=15)
            assert "$" not in expr and "[[" not in expr, expr
            rules.append({"record": f"dashboard:query_{i}:{len(rules)}", "expr": expr})
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    check = subprocess.run([find_tool("promtool"), "check", "rules", str(path)],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr


def test_dashboard_covers_the_issue_and_has_unique_ids() -> None:
    d = load_dashboard()
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    rows = [p["title"] for p in d["panels"] if p["type"] == "row"]
    assert rows == ["Cluster", "Node, GPU and MIG instance", "MIG apply", "Namespace quota",
                    "Admission"]
    used = set().union(*(dashboard.metrics(t.expr) for t in dashboard.targets(d)))
    for needed in ("tessera_quota_used", "tessera_quota_hard", "tessera_mig_instances",
                   "tessera_node_mig_applies_total", "tessera_admission_seconds",
                   "tessera_quota_core_lent_seconds_total",
                   "tessera_container_token_wait_seconds"):
        assert needed in used


def test_named_metrics_exist_or_are_pending() -> None:
    """A typo in a metric name would make a panel or an alert silently empty."""
    exported = exported_metrics()
    assert exported.isdisjoint(dashboard.PENDING), "exported now: take them off PENDING"
    exprs = [t.expr for t in dashboard.targets(load_dashboard())] + list(rule_exprs().values())
    named = set().union(*(dashboard.metrics(e) for e in exprs))
    assert named - exported - set(dashboard.PENDING) == set()
    assert set(dashboard.PENDING) <= named, "a pending metric nothing uses"


def test_argocd_values_carry_the_health_script_for_both_kinds() -> None:
    cm = yaml.safe_load(VALUES.read_text())["configs"]["cm"]
    script = HEALTH_SCRIPT.read_text()
    assert cm == {f"resource.customizations.health.{GROUP}_{kind}": script
                  for kind in ("GPUPartition", "GPUQuota")}


# -- the expansion rules themselves ----------------------------------------------------------

@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=4))
def test_a_multi_value_matches_exactly_its_values(values: list[str]) -> None:
    formatted = dashboard.regex_value(values)
    regex = formatted.replace("\\\\", "\\")  # what PromQL's string unescaping leaves
    for v in values:
        assert re.fullmatch(regex, v, re.DOTALL)
    assert not re.fullmatch(regex, values[0] + "x") or (values[0] + "x") in values


@given(st.floats(1, 600), st.floats(1, 120))
def test_rate_interval_is_grafanas(interval: float, scrape: float) -> None:
    got = dashboard.rate_interval(interval, scrape)
    assert got >= 4 * scrape and got >= interval + scrape
    assert got in (4 * scrape, interval + scrape)


def test_expand_replaces_macros_and_refuses_unknown_variables() -> None:
    assert dashboard.expand('rate(x{n=~"$node"}[$__rate_interval])', {"node": ".*"},
                            interval_s=15, scrape_s=1) == 'rate(x{n=~".*"}[16000ms])'
    assert dashboard.expand("x{a=~\"${ns}\",b=~\"[[ns]]\"}", {"ns": "q"}, interval_s=1,
                            scrape_s=1) == 'x{a=~"q",b=~"q"}'
    try:
        dashboard.expand("x{a=~\"$nope\"}", {}, interval_s=1, scrape_s=1)
    except KeyError as exc:
        assert "$nope" in str(exc)
    else:
        raise AssertionError("an unknown variable expanded")


def test_kind_config_gives_each_worker_the_simulator_and_its_own_state() -> None:
    kind = REPO / "e2e" / "kind"
    syntax = subprocess.run(["bash", "-n", str(kind / "up.sh")], capture_output=True,
                            text=True, check=False)
    assert syntax.returncode == 0, syntax.stderr
    config = yaml.safe_load((kind / "kind-config.yaml").read_text())
    roles = [n["role"] for n in config["nodes"]]
    assert roles == ["control-plane", "worker", "worker"]
    states = []
    for n in config["nodes"][1:]:
        mounts = {m["containerPath"]: m for m in n["extraMounts"]}
        assert mounts["/var/lib/tessera/gpu/lib"]["hostPath"] == "@SIM_BUILD@/lib"
        assert mounts["/var/lib/tessera/gpu/bin"]["hostPath"] == "@SIM_BUILD@/bin"
        assert mounts["/var/lib/tessera/gpu/lib"]["readOnly"] is True
        states.append(mounts["/var/lib/tessera/gpu/state"]["hostPath"])
    assert states == ["@STATE@/worker-0", "@STATE@/worker-1"]
    values = yaml.safe_load((kind / "values.yaml").read_text())["nodeDaemon"]
    env = {e["name"]: e["value"] for e in values["env"]}
    assert env["TESSERA_SIM_NODE"] == "/var/lib/tessera/gpu/state/node.conf"
