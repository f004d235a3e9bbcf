"""Webhook helpers without a cluster: JSON patches, certificates, configurations, quota I/O."""

from __future__ import annotations

import copy
import ipaddress
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from tessera.api.names import DRA_DEVICE_CLASSES
from tessera_operator.quota.arith import Limits, Usage
from tessera_operator.quota.objects import (
    FieldError,
    limits_of,
    policy_of,
    status_patch,
    used_of,
    view_of,
)
from tessera_operator.webhooks.admission import counter_patch, fill_patch, pod_patch
from tessera_operator.webhooks.certs import make_serving_cert
from tessera_operator.webhooks.config import (
    POD_MATCH_EXPRESSION,
    ClientConfig,
    mutating,
    validating,
)


def apply(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 add/remove, enough to check what the API server will do with our patches."""
    out = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target: Any = out
        for p in parts[:-1]:
            target = target[int(p)] if isinstance(target, list) else target[p]
        last = parts[-1]
        if op["op"] == "add":
            target[last] = op["value"]
        else:
            del target[last]
    return out


def test_fill_patch_adds_limits_and_matching_requests() -> None:
    spec = {"containers": [
        {"name": "a"},
        {"name": "b", "resources": {"limits": {"tessera.dev/vgpu": "1"},
                                    "requests": {"tessera.dev/vgpu": "1", "cpu": "1"}}},
        {"name": "c", "resources": {"requests": {"cpu": "1"}}},
    ]}
    filled = {"a": {"tessera.dev/vgpu-memory": 10}, "b": {"tessera.dev/vgpu-cores": 20},
              "c": {"tessera.dev/vgpu": 1}}
    out = apply({"spec": spec}, fill_patch(spec, filled))["spec"]["containers"]
    assert out[0]["resources"] == {"limits": {"tessera.dev/vgpu-memory": "10"}}
    assert out[1]["resources"]["limits"]["tessera.dev/vgpu-cores"] == "20"
    assert out[1]["resources"]["requests"]["tessera.dev/vgpu-cores"] == "20"
    assert out[2]["resources"] == {"requests": {"cpu": "1"},
                                   "limits": {"tessera.dev/vgpu": "1"}}


def test_pod_patch_sets_budget_and_label_or_strips_forged_ones() -> None:
    bare = {"metadata": {"name": "x"}}
    ops, warnings = pod_patch(bare, "{}")
    assert apply(bare, ops)["metadata"] == {
        "name": "x", "annotations": {"tessera.dev/budget": "{}"},
        "labels": {"tessera.dev/budgeted": "true"}}
    assert warnings == []
    forged = {"metadata": {"annotations": {"tessera.dev/budget": "{}", "keep": "1",
                                           "tessera.dev/budget-request": "{}",
                                           "tessera.dev/budget-resize": '{"state":"Refused"}'},
                           "labels": {"tessera.dev/budgeted": "true",
                                      "tessera.dev/growth-of": "u"}}}
    ops, warnings = pod_patch(forged, None)
    # every key only tessera writes goes; the user's own (a resize request) stays
    assert apply(forged, ops)["metadata"] == {
        "annotations": {"keep": "1", "tessera.dev/budget-request": "{}"}, "labels": {}}
    assert len(warnings) == 4 and all("written only by tessera" in w for w in warnings)
    ops, warnings = pod_patch(forged, '{"v":1}')
    out = apply(forged, ops)
    assert out["metadata"]["annotations"] == {"tessera.dev/budget": '{"v":1}', "keep": "1",
                                              "tessera.dev/budget-request": "{}"}
    assert "tessera.dev/budget-resize" in " ".join(warnings)
    # reinvoked on a pod that already says what tessera would write: nothing to patch
    assert pod_patch(out, '{"v":1}') == ([], [])


def test_every_gpu_pod_carries_one_pod_counter_and_no_other_pod_any() -> None:
    spec = {"initContainers": [{"name": "i", "resources": {"limits": {"tessera.dev/pod": "1"}}}],
            "containers": [{"name": "a"},
                           {"name": "b", "resources": {"limits": {"tessera.dev/pod": "3"},
                                                       "requests": {"tessera.dev/pod": "3"}}}]}
    fill, removals = counter_patch(spec, True)
    assert fill == {"tessera.dev/pod": 1}
    out = apply({"spec": spec}, fill_patch(spec, {"a": fill}) + removals)["spec"]
    assert out["containers"][0]["resources"] == {"limits": {"tessera.dev/pod": "1"}}
    assert out["containers"][1]["resources"] == {"limits": {}, "requests": {}}
    assert out["initContainers"][0]["resources"] == {"limits": {}}
    assert counter_patch(out, True) == ({}, [])
    fill, removals = counter_patch(out, False)  # a pod that asks for no GPU counts nothing
    assert fill == {} and apply({"spec": out}, removals)["spec"]["containers"][0][
        "resources"] == {"limits": {}}


def test_serving_cert_covers_ip_and_dns_and_chains_to_ca(tmp_path: Path) -> None:
    made = make_serving_cert(["127.0.0.1", "tessera-webhook.tessera-system.svc"])
    cert = x509.load_pem_x509_certificate(made.cert_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert san.get_values_for_type(x509.DNSName) == ["tessera-webhook.tessera-system.svc"]
    ca = x509.load_pem_x509_certificate(made.ca_pem)
    cert.verify_directly_issued_by(ca)
    _, _, key = made.write(tmp_path)
    assert key.stat().st_mode & 0o077 == 0


def test_configurations_url_and_service_modes() -> None:
    url = ClientConfig(b"CA", url="https://127.0.0.1:9443")
    m = mutating(url)["webhooks"][0]
    assert m["clientConfig"]["url"] == "https://127.0.0.1:9443/mutate/pods"
    # the one pod webhook fills in, checks and writes the budget, and writes nothing else
    # (the count is the managed ResourceQuota's); it runs again after a later mutating
    # webhook changed the pod, so the budget always matches the pod as stored
    assert m["failurePolicy"] == "Fail" and m["sideEffects"] == "None"
    assert m["reinvocationPolicy"] == "IfNeeded"
    assert m["matchConditions"][0]["expression"] == POD_MATCH_EXPRESSION
    svc = ClientConfig(b"CA", service_name="tessera-webhook", service_namespace="ts")
    v = validating(svc)["webhooks"]
    assert v[0]["clientConfig"]["service"] == {"name": "tessera-webhook", "namespace": "ts",
                                               "path": "/validate/gpupartitions", "port": 443}
    # the CRs' schema holds without the operator; a claim for tessera's devices waits for it
    # (a GPUQuota could not count it), as a GPU pod does
    assert [(w["name"], w["failurePolicy"]) for w in v] == [
        ("gpupartitions.tessera.dev", "Ignore"), ("gpuquotas.tessera.dev", "Ignore"),
        ("resourceclaims.tessera.dev", "Fail"), ("resourceclaimtemplates.tessera.dev", "Fail")]
    claims = mutating(svc)["webhooks"][1:]
    assert [(w["name"], w["failurePolicy"], w["clientConfig"]["service"]["path"])
            for w in claims] == [
        ("resourceclaims.tessera.dev", "Fail", "/mutate/resourceclaims"),
        ("resourceclaimtemplates.tessera.dev", "Fail", "/mutate/resourceclaims")]
    for w in claims + v[2:]:
        (cond,) = w["matchConditions"]
        for cls in DRA_DEVICE_CLASSES:
            assert f"'{cls}'" in cond["expression"]


def quota_obj(name: str, spec: dict[str, Any], used: dict[str, Any] | None = None,
              rv: str = "7") -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": name, "resourceVersion": rv}, "spec": spec}
    if used is not None:
        obj["status"] = {"used": used}
    return obj


def test_quota_objects_round_trip_and_tolerate_garbage() -> None:
    q = quota_obj("a", {"hard": {"memory": "40Gi", "cores": 400, "migInstances":
                                 {"1g.10gb": 4}}},
                  {"memory": "2Gi", "cores": 10, "pods": 1, "migInstances": {"1g.10gb": 1}})
    assert limits_of(q["spec"]) == Limits(40960, 400, None, {"1g.10gb": 4})
    v = view_of(q)
    assert v.used == Usage(2048, 10, 1, {"1g.10gb": 1}) and v.resource_version == "7"
    patch = status_patch(q, Usage(1024, 5, 1), v.hard)
    assert patch["metadata"] == {"resourceVersion": "7"}
    assert patch["status"]["used"] == {"memory": "1Gi", "cores": 5, "pods": 1,
                                       "migInstances": {"1g.10gb": None}}
    assert patch["status"]["summary"] == {"cores": "5/400", "memory": "1Gi/40Gi", "pods": "1"}
    # a status nobody can read counts as never counted: admission waits for the count
    assert used_of({"used": {"memory": "lots", "cores": "x"}}) is None
    assert used_of({}) is None


@pytest.mark.parametrize(("spec", "field"), [
    ({"hard": {"memory": "lots"}}, "spec.hard.memory"),
    ({"hard": {"memory": "-1Gi"}}, "spec.hard.memory"),
    ({"hard": {"cores": "1.5"}}, "spec.hard.cores"),
    ({"hard": {"pods": []}}, "spec.hard.pods"),
    ({"hard": {"migInstances": {"1g.10gb": "x"}}}, "spec.hard.migInstances.1g.10gb"),
    ({"hard": "all"}, "spec.hard"),
])
def test_a_limit_that_cannot_be_read_is_an_error_never_no_limit(
        spec: dict[str, Any], field: str) -> None:
    with pytest.raises(FieldError) as exc:
        limits_of(spec, "team")
    assert exc.value.field == field
    assert str(exc.value).startswith(f'GPUQuota "team" {field} ')
    assert "until then it admits no GPU pods" in str(exc.value)
    view = view_of(quota_obj("team", spec, {"memory": "0", "cores": 0, "pods": 0}))
    assert view.problem is not None and view.problem.startswith(f"{field} ")
    assert f'GPUQuota "team" {view.problem}' == str(exc.value)


def test_milli_quantities_mean_what_kubernetes_says() -> None:
    assert limits_of({"hard": {"memory": "10000000000000m"}}).memory_mib == 9537
    assert limits_of({"hard": {"memory": 1073741824}}).memory_mib == 1024


def test_policy_comes_from_the_quota_carrying_defaults() -> None:
    quotas = [quota_obj("hard-only", {"hard": {"pods": 3}}),
              quota_obj("defaults", {"default": {"memory": "1Gi", "cores": 20},
                                     "max": {"memory": "8Gi"}, "weight": 3})]
    p = policy_of(map(view_of, quotas))
    assert (p.quota, p.default_memory_mib, p.default_cores, p.max_memory_mib, p.max_cores,
            p.weight) == ("defaults", 1024, 20, 8192, None, 3)
    assert policy_of([view_of(quotas[0])]).quota is None
    with pytest.raises(FieldError, match=r'GPUQuota "defaults" spec\.default\.memory '):
        policy_of([view_of(quota_obj("defaults", {"default": {"memory": "1Gb"}}))])
