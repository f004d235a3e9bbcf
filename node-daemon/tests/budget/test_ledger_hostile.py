"""A ledger is writable from inside its container: whatever is in the file, or in its place,
reading it is a finding about that container (``LedgerError``), never a crash, a hang or a
signal in the daemon (a mapped ledger truncated under the reader killed tessera-node with
SIGBUS). Property tests on arbitrary bytes, each kind of file in its place, and a fuzz run:
a second process doing random damage while the daemon's readers read
(``TESSERA_LEDGER_FUZZ_S`` seconds, 10 by default; docs/node-daemon.md gives a longer run's
figures)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_node.budget.ledger import (
    FILE_SIZE,
    HEADER_SIZE,
    LedgerError,
    LedgerReader,
    create_ledger,
    header_bytes,
    parse_header,
    parse_slot,
    read_ledger,
)

FUZZ = Path(__file__).with_name("ledger_fuzz.py")
FUZZ_S = float(os.environ.get("TESSERA_LEDGER_FUZZ_S", "10"))


@given(st.binary(max_size=HEADER_SIZE + 64))
def test_any_header_bytes_are_a_view_or_a_finding(raw: bytes) -> None:
    try:
        devices, n, _changes = parse_header(raw)
    except LedgerError:
        return
    assert len(devices) == 16 and 0 <= n <= 1024


@given(st.binary(min_size=256, max_size=256), st.booleans())
def test_any_slot_bytes_decode(raw: bytes, alive: bool) -> None:
    s = parse_slot(7, raw, alive)
    assert s is None or (s.index == 7 and len(s.bytes) == 16 and s.alive is alive)


@settings(max_examples=60, deadline=None)
@given(head=st.binary(max_size=HEADER_SIZE), size=st.one_of(
    st.just(FILE_SIZE), st.integers(0, 2 * FILE_SIZE)), valid_layout=st.booleans())
def test_any_file_is_read_or_refused(tmp_path_factory: pytest.TempPathFactory, head: bytes,
                                     size: int, valid_layout: bool) -> None:
    p = tmp_path_factory.mktemp("l") / "ledger"
    raw = bytearray(size)
    raw[: len(head)] = head[:size]
    if valid_layout and size >= 24:
        raw[:24] = header_bytes()[:24]
    p.write_bytes(bytes(raw))
    for read in (read_ledger, LedgerReader(p).read):
        try:
            view = read(p) if read is read_ledger else read()
        except LedgerError:
            assert size != FILE_SIZE or not valid_layout
            continue
        assert size == FILE_SIZE and len(view.devices) == 16


def test_every_kind_of_file_in_its_place_is_a_finding(tmp_path: Path) -> None:
    p = tmp_path / "ledger"
    create_ledger(p)
    assert read_ledger(p).slots == ()
    reader = LedgerReader(p)
    reader.RECHECK_S = 0.0
    reader.read()
    target = tmp_path / "secret"
    target.write_bytes(b"\0" * FILE_SIZE)
    cases = {
        "truncated": lambda: os.truncate(p, 0),
        "grown": lambda: os.truncate(p, FILE_SIZE + 1),
        "garbage": lambda: p.write_bytes(os.urandom(FILE_SIZE)),
        "symlink": lambda: (p.unlink(), p.symlink_to(target)),
        "symlink to a device": lambda: (p.unlink(), p.symlink_to("/dev/zero")),
        "fifo": lambda: (p.unlink(), os.mkfifo(p)),
        "directory": lambda: (p.unlink(), p.mkdir()),
        "gone": lambda: p.unlink(),
    }
    for name, damage in cases.items():
        damage()
        for read in (lambda: read_ledger(p), reader.read):
            with pytest.raises(LedgerError):
                read()
        if p.is_dir():
            p.rmdir()
        p.unlink(missing_ok=True)
        create_ledger(p)
        assert read_ledger(p).slots == (), name
        reader.read()


def test_the_daemons_ledger_is_the_librarys_fresh_ledger(tmp_path: Path) -> None:
    p = tmp_path / "ledger"
    dev, ino = create_ledger(p)
    st_ = p.stat()
    assert (st_.st_dev, st_.st_ino) == (dev, ino)
    assert st_.st_size == FILE_SIZE and st_.st_mode & 0o777 == 0o666
    assert p.read_bytes()[:HEADER_SIZE] == header_bytes()
    with pytest.raises(FileExistsError):
        create_ledger(p)  # never over an existing file


@pytest.mark.parametrize("in_place", [False, True], ids=["anything", "in-place"])
def test_fuzz_a_second_process_damages_the_ledger_while_the_daemon_reads(
        tmp_path: Path, in_place: bool) -> None:
    p = tmp_path / "ledger"
    create_ledger(p)
    mutator = subprocess.Popen(
        [sys.executable, str(FUZZ), "mutate", str(p), str(FUZZ_S), "27",
         *(["--in-place"] if in_place else [])], stdout=subprocess.PIPE, text=True)
    reader = subprocess.run([sys.executable, str(FUZZ), "read", str(p), str(FUZZ_S)],
                            capture_output=True, text=True, timeout=FUZZ_S + 60, check=False)
    out, _ = mutator.communicate(timeout=60)
    assert reader.returncode == 0, (reader.returncode, reader.stderr[-3000:])
    seen = json.loads(reader.stdout)
    done = json.loads(out)
    print(f"\n[figures] ledger fuzz {FUZZ_S:g}s ({'in place' if in_place else 'anything'}): "
          f"reads {seen}, damage {done}")
    assert seen["ok"] > 0 and seen["findings"] > 0, seen
    assert seen["longest_s"] < 1.0, seen
