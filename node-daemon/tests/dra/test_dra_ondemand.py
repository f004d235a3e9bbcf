"""InstanceMaker on the simulated node (its NVML and nvidia-smi, in a child process: NVML is
process-global state): the instance a claim's placement asks is made at exactly that start
slot with its compute instance, asking again makes nothing, a GPU instance left without its
compute instance (a daemon killed mid-way) is completed, and destroying leaves an instance a
process still runs on, then removes it once the process is gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tessera_node.dra.claims import Result, wanted_instances
from tessera_node.layout.on_demand import MadeInstance
from tessera_sim import BIN_DIR, BUILD_DIR, LIB_DIR
from tessera_sim.node import GPUSpec, write_node

REPO = Path(__file__).resolve().parents[3]
WORKLOAD = REPO / "sim" / "tests" / "workload.py"

SCENARIO = """
import json, subprocess, sys
from tessera_node.device.hostlock import GPULocks
from tessera_node.device.nvml import NvmlReader
from tessera_node.device.smi import NvidiaSmi
from tessera_node.layout.instances import InstanceMaker
from tessera_node.layout.on_demand import MadeInstance
from tessera_node.layout.enact import SmiEnactor
from tessera_node import metrics

build, smi_path, state, workload = sys.argv[1:5]
reader = NvmlReader(build)
enactor = SmiEnactor(NvidiaSmi(smi_path), reader, GPULocks(state), recheck_s=1)
enactor.prepare()
maker = InstanceMaker(enactor)
uuid = reader.read().gpus[0].uuid
out = {"refusal": enactor.refusal()}

def layout():
    return sorted((i.profile, i.start, bool(i.uuid)) for i in reader.read().gpus[0].instances)

def commands():
    return sum(s.value for m in metrics.SMI_COMMANDS.collect() for s in m.samples
               if s.name.endswith("_total"))

big = MadeInstance(0, uuid, "3g.40gb", 4)
made = maker.make(big)
out["made"] = [made.profile, made.start, made.uuid[:4]]
n = commands()
again = maker.make(big)
out["again_same_uuid"] = again.uuid == made.uuid
out["again_commands"] = commands() - n
# a GPU instance without its compute instance, as a daemon killed between the two leaves it
r = subprocess.run([smi_path, "mig", "-i", "0", "-cgi", "1g.10gb:0"], capture_output=True,
                   text=True)
out["half_made"] = r.returncode == 0 and ("1g.10gb", 0, False) in layout()
maker.make(MadeInstance(0, uuid, "1g.10gb", 0))
out["completed"] = layout()
# a process on the 3g.40gb: destroying leaves it, and says why
env = {**__import__("os").environ, "CUDA_VISIBLE_DEVICES": made.uuid}
p = subprocess.Popen([sys.executable, workload, "hold", "64"], env=env, stdout=subprocess.PIPE,
                     text=True)
out["held"] = p.stdout.readline().strip()
out["busy_why"] = maker.unmake(big)
out["busy_layout"] = layout()
p.kill(); p.wait()
out["idle_why"] = maker.unmake(big)
out["gone_again"] = maker.unmake(big)
out["after"] = layout()
out["wrong_gpu"] = None
try:
    maker.make(MadeInstance(0, "GPU-other", "1g.10gb", 1))
except OSError as e:
    out["wrong_gpu"] = str(e)
# a DRA node's runner: nothing asked, no prepared claim holds anything; of two instances
# nobody holds, the one a claim was allocated (not prepared yet) stays, the other goes
from tessera.dra.partitions import Bounds
from tessera_node.layout.advertise import NothingAdvertised
from tessera_node.layout.desired import GPUTarget
from tessera_node.layout.instances import DemandRunner
maker.make(MadeInstance(0, uuid, "3g.40gb", 4))
allocated = MadeInstance(0, uuid, "3g.40gb", 4)
now = [0.0]
runner = DemandRunner(maker, NothingAdvertised(), lambda: frozenset(), idle_s=10,
                      keeps=lambda inst, have: ("allocated to team/x (ResourceClaim)"
                                                if inst == allocated else None),
                      clock=lambda: now[0])
