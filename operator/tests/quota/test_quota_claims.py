"""What a ResourceClaim asks of tessera's devices under a GPUQuota: counted, filled from the
GPUQuota's default, refused with the field and what to write."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.api.names import DRA_DEVICE_CLASS, DRA_DEVICE_CLASS_MIG
from tessera_operator.quota.arith import QuotaPolicy, Usage
from tessera_operator.quota.claims import (
    ClaimRequestError,
    claim_ask,
    fill_capacity,
    filled_spec,
    over_max,
)

POLICY = QuotaPolicy(quota="team", default_memory_mib=2048, default_cores=25,
                     max_memory_mib=16384, max_cores=200)


def exactly(cls: str = DRA_DEVICE_CLASS, **kw: Any) -> dict[str, Any]:
    return {"name": "gpu", "exactly": {"deviceClassName": cls, **kw}}


def spec(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"requests": list(requests)}}


def apply(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 ``add`` (all the webhook writes), as the API server applies it."""
    out = copy.deepcopy(doc)
    for op in ops:
        assert op["op"] == "add"
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target: Any = out
        for p in parts[:-1]:
            target = target[int(p)] if isinstance(target, list) else target[p]
        assert parts[-1] not in target, f"add over an existing key: {op}"
        target[parts[-1]] = op["value"]
    return out


def test_a_request_counts_count_times_its_capacity() -> None:
    s = spec(exactly(count=3, capacity={"requests": {"memory": "4Gi", "cores": "30"}}))
    assert claim_ask(s) == Usage(memory_mib=3 * 4096, cores=90)


def test_requests_of_other_classes_are_not_tessera_s() -> None:
    s = spec(exactly("nic.example.com", count=4),
             exactly(DRA_DEVICE_CLASS_MIG, capacity={"requests": {"memory": "10Gi",
                                                                  "cores": 100}}))
    assert claim_ask(s) == Usage(memory_mib=10240, cores=100)


def test_first_available_counts_the_most_any_alternative_takes() -> None:
    s = spec({"name": "one-of", "firstAvailable": [
        {"name": "big", "deviceClassName": DRA_DEVICE_CLASS,
         "capacity": {"requests": {"memory": "20Gi", "cores": 10}}},
        {"name": "two", "deviceClassName": DRA_DEVICE_CLASS, "count": 2,
         "capacity": {"requests": {"memory": "4Gi", "cores": 40}}},
        {"name": "other", "deviceClassName": "other.example.com", "count": 8}]})
    assert claim_ask(s) == Usage(memory_mib=20480, cores=80)


@pytest.mark.parametrize(("request_", "says"), [
    (exactly(allocationMode="All", capacity={"requests": {"memory": "1Gi", "cores": 1}}),
     "spec.devices.requests[0].exactly.allocationMode: All takes every matching"),
    (exactly(adminAccess=True, capacity={"requests": {"memory": "1Gi", "cores": 1}}),
     "spec.devices.requests[0].exactly.adminAccess: admin access reaches"),
    (exactly(), "spec.devices.requests[0].exactly.capacity.requests: memory and cores not "
                "stated"),
    (exactly(capacity={"requests": {"memory": "lots", "cores": 1}}),
     "capacity.requests.memory: 'lots' is not a quantity"),
    (exactly(capacity={"requests": {"memory": "1Gi", "cores": 101}}),
     "capacity.requests.cores: 101 is not a percentage"),
    (exactly(capacity={"requests": {"memory": "0", "cores": 1}}),
     "capacity.requests.memory: a GPU budget without memory is no budget"),
    (exactly(count=65, capacity={"requests": {"memory": "1Gi", "cores": 1}}),
     "count: 65 is not between 1 and 64"),
])
def test_what_cannot_be_counted_is_refused_naming_the_field(
        request_: dict[str, Any], says: str) -> None:
    with pytest.raises(ClaimRequestError) as err:
        claim_ask(spec(request_))
    assert says in str(err.value), str(err.value)


def test_the_default_fills_what_a_request_does_not_state() -> None:
    s = spec(exactly(count=2), exactly(capacity={"requests": {"memory": "1Gi"}}),
             {"name": "alt", "firstAvailable": [{"name": "a", "deviceClassName":
                                                 DRA_DEVICE_CLASS, "capacity": {}}]})
    filled = apply({"spec": s}, fill_capacity(s, POLICY))["spec"]
    assert filled["devices"]["requests"][0]["exactly"]["capacity"]["requests"] == {
        "memory": "2048Mi", "cores": "25"}
    assert filled["devices"]["requests"][1]["exactly"]["capacity"]["requests"] == {
        "memory": "1Gi", "cores": "25"}
    assert claim_ask(filled) == Usage(memory_mib=2 * 2048 + 1024 + 2048, cores=4 * 25)


def test_a_template_is_filled_at_its_own_path() -> None:
    template = {"spec": {"spec": spec(exactly())}}
    ops = fill_capacity(template["spec"]["spec"], POLICY, "spec.spec", "/spec/spec")
    assert ops == [{"op": "add", "path": "/spec/spec/devices/requests/0/exactly/capacity",
                    "value": {"requests": {"memory": "2048Mi", "cores": "25"}}}]


def test_no_default_memory_is_refused_with_what_to_add() -> None:
    with pytest.raises(ClaimRequestError) as err:
        fill_capacity(spec(exactly()), QuotaPolicy(quota="team"))
    assert str(err.value) == (
        'spec.devices.requests[0].exactly.capacity.requests.memory: not stated, and GPUQuota '
        '"team" sets no default memory; state the memory each device of this request takes '
        '(e.g. memory: 4Gi)')


def test_max_bounds_a_claim_as_it_bounds_a_pod() -> None:
    assert over_max(Usage(16384, 200), POLICY) is None
    assert over_max(Usage(16385, 10), POLICY) == (
        'the claim asks for 16385Mi of GPU memory in all, more than GPUQuota "team" allows '
        'one pod (max.memory 16384Mi)')
    assert "max.cores 200" in str(over_max(Usage(1, 201), POLICY))


_capacity = st.fixed_dictionaries({}, optional={
    "memory": st.integers(1, 81920).map(lambda m: f"{m}Mi"),
    "cores": st.integers(1, 100).map(str)})
_request = st.builds(
    lambda cls, n, cap: exactly(cls, count=n, capacity={"requests": cap}),
    st.sampled_from([DRA_DEVICE_CLASS, DRA_DEVICE_CLASS_MIG, "other.example.com"]),
    st.integers(1, 8), _capacity)


@given(st.lists(_request, max_size=6))
def test_after_the_fill_every_tessera_request_counts_what_it_states(
        requests: list[dict[str, Any]]) -> None:
    s = spec(*requests)
    filled = apply({"spec": s}, fill_capacity(s, POLICY))["spec"]
    assert filled_spec(s, POLICY) == filled  # what admission counts is what is stored
    want = Usage()
    for before, r in zip(requests, filled["devices"]["requests"], strict=True):
        e = r["exactly"]
        if e["deviceClassName"] == "other.example.com":
            assert r == before  # another driver's request is not tessera's to fill
            continue
        cap = e["capacity"]["requests"]
        assert set(cap) == {"memory", "cores"}
        want = want + Usage(int(cap["memory"][:-2]) * e["count"], int(cap["cores"]) * e["count"])
    assert claim_ask(filled) == want
    assert fill_capacity(filled, POLICY) == []  # nothing left to fill
