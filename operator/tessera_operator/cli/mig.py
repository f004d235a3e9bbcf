"""``tessera mig``: inspect and plan MIG layouts without a GPU (models, layouts, plan)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from tessera.mig.catalog import UnknownProfileError, profile, profiles, slice_counts
from tessera.mig.planner import (
    DisruptionError,
    DisruptionPolicy,
    Instance,
    LayoutError,
    Plan,
    fit,
    maximal_layouts,
    plan,
)
from tessera.models import MODELS, UnknownModelError, get_model
from tessera_operator.cli.errors import CLIError


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add the ``mig`` command group."""
    group = subparsers.add_parser("mig", help="MIG profiles, layouts and reconfiguration plans")
    commands = group.add_subparsers(dest="mig_command", metavar="SUBCOMMAND")
    commands.required = True

    p = commands.add_parser("plan", help="place a layout, or plan the change from --current")
    p.add_argument("--gpu", required=True, metavar="MODEL", help="GPU model ID, e.g. H100-80GB")
    p.add_argument("profiles", nargs="+", metavar="PROFILE", help="desired profiles, e.g. 3g.40gb")
    p.add_argument("--current", default="", metavar="PROFILE@START,...",
                   help="instances the GPU has now")
    p.add_argument("--busy", default="", metavar="PROFILE@START,...",
                   help="current instances with running work (never destroyed)")
    p.add_argument("--policy", choices=[x.value for x in DisruptionPolicy],
                   default=DisruptionPolicy.WAIT.value,
                   help="when a busy instance must go: wait until idle, or refuse")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=_plan)

    p = commands.add_parser("layouts", help="every maximal layout of a GPU model")
    p.add_argument("--gpu", required=True, metavar="MODEL")
    p.add_argument("--media-extensions", action="store_true",
                   help="also enumerate the +me variants")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_layouts)

    p = commands.add_parser("models", help="GPU models and their MIG profiles")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_models)


def _model(model_id: str) -> str:
    try:
        return get_model(model_id).id
    except UnknownModelError as exc:
        raise CLIError(str(exc)) from None


def _instances(model_id: str, text: str, flag: str) -> list[tuple[str, int]]:
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, start = item.rpartition("@")
        if not sep or not name or not start.isdigit():
            raise CLIError(f"{flag}: expected PROFILE@START, got {item!r}")
        try:
            profile(model_id, name)
        except UnknownProfileError as exc:
            raise CLIError(f"{flag}: {exc}") from None
        out.append((name, int(start)))
    return out


def _plan(args: argparse.Namespace) -> int:
    model_id = _model(args.gpu)
    current = _instances(model_id, args.current, "--current")
    busy = _instances(model_id, args.busy, "--busy")
    try:
        if not current and not busy:
            placements = fit(model_id, args.profiles)
            if args.json:
                print(json.dumps({"gpu": model_id, "placements": [
                    {"profile": p.profile, "start": p.start, "size": p.size} for p in placements
                ]}))
            else:
                _table(["PROFILE", "START", "SLICES", "NVIDIA-SMI"], [
                    [p.profile, str(p.start), f"{p.start}-{p.start + p.size - 1}",
                     f"-cgi {profile(model_id, p.profile).smi_profile_id}:{p.start}"]
                    for p in placements
                ])
            return 0
        instances = [Instance(n, s, (n, s) in busy) for n, s in current]
        instances += [Instance(n, s, True) for n, s in busy if (n, s) not in current]
        result = plan(model_id, instances, args.profiles, DisruptionPolicy(args.policy))
    except (LayoutError, DisruptionError, UnknownProfileError) as exc:
        raise CLIError(str(exc)) from None
    _print_plan(model_id, result, args.json)
    return 0


def _print_plan(model_id: str, result: Plan, as_json: bool) -> None:
    if as_json:
        print(json.dumps({
            "gpu": model_id,
            "steps": [{"action": s.action, "profile": s.profile, "start": s.start}
                      for s in result.steps],
            "kept": [{"profile": p.profile, "start": p.start} for p in result.kept],
            "final": [{"profile": p.profile, "start": p.start, "size": p.size}
                      for p in result.final],
            "waitingFor": [{"profile": i.profile, "start": i.start} for i in result.waiting_for],
            "pendingSteps": [{"action": s.action, "profile": s.profile, "start": s.start}
                             for s in result.pending_steps],
        }))
        return
    if result.waiting_for:
        names = ", ".join(f"{i.profile}@{i.start}" for i in result.waiting_for)
        print(f"waiting: busy instance(s) {names} must be idle first; then:")
    steps = result.steps or result.pending_steps
    if not steps:
        print("nothing to do: the GPU already has this layout")
        return
    _table(["STEP", "ACTION", "PROFILE", "START"], [
        [str(n), s.action, s.profile, str(s.start)] for n, s in enumerate(steps, 1)
    ])
    kept = ", ".join(f"{p.profile}@{p.start}" for p in result.kept) or "none"
    print(f"kept: {kept}")


def _layouts(args: argparse.Namespace) -> int:
    model_id = _model(args.gpu)
    layouts = maximal_layouts(model_id, include_media_extensions=args.media_extensions)
    if args.json:
        print(json.dumps([list(layout) for layout in layouts]))
    else:
        for layout in layouts:
            print(" + ".join(layout))
    return 0


def _models(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    for m in MODELS:
        memory, compute = slice_counts(m.id)
        rows.append({
            "id": m.id, "name": m.nvml_name, "memoryMiB": m.memory_mib,
            "memorySlices": memory, "computeSlices": compute,
            "profiles": [p.name for p in profiles(m.id)],
        })
    if args.json:
        print(json.dumps(rows))
    else:
        _table(["MODEL", "NAME", "SLICES", "PROFILES"], [
            [r["id"], r["name"], f'{r["memorySlices"]}/{r["computeSlices"]}',
             " ".join(r["profiles"])] for r in rows
        ])
    return 0


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    for row in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
