"""Every kernel a container launches is counted in its ledger, with or without a core limit:
the node daemon's activity signal for a container it cannot see through NVML (a whole MIG
instance held without a core budget is never judged idle otherwise)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from tessera_hook_harness import GIB, Container

from tessera_node.budget import ledger as led


def test_launches_are_counted_without_a_core_limit(container: Container) -> None:
    """Each launch API and a graph of one kernel: 400 launches, 400 counted; a second
    process's count adds to the first's."""
    container.set_simple(memory=GIB)
    assert container.probe("launch", "400", "1")["launches"] == 400
    assert container.read_ledger().launches == 400
    container.probe("launch", "40", "1")
    assert container.read_ledger().launches == 440


def test_core_limited_launches_are_counted_exactly(container: Container) -> None:
    container.set_simple(memory=GIB, cores=50, rate=100000)
    container.probe("launch", "200", "1")
    assert container.read_ledger().launches == 200


def test_launches_of_reclaimed_slots_stay_counted(hook_built: None, tmp_path: Path) -> None:
    """A process's count outlives its slot: every slot of the ledger taken by a dead owner
    that launched 5 kernels, a new process reclaims one (the one its PID picks) and launches
    100; the container's count is 5,120 + 100, 5 of them now the reclaimed processes'."""
    c = Container(tmp_path, "gone")
    c.daemon_ledger()
    c.set_simple(memory=GIB)
    fd = os.open(c.ledger, os.O_RDWR)
    try:
        for i in range(led.NSLOTS):
            slot = bytearray(led.SLOT_SIZE)
            struct.pack_into("<iIQ", slot, 0, 4_000_000 + i, 1, 1)
            struct.pack_into("<Q", slot, led.SLOT_TAIL_OFFSET, 5)
            os.pwrite(fd, bytes(slot), led.HEADER_SIZE + i * led.SLOT_SIZE)
        os.pwrite(fd, struct.pack("<I", led.NSLOTS), led.HWM_OFFSET)
    finally:
        os.close(fd)
    before = c.read_ledger()
    assert before.launches == 5 * led.NSLOTS and before.launches_gone == 0
    c.probe("launch", "100", "1")
    after = c.read_ledger()
    assert after.launches_gone == 5
    assert after.launches == 5 * led.NSLOTS + 100
    c.budget.close()
