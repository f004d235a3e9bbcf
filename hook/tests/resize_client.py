"""A long-running driver-API client for resize tests: one command per stdin line.

    alloc MIB   -> "ok" or "err RC"  (the allocation is kept)
    free        -> "ok"              (frees the newest kept allocation)
    used        -> "used BYTES"      (cuMemGetInfo_v2: what the budget view says is in use)
"""

from __future__ import annotations

import ctypes
import sys


def main() -> None:
    cu = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    assert cu.cuInit(0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    held: list[int] = []
    print("ready", flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "alloc":
            p = ctypes.c_uint64()
            rc = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(int(args[0]) << 20))
            if rc == 0:
                held.append(p.value)
            print("ok" if rc == 0 else f"err {rc}", flush=True)
        elif cmd == "free":
            print("ok" if cu.cuMemFree_v2(ctypes.c_uint64(held.pop())) == 0 else "err",
                  flush=True)
        elif cmd == "used":
            free, total = ctypes.c_size_t(), ctypes.c_size_t()
            cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
            print(f"used {total.value - free.value}", flush=True)


if __name__ == "__main__":
    main()
