"""What a ResourceClaim asks of tessera's devices under a GPUQuota: counted, filled from the
GPUQuota's default, refused with the field and what to write."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tessera.api.names import DRA_DEVICE_CLASS, DRA_DEVICE_CLASS_MIG
from tessera_operator.quota.arith import (
    Limits,
    QuotaPolicy,
    QuotaView,
    Usage,
    Violation,
    check_fit,
    deny_message,
)
from tessera_operator.quota.claims import (
    ClaimRequestError,
    MigLimit,
    claim_ask,
    claim_note,
    conjuncts,
    fill_capacity,
    filled_spec,
    mig_limit_of,
    over_max,
    pinned_by,
    pinned_profile,
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
    assert claim_ask(s) == Usage(memory_mib=3 * 4096, cores=90, pods=1)


def test_requests_of_other_classes_are_not_tessera_s() -> None:
    s = spec(exactly("nic.example.com", count=4),
             exactly(DRA_DEVICE_CLASS_MIG, capacity={"requests": {"memory": "10Gi",
                                                                  "cores": 100}}))
    assert claim_ask(s) == Usage(memory_mib=10240, cores=100, pods=1)
    assert claim_ask(spec(exactly("nic.example.com", count=4))) == Usage()  # not a GPU pod


def test_first_available_counts_the_most_any_alternative_takes() -> None:
    s = spec({"name": "one-of", "firstAvailable": [
        {"name": "big", "deviceClassName": DRA_DEVICE_CLASS,
         "capacity": {"requests": {"memory": "20Gi", "cores": 10}}},
        {"name": "two", "deviceClassName": DRA_DEVICE_CLASS, "count": 2,
         "capacity": {"requests": {"memory": "4Gi", "cores": 40}}},
        {"name": "other", "deviceClassName": "other.example.com", "count": 8}]})
    assert claim_ask(s) == Usage(memory_mib=20480, cores=80, pods=1)


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
    assert claim_ask(filled) == Usage(memory_mib=2 * 2048 + 1024 + 2048, cores=4 * 25, pods=1)


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
        want = want + Usage(int(cap["memory"][:-2]) * e["count"], int(cap["cores"]) * e["count"],
                            pods=0 if want.pods else 1)  # the claim: one GPU pod
    assert claim_ask(filled) == want
    assert fill_capacity(filled, POLICY) == []  # nothing left to fill


# -- GPU pods and MIG instances ----------------------------------------------------------------

CAP = {"requests": {"memory": "4Gi", "cores": "50"}}
PIN = 'device.attributes["gpu.tessera.dev"].migProfile == "{}"'
PROFILES = ["1g.18gb", "3g.71gb", "7g.141gb", "1g.10gb+me", "1c.3g.40gb", "2g.35gb"]


def mig(profile: str | None = None, n: int = 1, *exprs: str) -> dict[str, Any]:
    sels = [{"cel": {"expression": e}} for e in ((PIN.format(profile),) if profile else ())
            + exprs]
    return exactly(DRA_DEVICE_CLASS_MIG, count=n, capacity=CAP, selectors=sels)


def test_a_claim_is_one_gpu_pod_however_many_devices_it_asks() -> None:
    one = claim_ask(spec(exactly(capacity=CAP)))
    many = claim_ask(spec(exactly(count=4, capacity=CAP), exactly(capacity=CAP),
                          {"name": "alt", "firstAvailable": [
                              {"name": "a", "deviceClassName": DRA_DEVICE_CLASS,
                               "capacity": CAP}]}))
    assert one.pods == many.pods == 1
    assert check_fit(one, [QuotaView("team", Limits(pods=2), Usage(pods=2))]) == [
        Violation("team", "pods", "1", "2", "2")]


def test_a_mig_class_request_takes_count_instances_of_the_profile_it_pins() -> None:
    assert claim_ask(spec(mig("1g.18gb", 3))) == Usage(12288, 150, 1, {"1g.18gb": 3})
    # the class of any device counts memory and cores, as a pod's tessera.dev/vgpu does
    s = spec(exactly(capacity=CAP, selectors=[{"cel": {"expression": PIN.format("1g.18gb")}}]))
    assert claim_ask(s).mig == {}
    # two requests of one profile add up; other profiles are their own
    both = claim_ask(spec(mig("1g.18gb", 1), mig("1g.18gb", 2), mig("3g.71gb")))
    assert both.mig == {"1g.18gb": 3, "3g.71gb": 1}


def test_first_available_counts_each_profile_any_alternative_takes() -> None:
    s = spec({"name": "one-of", "firstAvailable": [
        {"name": "small", **mig("1g.18gb", 2)["exactly"]},
        {"name": "big", **mig("3g.71gb", 1)["exactly"]}]})
    assert claim_ask(s).mig == {"1g.18gb": 2, "3g.71gb": 1}


@pytest.mark.parametrize("extra", [(), ('device.attributes["gpu.tessera.dev"].migProfile == '
                                        '"3g.71gb"',)])
def test_without_a_mig_limit_an_unpinned_mig_request_counts_no_instance(
        extra: tuple[str, ...]) -> None:
    s = spec(mig("1g.18gb" if extra else None, 1, *extra))
    assert claim_ask(s).mig == {} and claim_ask(s).pods == 1


@pytest.mark.parametrize(("request_", "says"), [
    (mig(None), "it pins none"),
    (mig(None, 1, 'device.attributes["gpu.tessera.dev"].migProfile != "1g.18gb"'),
     "it pins none"),
    (mig(None, 1, PIN.format("1g.18gb") + " || true"), "it pins none"),
    (mig("1g.18gb", 1, PIN.format("3g.71gb")),
     "it pins 1g.18gb and 3g.71gb, and no instance is of more than one profile"),
    (mig(None, 1, PIN.format("big")), "it pins 'big', not a MIG profile name"),
])
def test_under_a_mig_limit_a_mig_request_must_pin_one_profile(
        request_: dict[str, Any], says: str) -> None:
    limit = MigLimit("team", ("1g.18gb", "3g.71gb"))
    with pytest.raises(ClaimRequestError) as err:
        claim_ask(spec(exactly(capacity=CAP), request_), mig=limit)
    msg = str(err.value)
    assert msg.startswith(
        'spec.devices.requests[1].exactly.selectors: GPUQuota "team" limits MIG instances '
        "(hard.migInstances: 1g.18gb, 3g.71gb), and a request through mig.gpu.tessera.dev "
        "counts instances of the one profile its selectors pin; "), msg
    assert says in msg, msg
    assert msg.endswith("Pin one profile, e.g. selectors: [{cel: {expression: "
                        "'device.attributes[\"gpu.tessera.dev\"].migProfile == \"1g.18gb\"'}}]")


def test_the_mig_limit_is_the_first_gpuquota_listing_a_profile() -> None:
    views = [QuotaView("b", Limits(mig={"1g.18gb": 1}), Usage()),
             QuotaView("a", Limits(pods=3), Usage()),
             QuotaView("c", Limits(mig={"3g.71gb": 1, "1g.18gb": 2}), Usage())]
    assert mig_limit_of(views) == MigLimit("b", ("1g.18gb",))
    assert mig_limit_of(views[1:2]) is None


def test_a_refusal_over_pods_or_mig_says_how_a_claim_counts_in_them() -> None:
    over = check_fit(Usage(1, 1, 1, {"1g.18gb": 1}),
                     [QuotaView("team", Limits(pods=1, mig={"1g.18gb": 1}),
                                Usage(0, 0, 1, {"1g.18gb": 1}))])
    msg = deny_message(over) + claim_note(v.resource for v in over)
    assert msg == (
        'exceeded GPUQuota "team": pods requested 1, used 1, hard 1; exceeded GPUQuota "team": '
        "tessera.dev/mig-1g.18gb requested 1, used 1, hard 1 (a claim for tessera devices "
        "counts as one GPU pod in hard.pods; each device a request through mig.gpu.tessera.dev "
        "takes counts as one instance of the profile it pins in hard.migInstances)")
    # the API server's names (the managed ResourceQuota's)
    assert claim_note(["requests.tessera.dev/pod"]) == (
        " (a claim for tessera devices counts as one GPU pod in hard.pods)")
    assert "hard.migInstances" in claim_note(["requests.tessera.dev/mig-1g.18gb"])
    assert claim_note(["requests.tessera.dev/vgpu-memory", "tessera.dev/vgpu-cores"]) == ""


# the selector parser: every spelling of the one pin, and what is not a pin

_space = st.sampled_from(["", " ", "  ", "\n", "\t"])


@st.composite
def _pin_spellings(draw: st.DrawFn) -> tuple[str, str]:
    profile = draw(st.sampled_from(PROFILES))
    q1, q2, q3 = (draw(st.sampled_from(['"', "'"])) for _ in range(3))
    w = [draw(_space) for _ in range(8)]
    attr = (f"{w[3]}.{w[4]}migProfile" if draw(st.booleans())
            else f"{w[3]}[{w[4]}{q2}migProfile{q2}{w[5]}]")
    lhs = f"device{w[0]}.{w[1]}attributes{w[2]}[{q1}gpu.tessera.dev{q1}]{attr}"
    rhs = f"{q3}{profile}{q3}"
    expr = f"{lhs}{w[6]}=={w[7]}{rhs}" if draw(st.booleans()) else f"{rhs}{w[6]}=={w[7]}{lhs}"
    if draw(st.booleans()):
        expr = f"({draw(_space)}{expr}{draw(_space)})"
    return profile, expr


_other = st.sampled_from([
    'device.attributes["gpu.tessera.dev"].mig == true',
    'device.attributes["gpu.tessera.dev"].memoryMiB >= 18000',
    '(device.attributes["gpu.tessera.dev"].model == "H200" || '
    'device.attributes["gpu.tessera.dev"].model == "H100")',
    'device.attributes["gpu.tessera.dev"].uuid != "a && b || c"',
])


@given(_pin_spellings(), st.lists(_other, max_size=3), st.integers(0, 3))
def test_a_pin_is_read_however_it_is_spelled_and_whatever_it_is_anded_with(
        pin: tuple[str, str], others: list[str], at: int) -> None:
    profile, expr = pin
    assert pinned_by(expr) == profile
    parts = [*others]
    parts.insert(min(at, len(parts)), expr)
    anded = " && ".join(parts)
    assert profile in [pinned_by(c) for c in conjuncts(anded)]
    assert pinned_profile({"selectors": [{"cel": {"expression": anded}}]}) == profile
    # or-ed, negated or compared otherwise, it no longer pins the profile
    for loose in (f"{anded} || true", f"!({expr})", f"{expr} == false",
                  f"true ? {expr} : true", expr.replace("==", "!=")):
        assert pinned_profile({"selectors": [{"cel": {"expression": loose}}]}) is None, loose


@pytest.mark.parametrize("expr", [
    'device.attributes["other.example.com"].migProfile == "1g.18gb"',
    'device.attributes["gpu.tessera.dev"].profile == "1g.18gb"',
    'device.attributes["gpu.tessera.dev"].migProfile == "1g.18gb" + ""',
    'device.attributes["gpu.tessera.dev"].migProfile.startsWith("1g")',
    'device.attributes["gpu.tessera.dev"].migProfile in ["1g.18gb"]',
])
def test_what_is_not_the_one_pin_pins_nothing(expr: str) -> None:
    assert pinned_profile({"selectors": [{"cel": {"expression": expr}}]}) is None


def test_the_shipped_mig_example_pins_its_profile() -> None:
    example = Path(__file__).resolve().parents[3] / "examples" / "dra" / "whole-3g40gb.yaml"
    template = yaml.safe_load(example.read_text())
    [req] = template["spec"]["spec"]["devices"]["requests"]
    assert pinned_profile(req["exactly"]) == "3g.40gb"
    limit = MigLimit("team", ("3g.40gb",))
    filled = filled_spec(template["spec"]["spec"], POLICY)
    assert claim_ask(filled, mig=limit).mig == {"3g.40gb": 1}


def test_pinned_whole_instances_state_nothing_and_count_instances_not_memory() -> None:
    """A MIG-class request that pins a profile and states no capacity asks for whole
    instances, as a pod's tessera.dev/mig-<profile> does: nothing is filled in (the node
    gives each instance whole), and it counts its instances and its pod, no memory or cores.
    Stating any capacity makes it a share of an instance: completed and counted in full."""
    whole = spec(exactly(DRA_DEVICE_CLASS_MIG, count=2,
                         selectors=[{"cel": {"expression": PIN.format("3g.71gb")}}]))
    assert fill_capacity(whole, POLICY) == []
    assert claim_ask(filled_spec(whole, POLICY)) == Usage(0, 0, 1, {"3g.71gb": 2})
    share = spec(exactly(DRA_DEVICE_CLASS_MIG, capacity={"requests": {"memory": "4Gi"}},
                         selectors=[{"cel": {"expression": PIN.format("3g.71gb")}}]))
    assert claim_ask(apply({"spec": share}, fill_capacity(share, POLICY))["spec"]) == Usage(
        4096, 25, 1, {"3g.71gb": 1})
    # not pinned: no profile to count it by, so it is a share and gets the default
    unpinned = spec(exactly(DRA_DEVICE_CLASS_MIG))
    filled = apply({"spec": unpinned}, fill_capacity(unpinned, POLICY))["spec"]
    assert claim_ask(filled) == Usage(2048, 25, 1)
    # the class of any device: always a share, whatever it pins
    any_class = spec(exactly(selectors=[{"cel": {"expression": PIN.format("3g.71gb")}}]))
    assert claim_ask(apply({"spec": any_class}, fill_capacity(any_class, POLICY))[
        "spec"]) == Usage(2048, 25, 1)


def test_the_shipped_whole_instance_example_takes_its_instance_whole() -> None:
    example = Path(__file__).resolve().parents[3] / "examples" / "dra" / "whole-3g40gb.yaml"
    claim_spec = yaml.safe_load(example.read_text())["spec"]["spec"]
    assert fill_capacity(claim_spec, POLICY) == []
    assert claim_ask(claim_spec) == Usage(0, 0, 1, {"3g.40gb": 1})
