"""A driver-API client for multi-process tests, run as ``python workload.py CMD ...``.

Uses ctypes on libcuda.so.1 (found through LD_LIBRARY_PATH, like any CUDA program)."""

from __future__ import annotations

import ctypes
import os
import sys
import time

MODULE = b".tessera_sim_module\nkernel busy ns_per_block=1000000\nkernel spin cost_param=0\n"


def check(rc: int, what: str) -> None:
    if rc != 0:
        print(f"{what} failed: {rc}", flush=True)
        sys.exit(3)


def busy(cu: ctypes.CDLL, kernels: int) -> None:
    """`kernels` launches of the 1 ms kernel, then wait for them."""
    mod = ctypes.c_void_p()
    fn = ctypes.c_void_p()
    check(cu.cuModuleLoadData(ctypes.byref(mod), MODULE), "load")
    check(cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"busy"), "function")
    for _ in range(kernels):
        check(cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, None, None, None), "launch")
    check(cu.cuCtxSynchronize(), "sync")


def main() -> None:
    cmd = sys.argv[1]
    cu = ctypes.CDLL("libcuda.so.1")
    check(cu.cuInit(0), "cuInit")
    ctx = ctypes.c_void_p()
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "retain")
    check(cu.cuCtxSetCurrent(ctx), "setcurrent")
    if cmd == "hold":  # hold MiB of device memory until killed
        p = ctypes.c_uint64()
        rc = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(int(sys.argv[2]) << 20))
        print(f"alloc {rc}", flush=True)
        time.sleep(600)
    elif cmd == "churn":  # allocate and free forever
        p = ctypes.c_uint64()
        print("ready", flush=True)
        while True:
            cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(1 << 20))
            cu.cuMemFree_v2(p)
    elif cmd == "busy":  # keep the device busy for `ms` with 1 ms kernels, then hold
        busy(cu, int(sys.argv[2]))
        print("done", flush=True)
        time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 0)
    elif cmd == "tenant":  # hold MiB, keep the device busy for `ms` with 1 ms kernels, stay
        p = ctypes.c_uint64()
        check(cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(int(sys.argv[2]) << 20)), "alloc")
        busy(cu, int(sys.argv[3]))
        print(f"ready {os.getpid()}", flush=True)
        time.sleep(600)
    elif cmd == "info":
        free = ctypes.c_size_t()
        total = ctypes.c_size_t()
        check(cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "meminfo")
        name = ctypes.create_string_buffer(256)
        check(cu.cuDeviceGetName(name, 256, 0), "name")
        n = ctypes.c_int()
        check(cu.cuDeviceGetCount(ctypes.byref(n)), "count")
        print(f"{n.value} {total.value} {free.value} {name.value.decode()}", flush=True)


if __name__ == "__main__":
    main()
