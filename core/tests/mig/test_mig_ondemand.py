"""MIG on demand (tessera.mig.ondemand, tessera.mig.fragmentation): the profile a request by
memory gets, where a new instance goes, checked against the brute-force oracle (mig_oracle),
which shares no code with the planner; and the fragmentation replay."""

from __future__ import annotations

from collections import defaultdict
from functools import cache
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mig_oracle import all_states, geometry, is_valid_state, layout_of

from tessera.mig.catalog import Profile, UnknownProfileError, profiles
from tessera.mig.fragmentation import (
    Claim,
    Event,
    Outcome,
    Release,
    random_events,
    simulate,
)
from tessera.mig.ondemand import (
    Choice,
    candidates,
    choose,
    first_fit,
    free_room,
    scored_profiles,
    smallest_profile,
)
from tessera.mig.planner import Instance, LayoutError, feasible_layouts
from tessera.models import MODELS

MODEL_IDS = ["A100-40GB", "H100-80GB", "A30-24GB"]
State = frozenset[tuple[str, int]]


# --- the oracle's side: free room and the best choice, from mig_oracle alone ---------------

def oracle_scored(model: str) -> list[str]:
    """Profiles without +me, largest first (memory slices, then compute slices)."""
    table = geometry(model)[2]
    names = [n for n in table if "+me" not in n]
    return sorted(names, key=lambda n: (-table[n][1], -table[n][0], n))


@cache
def oracle_room(model: str, state: State) -> tuple[int, ...]:
    """(usable free slices, then per scored profile the most instances addable), by trying
    every subset of each profile's starts."""
    table = geometry(model)[2]
    usable: set[int] = set()
    counts = []
    for name in oracle_scored(model):
        _, size, starts, _ = table[name]
        best = 0
        for k in range(len(starts), 0, -1):
            if any(is_valid_state(model, [*state, *((name, s) for s in chosen)])
                   for chosen in combinations(starts, k)):
                best = k
                break
        counts.append(best)
        for s in starts:
            if is_valid_state(model, [*state, (name, s)]):
                usable.update(range(s, s + size))
    return (len(usable), *counts)


def oracle_options(model: str, fleet: list[tuple[int, State]], name: str
                   ) -> list[tuple[tuple[int, ...], int, int, bool]]:
    """Every valid (GPU, start) with the fleet's summed room after it: (room, gpu, start,
    GPU had instances)."""
    starts = geometry(model)[2][name][2]
    out = []
    for gpu, state in fleet:
        for s in starts:
            if not is_valid_state(model, [*state, (name, s)]):
                continue
            after = state | {(name, s)}
            rooms = [oracle_room(model, after if g == gpu else st_) for g, st_ in fleet]
            total = tuple(sum(parts) for parts in zip(*rooms, strict=True))
            out.append((total, gpu, s, bool(state)))
    return out


# --- strategies -------------------------------------------------------------------------

@cache
def states_by_layout(model: str) -> dict[tuple[str, ...], list[State]]:
    """Every placement of every layout the planner calls feasible (and the empty GPU)."""
    by_layout: dict[tuple[str, ...], list[State]] = defaultdict(list)
    for state in all_states(model, True):
        by_layout[layout_of(state)].append(state)
    planner = {(), *feasible_layouts(model, include_media_extensions=True)}
    assert planner == set(by_layout), "planner and oracle disagree on the feasible layouts"
    return {k: by_layout[k] for k in sorted(by_layout)}


@st.composite
def gpu_state(draw: st.DrawFn, model: str) -> State:
    table = states_by_layout(model)
    layout = draw(st.sampled_from(list(table)))
    return draw(st.sampled_from(table[layout]))


@st.composite
def fleet_case(draw: st.DrawFn) -> tuple[str, list[tuple[int, State]], str]:
    model = draw(st.sampled_from(MODEL_IDS))
    ids = draw(st.lists(st.integers(0, 9), min_size=1, max_size=4, unique=True))
    fleet = [(gpu, draw(gpu_state(model))) for gpu in ids]
    name = draw(st.sampled_from([p.name for p in profiles(model)]))
    return model, fleet, name


def as_instances(state: State) -> list[Instance]:
    return [Instance(n, s) for n, s in sorted(state)]


def planner_fleet(fleet: list[tuple[int, State]]) -> list[tuple[int, list[Instance]]]:
    return [(gpu, as_instances(state)) for gpu, state in fleet]


# --- candidates, free room, choose --------------------------------------------------------

@settings(max_examples=250, deadline=None)
@given(st.sampled_from(MODEL_IDS).flatmap(
    lambda m: st.tuples(st.just(m), gpu_state(m), st.sampled_from(profiles(m)))))
def test_candidates_are_every_start_where_the_profile_joins_the_gpu_as_it_is(
    case: tuple[str, State, Profile],
) -> None:
    model, state, p = case
    got = candidates(model, as_instances(state), p)
    assert got == [s for s in p.starts if is_valid_state(model, [*state, (p.name, s)])]
    assert candidates(model, as_instances(state), p.name) == got


