"""The test bed's network: one bridge in the host, one veth pair per node, routes per node.

```
host netns                      node n0 netns                  node n1 netns
  tessera<S> 172.20.S.1/24 ---- eth0 172.20.S.10 ------------- eth0 172.20.S.11
  (kube-apiserver binds here)     cni0 10.(100+S).0.1/24         cni0 10.(100+S).1.1/24
  route 10.(100+S).i.0/24          pods 10.(100+S).0.x           pods 10.(100+S).1.x
        via node i                 route 10.(100+S).1.0/24       route 10.(100+S).0.0/24
                                         via 172.20.S.11               via 172.20.S.10
```

S is the run's slot (0..SLOTS-1); the bridge's name is the claim: creating `tessera<S>` is
atomic, so concurrent test beds on one machine take different slots. Nodes get no default
route: a pod can reach other pods, the nodes and the API server, and nothing beyond this
machine. Deleting a node's network namespace deletes its veth, bridge (cni0) and iptables
rules; deleting the host bridge deletes the host's routes.
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from tessera_e2e.controlplane.errors import ControlPlaneError

SLOTS = 32
BRIDGE_PREFIX = "tessera"


@dataclass(frozen=True)
class Plan:
    """The addresses of one test bed (pure arithmetic on the slot)."""

    slot: int

    @property
    def bridge(self) -> str:
        return f"{BRIDGE_PREFIX}{self.slot}"

    @property
    def host_ip(self) -> str:
        return f"172.20.{self.slot}.1"

    @property
    def prefix_length(self) -> int:
        return 24

    @property
    def cluster_cidr(self) -> str:
        """Every pod address of this test bed (kube-proxy's --cluster-cidr)."""
        return f"10.{100 + self.slot}.0.0/16"

    def node_ip(self, index: int) -> str:
        return f"172.20.{self.slot}.{10 + index}"

    def pod_subnet(self, index: int) -> str:
        return f"10.{100 + self.slot}.{index}.0/24"

    def pod_gateway(self, index: int) -> str:
        return str(next(ipaddress.ip_network(self.pod_subnet(index)).hosts()))

    def veth(self, index: int) -> str:
        """The host end of node `index`'s veth pair (at most 15 characters)."""
        return f"{self.bridge}n{index}"


def run(argv: Sequence[str], what: str) -> None:
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ControlPlaneError(f"{what} failed: `{' '.join(argv)}`: {result.stderr.strip()}")


def in_netns(pid: int, *argv: str) -> list[str]:
    """argv run inside the network namespace of process `pid`."""
    return ["nsenter", "-t", str(pid), "-n", "--", *argv]


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True,
                          check=False).returncode == 0


def delete_link(name: str) -> None:
    """Delete an interface if it exists (a veth's peer goes with it)."""
    subprocess.run(["ip", "link", "delete", name], capture_output=True, check=False)


class TestbedNetwork:
    """Claim a slot with `claim()`, `attach()` each node, `route()` once all are attached,
    `remove()` at the end (also safe after a partial setup)."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.attached: list[int] = []

    @classmethod
    def claim(cls) -> TestbedNetwork:
        for slot in range(SLOTS):
            plan = Plan(slot)
            created = subprocess.run(
                ["ip", "link", "add", plan.bridge, "type", "bridge"],
                capture_output=True, text=True, check=False,
            )
            if created.returncode == 0:
                network = cls(plan)
                try:
                    run(["ip", "addr", "add", f"{plan.host_ip}/{plan.prefix_length}",
                         "dev", plan.bridge], "addressing the test bed bridge")
                    run(["ip", "link", "set", plan.bridge, "up"], "starting the bridge")
                except ControlPlaneError:
                    network.remove()
                    raise
                return network
            if "File exists" not in created.stderr:
                raise ControlPlaneError(
                    f"cannot create the test bed bridge {plan.bridge}: {created.stderr.strip()} "
                    "(creating network interfaces needs root)"
                )
        raise ControlPlaneError(
            f"all {SLOTS} test bed bridges ({BRIDGE_PREFIX}0..{SLOTS - 1}) exist: other test "
            "beds are running, or killed runs left them (`ip link delete tesseraN`)"
        )

    def attach(self, index: int, pid: int) -> None:
        """A veth pair from the bridge into the network namespace of `pid`, as its eth0."""
        plan, veth = self.plan, self.plan.veth(index)
        self.attached.append(index)
        run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns",
             str(pid)], f"creating node {index}'s veth pair")
        run(["ip", "link", "set", veth, "master", plan.bridge, "up"], "plugging the veth")
        for argv in (
            ["ip", "link", "set", "lo", "up"],
            ["ip", "addr", "add", f"{plan.node_ip(index)}/{plan.prefix_length}", "dev", "eth0"],
            ["ip", "link", "set", "eth0", "up"],
            ["sysctl", "-qw", "net.ipv4.ip_forward=1"],
        ):
            run(in_netns(pid, *argv), f"configuring node {index}'s network")

    def route(self, pids: dict[int, int]) -> None:
        """Pod subnets reachable between all attached nodes and from the host."""
        plan = self.plan
        for index, pid in pids.items():
            run(["ip", "route", "replace", plan.pod_subnet(index), "via", plan.node_ip(index),
                 "dev", plan.bridge], "routing a pod subnet from the host")
            for other in pids:
                if other != index:
                    run(in_netns(pid, "ip", "route", "replace", plan.pod_subnet(other), "via",
                                 plan.node_ip(other)), "routing between nodes")

    def detach(self, index: int) -> None:
        delete_link(self.plan.veth(index))

    def remove(self) -> None:
        for index in self.attached:
            self.detach(index)
        self.attached = []
        delete_link(self.plan.bridge)
