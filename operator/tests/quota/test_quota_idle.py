"""GPUQuota spec.idle as the operator reads it: the per-pod policy, errors naming the field."""

from __future__ import annotations

from tessera_operator.quota.objects import view_of


def test_spec_idle_is_the_per_pod_policy_one_quota_carries():
    v = view_of({"metadata": {"name": "q"}, "spec": {"idle": {"after": "5m"}}})
    assert v.carries_policy and v.error is None
    bad = view_of({"metadata": {"name": "q"}, "spec": {"idle": {"after": "5s"}}})
    assert bad.error is not None and "spec.idle.after" in bad.error.short