@settings(max_examples=250, deadline=None)
@given(st.sampled_from(MODEL_IDS).flatmap(lambda m: st.tuples(st.just(m), gpu_state(m))))
def test_free_room_matches_the_oracle(case: tuple[str, State]) -> None:
    model, state = case
    assert [p.name for p in scored_profiles(model)] == oracle_scored(model)
    assert free_room(model, as_instances(state)).vector() == oracle_room(model, state)


@settings(max_examples=250, deadline=None)
@given(fleet_case())
def test_choose_is_valid_complete_and_keeps_the_most_free_room(
    case: tuple[str, list[tuple[int, State]], str],
) -> None:
    model, fleet, name = case
    before = planner_fleet(fleet)
    got = choose(model, before, name)
    assert before == planner_fleet(fleet)  # nothing it was given has moved
    options = oracle_options(model, fleet, name)
    if not options:  # completeness: None only when no GPU can take it
        assert got is None
        return
    assert got is not None
    state = dict(fleet)[got.gpu]
    # valid: the existing instances stay where they are and the new one joins them
    assert is_valid_state(model, [*state, (name, got.start)])
    # optimal: no other (GPU, start) leaves the fleet more free room ...
    best = max(room for room, *_ in options)
    chosen = next(o for o in options if (o[1], o[2]) == (got.gpu, got.start))
    assert chosen[0] == best
    # ... and ties go to a GPU with instances, then the lowest id, then the lowest start
    tied = [o for o in options if o[0] == best]
    first = min(tied, key=lambda o: (not o[3], o[1], o[2]))
    assert (got.gpu, got.start) == (first[1], first[2])


@settings(max_examples=200, deadline=None)
@given(fleet_case())
def test_first_fit_takes_the_lowest_gpu_and_start(
    case: tuple[str, list[tuple[int, State]], str],
) -> None:
    model, fleet, name = case
    options = oracle_options(model, fleet, name)
    got = first_fit(model, planner_fleet(fleet), name)
    if not options:
        assert got is None
    else:
        assert got is not None
        assert (got.gpu, got.start) == min((o[1], o[2]) for o in options)


def test_a_first_instance_on_an_empty_gpu_leaves_the_half_a_4g_needs() -> None:
    # a 2g at 0 would break slices 0-3, the only place of a 4g
    assert choose("H100-80GB", [(0, []), (1, [])], "2g.20gb") == Choice(0, 4)
    assert first_fit("H100-80GB", [(0, []), (1, [])], "2g.20gb") == Choice(0, 0)


def test_a_small_instance_goes_beside_others_rather_than_breaking_an_empty_gpu() -> None:
    fleet = [(0, []), (1, [Instance("3g.40gb", 4)])]
    assert choose("H100-80GB", fleet, "1g.10gb") == Choice(1, 0)
    assert choose("H100-80GB", fleet, "7g.80gb") == Choice(0, 0)


def test_stranding_a_slice_weighs_more_than_room_for_a_2g() -> None:
    # beside a 4g at 0, a 1g at 6 keeps a 2g at 4 possible but strands slice 7 (only a
    # double-memory 1g at 6, a 3g at 4 or a 7g reach it); at 4 it strands nothing
    gpu = [Instance("4g.40gb", 0)]
    assert candidates("H100-80GB", gpu, "1g.10gb") == [4, 5, 6]
    assert free_room("H100-80GB", [*gpu, Instance("1g.10gb", 6)]).usable_slices == 2
    assert free_room("H100-80GB", [*gpu, Instance("1g.10gb", 4)]).usable_slices == 3
    assert choose("H100-80GB", [(0, gpu)], "1g.10gb") == Choice(0, 4)


def test_nothing_is_chosen_when_no_gpu_can_take_the_profile() -> None:
    full = [Instance("7g.80gb", 0)]
    assert choose("H100-80GB", [(0, full), (1, [Instance("1g.10gb", 3)])], "4g.40gb") is None
    assert choose("H100-80GB", [], "1g.10gb") is None
    # one +me per GPU: a second is refused even with free slices
    me = [Instance("1g.10gb+me", 0)]
    assert candidates("H100-80GB", me, "1g.10gb+me") == []


def test_gpu_ids_may_be_strings_and_must_be_unique() -> None:
    fleet = [("node-b/0", [Instance("3g.40gb", 0)]), ("node-a/1", [Instance("3g.40gb", 0)])]
    assert choose("H100-80GB", fleet, "3g.40gb") == Choice("node-a/1", 4)
    with pytest.raises(ValueError, match="unique"):
        choose("H100-80GB", [(0, []), (0, [])], "1g.10gb")


def test_existing_instances_that_cannot_coexist_are_refused() -> None:
    with pytest.raises(LayoutError, match="existing instances are invalid"):
        candidates("H100-80GB", [Instance("4g.40gb", 0), Instance("3g.40gb", 0)], "1g.10gb")
    with pytest.raises(ValueError, match="A30-24GB"):
        choose("H100-80GB", [(0, [])], profiles("A30-24GB")[0])


