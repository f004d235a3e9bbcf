from __future__ import annotations

import struct
import uuid as uuidlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera_node.budget.formats import (
    BUDGET_FILE_SIZE,
    GEN_OFFSET,
    BudgetEntry,
    BudgetFile,
    parse_budget_file,
    read_budget_file,
    uuid_bytes,
    write_budget_file,
)
from tessera_node.budget.ledger import read_ledger


def test_round_trip_and_generation(tmp_path: Path) -> None:
    p = tmp_path / "budget"
    e = BudgetEntry(index=0, memory=1 << 30, cores=30, rate=512.5, burst=5)
    assert write_budget_file(p, [e]) == 2
    assert p.stat().st_size == BUDGET_FILE_SIZE
    assert read_budget_file(p).entries == [e]
    with BudgetFile(p) as f:
        inode = p.stat().st_ino
        g = f.update([e, BudgetEntry(uuid="GPU-11111111-2222-3333-4444-555555555555", memory=7)])
        assert g == 4 and g % 2 == 0
        assert p.stat().st_ino == inode  # rewritten in place: bind mounts keep seeing it
        b = f.read()
    assert b.generation == 4
    assert b.entries[1].uuid == "GPU-11111111-2222-3333-4444-555555555555"
    assert b.entries[1].cores is None and b.entries[1].memory == 7


def test_unlimited_fields_and_validation() -> None:
    raw = BudgetEntry(index=3).pack()
    back = BudgetEntry.unpack(raw)
    assert back.memory is None and back.cores is None and back.index == 3
    with pytest.raises(ValueError):
        BudgetEntry(memory=-1).pack()
    with pytest.raises(ValueError):
        BudgetEntry(index=64).pack()


def test_parse_rejects_torn_and_foreign_files(tmp_path: Path) -> None:
    p = tmp_path / "b"
    write_budget_file(p, [BudgetEntry(memory=1)])
    raw = bytearray(p.read_bytes())
    struct.pack_into("<Q", raw, GEN_OFFSET, 3)
    with pytest.raises(ValueError, match="in progress"):
        parse_budget_file(bytes(raw))
    with pytest.raises(ValueError, match="magic"):
        parse_budget_file(b"x" * 64)
    with pytest.raises(ValueError):
        parse_budget_file(b"")


def test_uuid_bytes() -> None:
    assert uuid_bytes("MIG-00000000-0000-0000-0000-000000000001")[-1] == 1
    assert len(uuid_bytes("GPU-11111111-2222-3333-4444-555555555555")) == 16


def test_ledger_reader_rejects_other_files(tmp_path: Path) -> None:
    p = tmp_path / "ledger"
    p.write_bytes(b"\0" * 10)
    with pytest.raises(ValueError):
        read_ledger(p)


UUID_TEXT = st.builds(
    lambda kind, raw: f"{kind}-{uuidlib.UUID(bytes=raw)}",
    st.sampled_from(["GPU", "MIG"]),
    st.binary(min_size=16, max_size=16),
)


@given(
    uuid=UUID_TEXT,
    memory=st.none() | st.integers(min_value=0, max_value=(1 << 64) - 1),
    context=st.integers(min_value=0, max_value=(1 << 64) - 1),
)
def test_uuid_entries_round_trip(uuid: str, memory: int | None, context: int) -> None:
    """GPU and MIG UUIDs come back exactly as written: a MIG instance's budget entry must
    name the MIG device, not a GPU with the same 16 bytes."""
    e = BudgetEntry(uuid=uuid, memory=memory, context=context)
    back = BudgetEntry.unpack(e.pack())
    assert back == e
    assert back.uuid is not None and back.uuid.startswith(uuid[:4])


@given(entries=st.lists(st.builds(BudgetEntry, uuid=UUID_TEXT), max_size=16))
def test_budget_file_round_trips_mixed_gpu_and_mig_entries(
    tmp_path_factory: pytest.TempPathFactory, entries: list[BudgetEntry]
) -> None:
    p = tmp_path_factory.mktemp("rt") / "budget"
    write_budget_file(p, entries)
    assert read_budget_file(p).entries == entries


def test_uuid_text_is_canonical_and_prefixed() -> None:
    upper = "MIG-ABCDEF01-2345-6789-ABCD-EF0123456789"
    assert BudgetEntry(uuid=upper).uuid == upper.lower().replace("mig-", "MIG-")
    with pytest.raises(ValueError):
        BudgetEntry(uuid="abcdef01-2345-6789-abcd-ef0123456789")  # GPU or MIG?
    with pytest.raises(ValueError):
        BudgetEntry(uuid="MIG-GPU-abcdef01-2345-6789-abcd-ef0123456789/1/0")  # no 16 bytes


def test_pending_refused_ready_states_round_trip(tmp_path: Path) -> None:
    """A budget file goes pending -> ready or pending -> refused; each state names no device
    but the ready one, and a refused file carries its reason."""
    from tessera_node.budget.formats import BudgetFile, parse_budget_file

    with BudgetFile(tmp_path / "b") as f:
        g1 = f.set_pending(2500)
        b = f.read()
        assert (b.state, b.wait_ms, b.entries, b.generation) == ("pending", 2500, [], g1)
        g2 = f.update([BudgetEntry(index=0, memory=1 << 30)])
        b = f.read()
        assert b.state == "ready" and b.entries[0].memory == 1 << 30 and g2 > g1
        f.set_refused("GPU-x memory overcommitted: " + "é" * 300)
        b = f.read()
        assert b.state == "refused" and b.entries == []
        assert b.reason.startswith("GPU-x memory overcommitted: é")
        assert len(b.reason.encode()) <= 255  # the field keeps its NUL, no half character
        raw = bytearray((tmp_path / "b").read_bytes())
    raw[28:32] = (3).to_bytes(4, "little")  # pending and refused at once
    with pytest.raises(ValueError, match="state flags"):
        parse_budget_file(bytes(raw))
    raw[28:32] = (4).to_bytes(4, "little")  # a flag this version does not know
    with pytest.raises(ValueError, match="state flags"):
        parse_budget_file(bytes(raw))
    with BudgetFile(tmp_path / "c") as f, pytest.raises(ValueError, match="wait_ms"):
        f.set_pending(10**9)


def test_the_ledger_the_budget_names_survives_every_rewrite_and_a_reopen(
        tmp_path: Path) -> None:
    """The budget file names the container's ledger (device, inode) from the pending file the
    daemon writes at Allocate on; ready, refused and a restarted daemon's rewrite keep it."""
    p = tmp_path / "budget"
    with BudgetFile(p, ledger=(2049, 77)) as f:
        f.set_pending(1000)
        assert f.read().ledger == (2049, 77)
        f.update([BudgetEntry(memory=1)])
    with BudgetFile(p) as f:  # a restarted daemon
        assert f.ledger == (2049, 77)
        f.set_refused("no")
    assert read_budget_file(p).ledger == (2049, 77)
    write_budget_file(tmp_path / "plain", [BudgetEntry(memory=1)])
    assert read_budget_file(tmp_path / "plain").ledger is None