targets = {uuid: GPUTarget("lab", 1, True, on_demand=Bounds())}
out["runner_due"] = [runner.due_in()]
out["runner_early"] = bool(runner.decide(reader.read(), targets, []))
out["runner_due"].append(runner.due_in())
now[0] = 10.0
work = runner.decide(reader.read(), targets, [])
out["runner_destroys"] = sorted([i.profile, i.start] for i in work.destroy)
runner.run(work)
out["runner_after"] = layout()
out["runner_due"].append(runner.due_in())  # the kept one: asked again a grace later
out["counts"] = {f"{s.labels['action']}/{s.labels['result']}": s.value
                 for m in metrics.MIG_ON_DEMAND.collect() for s in m.samples
                 if s.name.endswith("_total")}
print(json.dumps(out))
"""


def run_scenario(tmp_path: Path) -> dict[str, Any]:
    node = write_node(tmp_path / "node.conf", [GPUSpec.parse("H100-80GB:mig")], None,
                      seed="ondemand")
    env = {**os.environ, "TESSERA_SIM_NODE": str(node),
           "LD_LIBRARY_PATH": f"{LIB_DIR}:{os.environ.get('LD_LIBRARY_PATH', '')}",
           "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in (
               "core", "operator", "node-daemon", "sim"))}
    out = subprocess.run([sys.executable, "-c", SCENARIO, str(BUILD_DIR),
                          str(BIN_DIR / "nvidia-smi"), str(tmp_path / "state"), str(WORKLOAD)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_instances_are_made_where_asked_once_and_destroyed_only_when_idle(
        tmp_path: Path) -> None:
    got = run_scenario(tmp_path)
    assert got["refusal"] is None
    assert got["made"][:2] == ["3g.40gb", 4] and got["made"][2] == "MIG-"
    assert got["again_same_uuid"] and got["again_commands"] == 0  # nothing run again
    assert got["half_made"]
    assert got["completed"] == [["1g.10gb", 0, True], ["3g.40gb", 4, True]]
    assert got["held"] == "alloc 0"
    assert got["busy_why"].startswith("3g.40gb at slot 4 of GPU 0 stays: pid "), got["busy_why"]
    assert ["3g.40gb", 4, True] in got["busy_layout"]
    assert got["idle_why"] is None and got["gone_again"] is None
    assert got["after"] == [["1g.10gb", 0, True]]
    assert "GPU 0 (GPU-other) is not on this node now" in got["wrong_gpu"]
    # the runner (DRA: nothing asked, nothing prepared) finds both idle; the one a claim
    # is allocated stays, the other is destroyed
    assert got["runner_early"] is False  # nothing before the grace
    assert got["runner_destroys"] == [["1g.10gb", 0], ["3g.40gb", 4]]
    assert got["runner_due"] == [None, 10.0, 10.0]
    assert got["runner_after"] == [["3g.40gb", 4, True]]
    # made: 3g.40gb, asked again, 1g.10gb completed, 3g.40gb again; the wrong GPU; two
    # real destroys
    assert got["counts"] == {"create/ok": 4.0, "create/error": 1.0, "destroy/ok": 2.0}


def test_a_claims_results_ask_the_placements_of_on_demand_gpus_only() -> None:
    gpus = {1: ("GPU-b", "H100-80GB"), 2: ("GPU-c", "A30-24GB")}
    results = [Result("a", "node-x", "gpu1-mig4-3g40gb"),
               Result("b", "node-x", "gpu0-mig0-1g10gb"),   # GPU 0 is not on demand
               Result("c", "node-x", "gpu2-mig2-2g12gb"),
               Result("d", "node-y", "gpu1-mig0-1g10gb"),   # another node's pool
               Result("e", "node-x", "gpu1"),               # a whole GPU
               Result("f", "node-x", "gpu1-mig5-3g40gb")]   # no such start
    assert wanted_instances(results, "node-x", gpus) == [
        MadeInstance(1, "GPU-b", "3g.40gb", 4), MadeInstance(2, "GPU-c", "2g.12gb", 2)]
