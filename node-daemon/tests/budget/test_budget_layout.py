"""``formats.py`` and ``ledger.py`` agree with ``hook/src/formats.h``, byte for byte.

The C compiler reads the header (sizes, offsets and constants as the library is built with
them) and prints them; the Python side is compared with that, not with a copy of the
numbers. Needs a C compiler, not root."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import tessera_node.budget.formats as fmt
import tessera_node.budget.ledger as led

ROOT = Path(__file__).resolve().parents[3]
HEADER = ROOT / "hook" / "src" / "formats.h"

PROGRAM = r"""
#include <stddef.h>
#include <stdio.h>
#include "formats.h"
#define O(t, f) printf("\"%s.%s\": %zu,\n", #t, #f, offsetof(struct t, f))
#define S(t) printf("\"sizeof %s\": %zu,\n", #t, sizeof(struct t))
#define C(n) printf("\"%s\": %llu,\n", #n, (unsigned long long)(n))
int main(void)
{
    printf("{\n");
    C(TB_MAGIC); C(TB_VERSION); C(TB_FILE_SIZE); C(TB_MAX_DEV);
    C(TB_DEV_MEM_LIMIT); C(TB_DEV_CORE_LIMIT); C(TB_DEV_UUID); C(TB_DEV_MIG);
    C(TB_PENDING); C(TB_REFUSED); C(TB_WAIT_MAX_MS); C(TB_REASON_OFF); C(TB_REASON_LEN);
    S(tb_file_header); S(tb_file_dev);
    O(tb_file_header, magic); O(tb_file_header, version); O(tb_file_header, generation);
    O(tb_file_header, header_size); O(tb_file_header, entry_size); O(tb_file_header, ndev);
    O(tb_file_header, flags); O(tb_file_header, wait_ms); O(tb_file_header, reserved0);
    O(tb_file_header, ledger_dev); O(tb_file_header, ledger_ino); O(tb_file_header, reserved1);
    O(tb_file_dev, uuid); O(tb_file_dev, index); O(tb_file_dev, flags);
    O(tb_file_dev, mem_limit); O(tb_file_dev, core_target); O(tb_file_dev, reserved0);
    O(tb_file_dev, rate_milli); O(tb_file_dev, burst_milli); O(tb_file_dev, context_bytes);
    C(TL_MAGIC); C(TL_VERSION); C(TL_NSLOTS); C(TL_HEADER_SIZE); C(TL_LOCK_BASE);
    C(TL_FILE_SIZE);
    S(tl_dev); S(tl_slot);
    O(tl_header, magic); O(tl_header, version); O(tl_header, nslots); O(tl_header, ndev);
    O(tl_header, header_size); O(tl_header, slot_size); O(tl_header, hwm);
    O(tl_header, slot_changes); O(tl_header, launches_gone);
    O(tl_header, dev); O(tl_header, wait_hist);
    O(tl_dev, used); O(tl_dev, tat_ns); O(tl_dev, tokens_milli); O(tl_dev, launches);
    O(tl_dev, wait_ns); O(tl_dev, waits); O(tl_dev, oom);
    O(tl_slot, pid); O(tl_slot, gen); O(tl_slot, joined_ns); O(tl_slot, bytes);
    O(tl_slot, launches); O(tl_slot, wait_ns); O(tl_slot, start_ticks); O(tl_slot, pidns);
    printf("\"wait_hist buckets\": %zu\n}\n",
           sizeof(((struct tl_header *)0)->wait_hist[0]) / sizeof(uint32_t));
    return 0;
}
"""


def c_layout(tmp: Path) -> dict[str, Any]:
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "needs a C compiler (cc or gcc) to read hook/src/formats.h"
    src = tmp / "layout.c"
    src.write_text(PROGRAM)
    exe = tmp / "layout"
    subprocess.run(
        [cc, "-std=gnu11", "-Wall", "-Werror", f"-I{HEADER.parent}", "-o", str(exe), str(src)],
        check=True,
    )
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    layout: dict[str, Any] = json.loads(out)
    return layout


def offsets(st: struct.Struct) -> list[int]:
    """Byte offset of every field of a little-endian (unpadded) struct format; a padding
    run (``x``) is not a field."""
    assert st.format.startswith("<")
    out, pos = [], 0
    for count_text, code in re.findall(r"(\d*)([a-zA-Z?])", st.format[1:]):
        count = int(count_text or 1)
        if code in "sx":
            if code == "s":
                out.append(pos)
            pos += count
            continue
        for _ in range(count):
            out.append(pos)
            pos += struct.calcsize("<" + code)
    assert pos == st.size
    return out


def test_budget_file_matches_the_header(tmp_path: Path) -> None:
    c = c_layout(tmp_path)
    assert (
        c["TB_MAGIC"], c["TB_VERSION"], c["TB_FILE_SIZE"], c["TB_MAX_DEV"],
    ) == (fmt.MAGIC, fmt.VERSION, fmt.BUDGET_FILE_SIZE, fmt.MAX_DEV)
    assert (
        c["TB_DEV_MEM_LIMIT"], c["TB_DEV_CORE_LIMIT"], c["TB_DEV_UUID"], c["TB_DEV_MIG"],
    ) == (fmt.DEV_MEM_LIMIT, fmt.DEV_CORE_LIMIT, fmt.DEV_UUID, fmt.DEV_MIG)
    assert fmt.HEADER.size == c["sizeof tb_file_header"]
    assert fmt.ENTRY.size == c["sizeof tb_file_dev"]
    assert (
        c["TB_PENDING"], c["TB_REFUSED"], c["TB_WAIT_MAX_MS"], c["TB_REASON_OFF"],
        c["TB_REASON_LEN"],
    ) == (fmt.PENDING, fmt.REFUSED, fmt.WAIT_MAX_MS, fmt.REASON_OFFSET, fmt.REASON_LEN)
    header = ["magic", "version", "generation", "header_size", "entry_size", "ndev", "flags",
              "wait_ms", "reserved0", "ledger_dev", "ledger_ino", "reserved1"]
    assert offsets(fmt.HEADER) == [c[f"tb_file_header.{f}"] for f in header]
    assert c["tb_file_header.generation"] == fmt.GEN_OFFSET
    assert c["tb_file_header.ledger_dev"] == fmt.LEDGER_OFFSET
    entry = ["uuid", "index", "flags", "mem_limit", "core_target", "reserved0", "rate_milli",
             "burst_milli", "context_bytes"]
    assert offsets(fmt.ENTRY) == [c[f"tb_file_dev.{f}"] for f in entry]


def test_ledger_matches_the_header(tmp_path: Path) -> None:
    c = c_layout(tmp_path)
    assert (
        c["TL_MAGIC"], c["TL_VERSION"], c["TL_NSLOTS"], c["TB_MAX_DEV"],
    ) == (led.MAGIC, led.VERSION, led.NSLOTS, led.MAX_DEV)
    assert (
        c["TL_HEADER_SIZE"], c["sizeof tl_slot"], c["TL_FILE_SIZE"], c["TL_LOCK_BASE"],
    ) == (led.HEADER_SIZE, led.SLOT_SIZE, led.FILE_SIZE, led.LOCK_BASE)
    head = ["magic", "version", "nslots", "ndev", "header_size", "slot_size"]
    assert [4 * i for i in range(len(head))] == [c[f"tl_header.{f}"] for f in head]
    assert c["tl_header.hwm"] == led.HWM_OFFSET
    assert c["tl_header.launches_gone"] == led.LAUNCHES_GONE_OFFSET
    assert c["tl_header.slot_changes"] == led.SLOT_CHANGES_OFFSET
    assert c["tl_header.dev"] == led.DEV_OFFSET and led.DEV.size == c["sizeof tl_dev"]
    dev = ["used", "tat_ns", "tokens_milli", "launches", "wait_ns", "waits", "oom"]
    assert offsets(led.DEV)[: len(dev)] == [c[f"tl_dev.{f}"] for f in dev]
    assert c["tl_header.wait_hist"] == led.WAIT_HIST_OFFSET
    assert c["wait_hist buckets"] == led.WAIT_BUCKETS
    assert offsets(led.SLOT_HEAD) == [c[f"tl_slot.{f}"] for f in ("pid", "gen", "joined_ns")]
    assert c["tl_slot.bytes"] == led.SLOT_BYTES_OFFSET
    tail = ["launches", "wait_ns", "start_ticks", "pidns"]
    assert [led.SLOT_TAIL_OFFSET + o for o in offsets(led.SLOT_TAIL)] == [
        c[f"tl_slot.{f}"] for f in tail
    ]
