"""MIG on-demand fragmentation benchmark: the same random claims and releases replayed on a
fleet of MIG GPUs with tessera's placement rule (``choose``: keep the most useful free room)
and with first fit (lowest GPU, lowest valid start), side by side, in one run.

Per model and load (the share of events that release an outstanding claim; the rest claim
one instance of a profile drawn uniformly, ``+me`` variants left out), summed over the
seeds: claims, claims placed, memory slices placed, claims refused although the fleet's free
slices in total would have held them ("could have fit"), and of those, claims one GPU could
have held had its instances been placed anew ("one GPU repacked"). Per seed: on how many
seeds ``choose`` had fewer, as many or more "could have fit" refusals than first fit.

    python bench/mig_fragmentation.py        # EVENTS=200 SEEDS=10 GPUS=4 LOADS=0.35,0.45,0.55
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))

from tessera.mig.fragmentation import Outcome, Policy, random_events, simulate
from tessera.mig.ondemand import choose, first_fit

MODELS = ("A100-40GB", "H100-80GB", "A30-24GB")
EVENTS = int(os.environ.get("EVENTS", "200"))
SEEDS = int(os.environ.get("SEEDS", "10"))
GPUS = int(os.environ.get("GPUS", "4"))
LOADS = tuple(float(x) for x in os.environ.get("LOADS", "0.35,0.45,0.55").split(","))
POLICIES: dict[str, Policy] = {"first fit": first_fit, "choose": choose}


def total(outcomes: list[Outcome]) -> tuple[int, int, int, int, int]:
    return (sum(o.claims for o in outcomes), sum(o.placed for o in outcomes),
            sum(o.placed_slices for o in outcomes), sum(o.could_have_fit for o in outcomes),
            sum(o.one_gpu_repacked for o in outcomes))


def main() -> int:
    started = time.perf_counter()
    print(f"{GPUS} GPUs per fleet, {EVENTS} events per run, seeds 0-{SEEDS - 1}; "
          f"both rules replay the same events\n")
    head = "placed  slices  could-fit  repack"
    print(f"{'model':<10} {'release':>7} {'claims':>6} | first fit: {head} | "
          f"choose: {head} | could-fit per seed: fewer/same/more")
    grand = {name: [0, 0, 0, 0, 0] for name in POLICIES}
    for model in MODELS:
        for load in LOADS:
            runs: dict[str, list[Outcome]] = {name: [] for name in POLICIES}
            for seed in range(SEEDS):
                events = random_events(model, EVENTS, seed, load)
                for name, policy in POLICIES.items():
                    runs[name].append(simulate(model, GPUS, events, policy))
            pairs = list(zip(runs["choose"], runs["first fit"], strict=True))
            fewer = sum(c.could_have_fit < f.could_have_fit for c, f in pairs)
            more = sum(c.could_have_fit > f.could_have_fit for c, f in pairs)
            cells = []
            for name in POLICIES:
                claims, placed, slices, fit, repacked = total(runs[name])
                grand[name] = [a + b for a, b in zip(grand[name], total(runs[name]),
                                                     strict=True)]
                cells.append(f"{placed:>6} {slices:>7} {fit:>10} {repacked:>7}")
            print(f"{model:<10} {load:>7.2f} {claims:>6} | {'':>10} {cells[0]} | "
                  f"{'':>7} {cells[1]} | {fewer:>4}/{SEEDS - fewer - more}/{more}")
    print()
    for name, (claims, placed, slices, fit, repacked) in grand.items():
        print(f"{name:<10} all runs: {claims} claims, {placed} placed ({slices} slices), "
              f"{fit} refused although the fleet's free slices would have held them, "
              f"{repacked} of them one GPU could have held repacked")
    print(f"\n{time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
