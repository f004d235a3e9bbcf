"""Growth holders, the rules: what a pod needs held, and how its holders get there without
the count ever dropping below the need."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from tessera_operator.quota.arith import Usage
from tessera_operator.quota.holders import (
    Holder,
    claim_holder_pod,
    claim_of,
    covers,
    grown,
    holder_name,
    holder_pod,
    holds,
    is_holder,
    need,
    orphaned_claim_holders,
    owner_of,
    settle,
    total,
)

usages = st.builds(Usage, st.integers(0, 4096), st.integers(0, 200))


def test_a_pod_needs_its_growth_and_while_a_resize_waits_the_larger_of_before_and_after(
        ) -> None:
    limits = Usage(1024, 30)
    assert need(Usage(1024, 30), limits) == Usage()
    assert need(Usage(2048, 20), limits) == Usage(1024, 0)
    # growing memory, shrinking cores: the node may refuse, and the previous budget
    # (more cores) comes back without asking the quota again
    assert need(Usage(2048, 20), limits, previous=Usage(1024, 50)) == Usage(1024, 20)


def test_short_creates_only_the_missing_part() -> None:
    plan = settle([Holder("a", Usage(512, 0))], Usage(1024, 10))
    assert plan.create == Usage(512, 10) and plan.delete == ()


def test_exact_is_nothing_and_over_keeps_what_fits_and_creates_the_rest() -> None:
    hs = [Holder("a", Usage(1024, 10)), Holder("b", Usage(512, 0))]
    assert settle(hs, Usage(1536, 10)).nothing
    plan = settle(hs, Usage(1024, 10))
    assert plan.create == Usage() and plan.delete == ("b",)
    plan = settle(hs, Usage(700, 5))
    assert plan.create == Usage(188, 5) and plan.delete == ("a",)
    assert plan.fallback == ("b",)  # if that create is refused: b can go, a stays
    assert settle(hs, Usage()).delete == ("a", "b")


def test_a_holder_that_holds_nothing_always_goes() -> None:
    hs = [Holder("z", Usage()), Holder("a", Usage(1024, 0))]
    plan = settle(hs, Usage(1024, 0))
    assert plan.create == Usage() and plan.delete == ("z",)


@given(st.lists(usages, max_size=6), usages)
def test_settling_reaches_the_need_and_never_holds_less_on_the_way(held: list[Usage],
                                                                   want: Usage) -> None:
    """Applied step by step (create, then delete), at most two rounds reach exactly the
    need; no step holds less than the need, also when a create is refused."""
    hs = [Holder(f"h{i}", u) for i, u in enumerate(held)]
    for round_ in range(3):
        plan = settle(hs, want)
        names = {h.name for h in hs}
        assert set(plan.delete) <= names and set(plan.fallback) <= names
        if plan.nothing:
            break
        assert round_ < 2, "not settled after two rounds"
        if plan.create != Usage() and plan.delete:
            # if this create is refused: what the fallback deletes still leaves the need
            assert covers(total(h for h in hs if h.name not in plan.fallback), want)
        if plan.create != Usage():
            hs = [*hs, Holder(f"r{round_}", plan.create)]
            assert covers(total(hs), want)
        hs = [h for h in hs if h.name not in plan.delete]
        assert covers(total(hs), want)
    final = total(hs)
    assert (final.memory_mib, final.cores) == (want.memory_mib, want.cores)


@given(st.text(min_size=1, max_size=36), st.text(max_size=40))
def test_a_holder_name_is_a_valid_pod_name_stable_for_its_purpose(uid: str, tag: str) -> None:
    name = holder_name(uid, tag)
    assert name == holder_name(uid, tag) and len(name) <= 63
    assert name.startswith("tessera-growth-") and name.replace("-", "").isalnum()


def test_the_holder_pod_is_gated_owned_restricted_and_holds_its_amount() -> None:
    pod = holder_pod("ns", "train", "uid-1", Usage(2048, 10), "tessera-growth-x",
                     "registry.k8s.io/pause:3.10")
    assert is_holder(pod) and owner_of(pod) == "uid-1" and holds(pod) == Usage(2048, 10)
    spec = pod["spec"]
    assert spec["schedulingGates"] == [{"name": "tessera.dev/growth"}]
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert spec["securityContext"]["runAsNonRoot"] is True
    c = spec["containers"][0]
    assert c["resources"]["limits"] == c["resources"]["requests"] == {
        "tessera.dev/vgpu-memory": "2048", "tessera.dev/vgpu-cores": "10"}
    only_cores = holder_pod("ns", "t", "u", Usage(0, 5), "n", "img")
    assert only_cores["spec"]["containers"][0]["resources"]["limits"] == {
        "tessera.dev/vgpu-cores": "5"}
    assert grown(Usage(10, 10), Usage(20, 5)) == Usage(0, 5)


# -- claim holders ------------------------------------------------------------------------------


def _claim_holder(claim_uid: str, made: str, deleting: bool = False) -> dict[str, object]:
    body = claim_holder_pod("team", claim_uid, Usage(2048, 30), "pause")
    body["metadata"]["creationTimestamp"] = made
    if deleting:
        body["metadata"]["deletionTimestamp"] = made
    return body


def test_a_claim_holder_is_a_growth_holder_named_and_labelled_by_its_claim() -> None:
    a = claim_holder_pod("team", "uid-1", Usage(2048, 30), "pause")
    assert a == claim_holder_pod("team", "uid-1", Usage(2048, 30), "pause")  # same name again
    assert is_holder(a) and holds(a) == Usage(2048, 30) and claim_of(a) == "uid-1"
    assert a["metadata"]["name"] != claim_holder_pod("team", "uid-2", Usage(1, 1), "p")[
        "metadata"]["name"]
    assert "ownerReferences" not in a["metadata"]  # its claim does not exist yet
    assert claim_of(holder_pod("team", "p", "pod-uid", Usage(1, 0), "h", "pause")) == ""


@given(st.integers(0, 4096), st.integers(0, 200), st.integers(0, 1),
       st.dictionaries(st.sampled_from(["1g.18gb", "3g.71gb", "1g.10gb+me"]),
                       st.integers(1, 8), max_size=3))
def test_a_claim_holder_holds_its_pod_and_instances_in_the_api_server_s_names(
        memory: int, cores: int, pods: int, mig: dict[str, int]) -> None:
    amount = Usage(memory, cores, pods, mig)
    h = claim_holder_pod("team", "uid-1", amount, "pause")
    limits = h["spec"]["containers"][0]["resources"]["limits"]
    assert limits == h["spec"]["containers"][0]["resources"]["requests"]
    assert (limits.get("tessera.dev/pod") == "1") == bool(pods)
    assert {k for k in limits if k.startswith("tessera.dev/mig-")} == {
        "tessera.dev/mig-" + p.replace("+", ".") for p in mig}
    assert holds(h) == amount  # what the leader totals into status.used


def test_only_holders_whose_claim_is_gone_past_the_grace_are_collected() -> None:
    now = datetime(2026, 11, 28, 6, 0, 0, tzinfo=UTC)
    holders = [_claim_holder("alive", "2026-11-28T05:00:00Z"),
               _claim_holder("gone-old", "2026-11-28T05:59:49Z"),
               _claim_holder("gone-new", "2026-11-28T05:59:55Z"),  # its claim being admitted
               _claim_holder("gone-deleting", "2026-11-28T05:00:00Z", deleting=True),
               _claim_holder("gone-unreadable", "yesterday")]
    names = {str(h["metadata"]["name"]): claim_of(h) for h in holders}  # type: ignore[index]
    got = orphaned_claim_holders(holders, {"alive"}, now)
    assert [names[n] for n in got] == ["gone-old"]
