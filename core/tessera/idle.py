"""Idle holders (pure): a pod that holds GPU memory while its containers' SM use stays under a
threshold. The node daemon's audit feeds it one sample per pod per audit (memory held, SM use)
and acts on what it decides; nothing here reads a clock or the API.

Rules:

- A sample is **idle-holding** when the pod holds memory (> 0 bytes), its SM use is known and
  under the policy's ``below``. Memory 0 is never idle-holding (nothing to reclaim); unknown
  use (not measured this time) is not idle: only measured idleness counts.
- An **episode** starts at the first idle-holding sample and lasts while every following one
  is idle-holding, no two more than ``max_gap_s`` apart (a gap: the daemon could not look, so
  nothing is assumed about it) and time never goes backwards. Anything else ends it.
- The policy's action is **due** once the episode has lasted ``after`` (from its first sample
  to the current one); never before. ``new`` is true the first time in an episode, so an
  Event is posted once per episode; an eviction is retried every sample while due.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from tessera.api.duration import format_duration, parse_duration

Action = Literal["Report", "Evict"]
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class IdlePolicy:
    after_s: float
    action: Action = "Report"
    below: float = 1.0
    """Percent of the device's SMs."""


def policy_of(quotas: Iterable[Mapping[str, Any]]) -> IdlePolicy | None:
    """A namespace's idle policy from its GPUQuotas' ``spec.idle`` (admission lets one quota
    carry it; should two, the strictest of each field: Evict, the shortest ``after``, the
    highest ``below``). A value that cannot be read is left out: no policy is assumed."""
    found: list[IdlePolicy] = []
    for q in quotas:
        i = (q.get("spec") or {}).get("idle")
        if not isinstance(i, Mapping):
            continue
        try:
            after = parse_duration(str(i.get("after")))
        except ValueError:
            continue
        action = i.get("action", "Report")
        below = i.get("below", 1)
        if action not in ("Report", "Evict") or not isinstance(below, int | float) \
                or isinstance(below, bool) or not 0 < below <= 100:
            continue
        found.append(IdlePolicy(after, action, float(below)))
    if not found:
        return None
    return IdlePolicy(min(p.after_s for p in found),
                      "Evict" if any(p.action == "Evict" for p in found) else "Report",
                      max(p.below for p in found))


@dataclass(frozen=True)
class Use:
    """One container's sample on one GPU or MIG instance."""

    memory: int
    """Bytes its processes hold there (NVML per process)."""
    sm: float | None
    """Percent of the unit's SMs it used since the last sample; None: not measured."""


def pod_use(uses: Iterable[Use]) -> tuple[int, float | None]:
    """A pod's (memory held, SM use): memory summed, use the busiest unit's (None when any
    unit's use is unknown: the pod is not judged idle on part of its devices)."""
    memory, sm = 0, 0.0
    unknown = False
    for u in uses:
        memory += max(0, u.memory)
        if u.sm is None:
            unknown = True
        else:
            sm = max(sm, u.sm)
    return memory, None if unknown else sm


def idle_holding(memory: int, sm: float | None, below: float) -> bool:
    return memory > 0 and sm is not None and sm < below


@dataclass(frozen=True)
class Episode:
    since: float
    last: float
    memory: int
    reported: bool = False


@dataclass(frozen=True)
class Verdict:
    idle_s: float
    """How long the pod has held memory idle (0: not idle)."""
    memory: int
    due: Action | None
    """The policy's action, once the episode has lasted ``after``."""
    new: bool
    """Due for the first time in this episode (post the Event)."""


NOT_IDLE = Verdict(0.0, 0, None, False)


def step(ep: Episode | None, t: float, memory: int, sm: float | None,
         policy: IdlePolicy | None, max_gap_s: float) -> tuple[Episode | None, Verdict]:
    """One sample of one pod: the episode after it and what is due."""
    if policy is None or not idle_holding(memory, sm, policy.below):
        return None, NOT_IDLE
    if ep is None or t < ep.last or t - ep.last > max_gap_s:
        ep = Episode(t, t, memory)
    else:
        ep = Episode(ep.since, t, memory, ep.reported)
    idle = t - ep.since
    if idle < policy.after_s:
        return ep, Verdict(idle, memory, None, False)
    new = not ep.reported
    return Episode(ep.since, t, memory, True), Verdict(idle, memory, policy.action, new)


class IdleTracker(Generic[K]):
    """Episodes of every pod sampled; a pod not sampled any more (gone) is forgotten."""

    def __init__(self, max_gap_s: float) -> None:
        self.max_gap_s = max_gap_s
        self.episodes: dict[K, Episode] = {}

    def observe(self, t: float,
                samples: Mapping[K, tuple[int, float | None, IdlePolicy | None]]
                ) -> dict[K, Verdict]:
        out: dict[K, Verdict] = {}
        episodes: dict[K, Episode] = {}
        for key, (memory, sm, policy) in samples.items():
            ep, out[key] = step(self.episodes.get(key), t, memory, sm, policy, self.max_gap_s)
            if ep is not None:
                episodes[key] = ep
        self.episodes = episodes
        return out


def idle_message(v: Verdict, policy: IdlePolicy, outcome: str) -> str:
    """The GPUIdle Event's text."""
    return (f"pod holds {v.memory / (1 << 20):.0f} MiB of GPU memory and its containers used "
            f"under {policy.below:g}% of the SMs for {format_duration(v.idle_s)} (GPUQuota "
            f"idle: after {format_duration(policy.after_s)}, action {policy.action}): "
            f"{outcome}")
