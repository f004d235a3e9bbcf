"""A Service's virtual port on loopback, load-balanced by the kernel as kube-proxy does.

The benchmarks put the operator's replicas behind this instead of
:class:`tessera_e2e.operator.replicas.RoundRobinProxy`: that proxy copies every byte through a
Python thread of the benchmark's own process, so it measured the proxy (and the client's
event loop beside it) as part of tessera's admission latency.  In a cluster the API server
reaches a webhook Service through kube-proxy's iptables rules: the kernel rewrites each new
connection's destination (DNAT, conntrack keeps the rest of it) and copies nothing.  Here the
same: one nat chain per service, one rule per live replica, each picked with the probability
that makes the choice uniform (kube-proxy's ``statistic --mode random`` rules).

Needs root and iptables (the test bed's nodes need both anyway); a failure is an error.
"""

from __future__ import annotations

import re
import subprocess

from tessera_e2e.controlplane.errors import ControlPlaneError
from tessera_e2e.operator.replicas import free_port


class KernelService:
    """``127.0.0.1:port`` -> the replicas routed now, a new connection at a time."""

    def __init__(self) -> None:
        self.port = free_port()
        self.chain = f"TESSERA-SVC-{self.port}"
        self.backends: dict[str, int] = {}
        """Replica name -> its webhook port, for the replicas running now."""
        self._jump = ["OUTPUT", "-p", "tcp", "-d", "127.0.0.1", "--dport", str(self.port),
                      "-j", self.chain]

    def start(self) -> KernelService:
        self._program()
        _iptables("-t", "nat", "-A", *self._jump)
        return self

    def route(self, name: str, port: int) -> None:
        self.backends = {**self.backends, name: port}
        self._program()

    def drop(self, name: str, port: int) -> None:
        """Stop routing to replica ``name`` if ``port`` is still where it is routed."""
        if self.backends.get(name) == port:
            self.backends = {k: v for k, v in self.backends.items() if k != name}
            self._program()

    @property
    def connections(self) -> dict[int, int]:
        """New connections sent to each backend port so far (the DNAT rules' counters:
        in the nat table a rule sees only a connection's first packet)."""
        out = _iptables("-t", "nat", "-L", self.chain, "-n", "-v", "-x")
        counts: dict[int, int] = {}
        for line in out.splitlines():
            m = re.match(r"\s*(\d+)\s+\d+\s+DNAT\b.*to:127\.0\.0\.1:(\d+)", line)
            if m:
                counts[int(m.group(2))] = counts.get(int(m.group(2)), 0) + int(m.group(1))
        return counts

    def stop(self) -> None:
        _iptables("-t", "nat", "-D", *self._jump, check=False)
        _iptables("-t", "nat", "-F", self.chain, check=False)
        _iptables("-t", "nat", "-X", self.chain, check=False)

    def _program(self) -> None:
        """Replace the chain's rules in one iptables-restore transaction (no moment with
        half of them)."""
        ports = list(self.backends.values())
        lines = ["*nat", f":{self.chain} - [0:0]"]
        for i, port in enumerate(ports):
            left = len(ports) - i
            pick = ([] if left == 1 else
                    ["-m", "statistic", "--mode", "random", "--probability", f"{1 / left:.5f}"])
            lines.append(" ".join(["-A", self.chain, "-p", "tcp", *pick, "-j", "DNAT",
                                   "--to-destination", f"127.0.0.1:{port}"]))
        lines.append("COMMIT")
        done = subprocess.run(["iptables-restore", "--noflush"], input="\n".join(lines) + "\n",
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ControlPlaneError(f"iptables-restore for {self.chain} failed: "
                                    f"{done.stderr.strip()} (root and iptables are needed)")


def _iptables(*args: str, check: bool = True) -> str:
    done = subprocess.run(["iptables", "-w", *args], capture_output=True, text=True,
                          check=False)
    if check and done.returncode != 0:
        raise ControlPlaneError(f"iptables {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout
