"""Which pod holds which device, as the kubelet's PodResources API said (I/O: the calls).

The kubelet is asked only about the pods whose answer can change something now
(:func:`~tessera_node.deviceplugin.pacing.to_ask`: pending allocations' pods, oldest first,
until every pending allocation is found; pods with a refused container every poll), at the
daemon's own pace, backing off when the kubelet refuses (its rate limit). What it said is
kept per pod until the pod ends: it confirms allocations (``ask``) and answers the MIG
enactor's "which pods hold this unit" without a call (``holders``: the daemon's
``DeviceHolders``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

import grpc

from tessera.api.names import PREFIX
from tessera_node.deviceplugin.devices import unit_of
from tessera_node.deviceplugin.listgate import AllocationGate
from tessera_node.deviceplugin.manager import Manager
from tessera_node.deviceplugin.matcher import ContainerRef, Held, PodView, confirm
from tessera_node.deviceplugin.node_pods import NodePods, PodKey, is_device
from tessera_node.deviceplugin.pacing import Backoff, Pacer, PodState, to_ask
from tessera_node.deviceplugin.podresources import KubeletBusy, PodResourcesClient
from tessera_node.layout.holders import Holders
from tessera_node.settings import (
    PODRESOURCES_BACKOFF_S,
    PODRESOURCES_BURST,
    PODRESOURCES_QPS,
    Options,
)

log = logging.getLogger("tessera_node.deviceplugin")

UNCONFIRMED = "(a container allocated, its pod not confirmed yet)"


class HeldDevices:
    def __init__(self, opts: Options, pods: NodePods, gate: AllocationGate,
                 manager: Callable[[], Manager | None]) -> None:
        self.opts = opts
        self.pods = pods
        self.manager = manager
        """The resource manager once the device plugin is prepared (its allocations)."""
        self.podres = PodResourcesClient(opts.pod_resources_socket, gate=gate,
                                         pacer=Pacer(PODRESOURCES_QPS, PODRESOURCES_BURST))
        self.backoff = Backoff(*PODRESOURCES_BACKOFF_S)
        self._answers: dict[PodKey, tuple[str, float, list[Held]]] = {}
        """(namespace, pod) -> (its UID, when the kubelet was asked, what it said)."""
        self._lock = threading.Lock()

    def holders(self) -> Holders:
        """Unit -> pods holding it, as the kubelet last said for each pod that has not ended
        (a confirmed pod's devices stay its own until it ends: no call needed), and units of
        allocations not confirmed yet (their pod may not be in the watch yet, or not asked
        yet)."""
        if not self.pods.listed():
            raise OSError("the node's pods are not listed yet: which pods hold devices is "
                          "unknown")
        out: dict[str, list[str]] = {}
        for h in self._known(self.pods.asking()):
            if not h.resource.startswith(PREFIX):
                continue
            for d in h.device_ids:
                out.setdefault(unit_of(d), []).append(f"{h.ref.namespace}/{h.ref.pod}")
        manager = self.manager()
        if manager is not None:
            for unit in manager.unconfirmed_units():
                out.setdefault(unit, []).append(UNCONFIRMED)
        return out

    def _known(self, asking: Mapping[PodKey, PodView]) -> list[Held]:
        """What the kubelet last said those pods hold, oldest answer first (so that, where a
        device moved from one pod to another, the newer answer wins)."""
        with self._lock:
            got = [(at, rows) for key, (uid, at, rows) in self._answers.items()
                   if key in asking and asking[key].uid == uid]
        return [h for _, rows in sorted(got, key=lambda a: a[0]) for h in rows]

    def ask(self, manager: Manager) -> list[Held]:
        """Ask the kubelet about the pods whose answer can change something now, at the
        daemon's pace; then what is known of every pod that has not ended. Raises OSError
        when the kubelet cannot be asked."""
        if not self.pods.listed():
            raise OSError("the node's pods are not listed yet: which pods hold devices is "
                          "unknown")
        asking = self.pods.asking()
        now = time.monotonic()
        with self._lock:
            self._answers = {k: a for k, a in self._answers.items()
                             if k in asking and asking[k].uid == a[0]}
            asked = {k: a[1] for k, a in self._answers.items()}
        confirmed, refused = manager.confirmed()
        pending = manager.pending_keys()
        states = []
        for key, p in asking.items():
            mine = [ContainerRef(p.namespace, p.name, c) for c, lim in p.limits.items()
                    if any(is_device(r) for r in lim)
                    and not (c in p.init and c in p.started)]  # an init container that ran
            states.append(PodState(key, p.created, any(r not in confirmed for r in mine),
                                   any(r in refused for r in mine)))
        order = to_ask(states, bool(pending), asked, now, self.opts.confirm_interval_s,
                       self.opts.poll_interval_s)
        if order and not self.backoff.quiet(now):
            def enough(got: Mapping[PodKey, list[Held]]) -> bool:
                known = [h for rows in got.values() for h in rows] + self._known(asking)
                return pending.keys() <= set(confirm(known, pending))

            try:
                got = self.podres.answers(order, enough)
                self.backoff.answered()
            except KubeletBusy as exc:
                got = exc.args[1]
                wait = self.backoff.refused(time.monotonic())
                log.warning("the kubelet's PodResources refused a call (its rate limit): "
                            "quiet for a while", extra={"seconds": wait, "error": str(exc)})
            except grpc.RpcError as exc:
                raise OSError(f"kubelet PodResources at {self.opts.pod_resources_socket}: "
                              f"{exc.code().name}") from None
            at = time.monotonic()
            with self._lock:
                for key, rows in got.items():
                    self._answers[key] = (asking[key].uid, at, rows)
        return self._known(asking)