# --- smallest_profile -----------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.sampled_from([m.id for m in MODELS]).flatmap(lambda m: st.tuples(
    st.just(m),
    st.integers(0, max(p.memory_mib for p in profiles(m)) + 2048),
    st.none() | st.lists(st.sampled_from([p.name for p in profiles(m)]), unique=True))))
def test_smallest_profile_holds_the_memory_and_no_smaller_one_does(
    case: tuple[str, int, list[str] | None],
) -> None:
    model, memory, allowed = case
    pool = [p for p in profiles(model) if allowed is None or p.name in allowed]
    holding = [p for p in pool if p.memory_mib >= memory]
    got = smallest_profile(model, memory, allowed)
    if not holding:
        assert got is None
        return
    assert got is not None and got in pool and got.memory_mib >= memory
    if got.media_extensions:  # only when nothing else holds it
        assert all(p.media_extensions for p in holding)
    for p in holding:
        if p.media_extensions == got.media_extensions:
            assert (got.memory_mib, got.compute_slices) <= (p.memory_mib, p.compute_slices)


def test_smallest_profile_examples() -> None:
    # equal memory: the fewer compute slices
    a100 = smallest_profile("A100-40GB", 9000)
    assert a100 is not None and a100.name == "1g.10gb"
    h100 = smallest_profile("H100-80GB", 10_000)  # 1g.10gb holds 9,984 MiB
    assert h100 is not None and h100.name == "1g.20gb"
    plain = smallest_profile("H100-80GB", 1)
    assert plain is not None and plain.name == "1g.10gb"
    # a +me variant only when no other allowed profile holds the request, however large
    larger = smallest_profile("H100-80GB", 1, ["1g.10gb+me", "7g.80gb"])
    assert larger is not None and larger.name == "7g.80gb"
    only_me = smallest_profile("H100-80GB", 1, ["1g.10gb+me"])
    assert only_me is not None and only_me.name == "1g.10gb+me"
    assert smallest_profile("H100-80GB", 90_000) is None
    assert smallest_profile("A30-24GB", 20_000, ["1g.6gb", "2g.12gb"]) is None
    with pytest.raises(ValueError, match="negative"):
        smallest_profile("H100-80GB", -1)
    with pytest.raises(UnknownProfileError):
        smallest_profile("H100-80GB", 1, ["1g.5gb"])


# --- fragmentation replay --------------------------------------------------------------

def test_random_events_are_reproducible_and_release_each_claim_at_most_once() -> None:
    events = random_events("H100-80GB", 200, seed=3)
    assert events == random_events("H100-80GB", 200, seed=3)
    assert events != random_events("H100-80GB", 200, seed=4)
    claims = [e for e in events if isinstance(e, Claim)]
    released = [e.claim for e in events if isinstance(e, Release)]
    assert len(released) == len(set(released))
    seen = 0
    for e in events:
        if isinstance(e, Claim):
            seen += 1
        else:
            assert e.claim < seen  # only a claim already made
    assert {c.profile for c in claims} <= {p.name for p in scored_profiles("H100-80GB")}


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(MODEL_IDS), st.integers(0, 10_000), st.integers(1, 4),
       st.floats(0.2, 0.6))
def test_simulate_counts_add_up(model: str, seed: int, n_gpus: int, share: float) -> None:
    events = random_events(model, 120, seed, share)
    for policy in (choose, first_fit):
        got = simulate(model, n_gpus, events, policy)
        assert got == simulate(model, n_gpus, events, policy)
        assert got.claims == sum(isinstance(e, Claim) for e in events)
        assert 0 <= got.one_gpu_repacked <= got.could_have_fit <= got.refused
        assert got.placed_slices >= got.placed


def test_simulate_refuses_once_full_and_frees_on_release() -> None:
    events: list[Event] = [Claim("7g.80gb"), Claim("1g.10gb"), Release(0), Claim("1g.10gb"),
                           Claim("4g.40gb")]
    got = simulate("H100-80GB", 1, events, choose)
    # the 1g is refused while the 7g holds the GPU: nothing free, so not fragmentation
    assert got == Outcome(claims=4, placed=3, placed_slices=8 + 1 + 4, could_have_fit=0,
                          one_gpu_repacked=0)
    # a 1g at 0 (first fit) leaves no room for a 4g although 7 slices are free
    got = simulate("H100-80GB", 1, [Claim("1g.10gb"), Claim("4g.40gb")], first_fit)
    assert (got.placed, got.could_have_fit, got.one_gpu_repacked) == (1, 1, 1)
    got = simulate("H100-80GB", 1, [Claim("1g.10gb"), Claim("4g.40gb")], choose)
    assert got.placed == 2


def test_simulate_rejects_a_policy_that_places_wrongly() -> None:
    def overlapping(model_id: str, gpus: object, p: Profile) -> Choice[int]:
        return Choice(0, 0)

    with pytest.raises(ValueError, match="overlaps"):
        simulate("H100-80GB", 1, [Claim("1g.10gb"), Claim("1g.10gb")], overlapping)
