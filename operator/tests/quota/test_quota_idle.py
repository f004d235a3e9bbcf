"""GPUQuota spec.idle as the operator reads it: the per-pod policy, errors naming the field,
the validating webhook (admitted, warned under a minute, refused, one holder per namespace)."""

from __future__ import annotations

import asyncio
from typing import Any

from tessera_operator.quota.objects import view_of


def test_spec_idle_is_the_per_pod_policy_one_quota_carries():
    v = view_of({"metadata": {"name": "q"}, "spec": {"idle": {"after": "5m"}}})
    assert v.carries_policy and v.error is None
    bad = view_of({"metadata": {"name": "q"}, "spec": {"idle": {"after": "5s"}}})
    assert bad.error is not None and "spec.idle.after" in bad.error.short


class _Kube:
    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    async def list(self, url: str, **_: Any) -> dict[str, Any]:
        return {"items": self.items}


def _review(obj: dict[str, Any], others: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    from tessera_operator.webhooks.admission import Admission

    adm = Admission(_Kube(others or []), None, None)  # type: ignore[arg-type]
    req = {"uid": "u", "namespace": "team", "object": obj}
    out: dict[str, Any] = asyncio.run(adm.review_quota(req))
    return out


def _quota(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "tessera.dev/v1alpha1", "kind": "GPUQuota",
            "metadata": {"name": name, "namespace": "team"}, "spec": spec}


def test_webhook_admits_idle_warns_under_a_minute_and_refuses_a_second_holder():
    ok = _review(_quota("q", {"idle": {"after": "30m", "action": "Evict"}}))
    assert ok["allowed"] and not ok.get("warnings")
    short = _review(_quota("q", {"idle": {"after": "10s"}}))
    assert short["allowed"]
    assert any("spec.idle.after 10s is under a minute" in w for w in short["warnings"])
    bad = _review(_quota("q", {"idle": {"after": "5s"}}))
    assert not bad["allowed"] and "spec.idle.after" in bad["status"]["message"]
    two = _review(_quota("q", {"idle": {"after": "30m"}}),
                  [_quota("p", {"weight": 2})])
    assert not two["allowed"]
    assert "weight, lending or idle, and gpuquota/p does" in two["status"]["message"]
