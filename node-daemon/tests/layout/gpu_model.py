"""A model of one GPU under nvidia-smi's MIG commands, for the pure tests: what a GPU looks
like after a command (IDs and UUIDs as the simulator and real A100s give them), with the
driver's refusals (busy instances, a GI with CIs, MIG off with GIs) and Ampere's pending
modes.  ``part`` runs only the first k items of a list command: a daemon killed mid-command."""

from __future__ import annotations

import itertools
from dataclasses import replace

from tessera.mig.catalog import profile, profiles
from tessera.models import get_model
from tessera_node.device.state import GPUState, MigInstanceState, ProfileInfo
from tessera_node.layout.commands import Command

_uuids = itertools.count(1)


class Refused(Exception):
    pass


def new_gpu(model: str = "H100-80GB", mig: bool = False, ampere: bool = False,
            index: int = 0) -> GPUState:
    m = get_model(model)
    infos = tuple(ProfileInfo(p.smi_profile_id, p.name, p.memory_mib, p.compute_slices,
                              p.max_count, p.sm_count) for p in profiles(model))
    g = GPUState(index, f"GPU-{index}", m.nvml_name, m.pci_device_id, m.memory_mib << 20, 0,
                 None, "enabled" if mig else "disabled", None, (), infos if mig else ())
    return g


def gi_id(size: int, start: int) -> int:
    return 8 // size - 1 + start // size


def instance(model: str, name: str, start: int, with_ci: bool = True,
             processes: tuple[str, ...] = ()) -> MigInstanceState:
    p = profile(model, name)
    return MigInstanceState(p.smi_profile_id, name, start, p.memory_slices,
                            gi_id(p.memory_slices, start),
                            f"MIG-{next(_uuids)}" if with_ci else "", processes=processes)


def model_id(g: GPUState) -> str:
    from tessera_node.device.state import model_of
    m = model_of(g)
    assert m is not None
    return m.id


def run(g: GPUState, c: Command, ampere: bool = False, part: int | None = None) -> GPUState:
    """``g`` after ``c`` (raises Refused like nvidia-smi's non-zero exit)."""
    args = c.args
    insts = list(g.instances)
    if c.action in ("enable-mig", "disable-mig"):
        mode = "enabled" if c.action == "enable-mig" else "disabled"
        if mode == "disabled" and insts:
            raise Refused("In use by another client")
        if mode == g.mig_mode:
            return replace(g, mig_pending=None)
        if g.processes or any(i.processes for i in insts) or ampere:
            return replace(g, mig_pending=mode)  # type: ignore[arg-type]
        return replace(g, mig_mode=mode, mig_pending=None)  # type: ignore[arg-type]
    if c.action == "reset-gpu":
        if g.processes:
            raise Refused("in use")
        return replace(g, mig_mode=g.mig_pending or g.mig_mode, mig_pending=None, instances=())
    assert g.mig_mode == "enabled"
    model = model_id(g)
    if c.action == "create-gi":
        tokens = args[args.index("-cgi") + 1].split(",")
        for token in tokens[:part]:
            name, start = token.rsplit(":", 1)
            new = instance(model, name, int(start), with_ci=False)
            p = profile(model, name)
            taken = 0
            for i in insts:
                taken |= profile(model, i.profile).mask(i.start)
            if taken & p.mask(int(start)) or int(start) not in p.starts:
                raise Refused("Insufficient Resources")
            insts.append(new)
    else:
        ids = [int(x) for x in args[args.index("-gi") + 1].split(",")][:part]
        for n, i in enumerate(insts):
            if i.gi_id not in ids:
                continue
            if i.processes:
                raise Refused("In use by another client")
            if c.action == "create-ci":
                insts[n] = replace(i, uuid=f"MIG-{next(_uuids)}")
            elif c.action == "destroy-ci":
                insts[n] = replace(i, uuid="")
            elif i.uuid:
                raise Refused("In use by another client")
        if c.action == "destroy-gi":
            insts = [i for i in insts if i.gi_id not in ids]
    return replace(g, instances=tuple(sorted(insts, key=lambda i: (i.start, i.gi_id))))
