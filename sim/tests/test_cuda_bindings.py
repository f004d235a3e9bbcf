"""PyPI's cuda-bindings driver module against the fake libcuda.so.1.

cuda.bindings dlopens libcuda.so.1 through the library path and resolves every entry point
with cuGetProcAddress_v2, as frameworks do; it runs in a subprocess so that the library path
is set before the loader reads it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from .conftest import Node

PROGRAM = r'''
import ctypes
from cuda.bindings import driver as cu

def ok(r):
    r = r if isinstance(r, tuple) else (r,)
    assert r[0] == cu.CUresult.CUDA_SUCCESS, r[0]
    rest = r[1:]
    return None if not rest else rest[0] if len(rest) == 1 else rest

ok(cu.cuInit(0))
print("version", ok(cu.cuDriverGetVersion()))
print("count", ok(cu.cuDeviceGetCount()))
dev = ok(cu.cuDeviceGet(0))
print("name", ok(cu.cuDeviceGetName(64, dev)).split(b"\0")[0].decode())
SMS = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
print("sms", ok(cu.cuDeviceGetAttribute(SMS, dev)))
ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
ok(cu.cuCtxSetCurrent(ctx))
free0, total = ok(cu.cuMemGetInfo())
ptr = ok(cu.cuMemAlloc(1 << 20))
free1, _ = ok(cu.cuMemGetInfo())
print("charged", free0 - free1)
host = (ctypes.c_uint32 * 256)(*range(256))
ok(cu.cuMemcpyHtoD(ptr, ctypes.addressof(host), ctypes.sizeof(host)))
back = (ctypes.c_uint32 * 256)()
ok(cu.cuMemcpyDtoH(ctypes.addressof(back), ptr, ctypes.sizeof(back)))
print("roundtrip", list(back) == list(host))
image = b".tessera_sim_module\nkernel scale ns_per_block=2000\n\0"
mod = ok(cu.cuModuleLoadData(image))
fn = ok(cu.cuModuleGetFunction(mod, b"scale"))
stream = ok(cu.cuStreamCreate(0))
start, stop = ok(cu.cuEventCreate(0)), ok(cu.cuEventCreate(0))
arg = ctypes.c_uint64(int(ptr))
params = (ctypes.c_void_p * 1)(ctypes.addressof(arg))
ok(cu.cuEventRecord(start, stream))
ok(cu.cuLaunchKernel(fn, 1000, 1, 1, 128, 1, 1, 0, stream, ctypes.addressof(params), 0))
ok(cu.cuEventRecord(stop, stream))
ok(cu.cuStreamSynchronize(stream))
print("kernel_ms", round(ok(cu.cuEventElapsedTime(start, stop)), 1))
err, = cu.cuMemAlloc(1 << 50)[:1]
print("oom", err.name)
ok(cu.cuMemFree(ptr))
ok(cu.cuDevicePrimaryCtxRelease(dev))
'''


def test_cuda_bindings_driver(make_node: Callable[..., Node]) -> None:
    node = make_node("H100-80GB")
    r = subprocess.run([sys.executable, "-c", PROGRAM], env=node.env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert int(out["version"]) >= 12000
    assert out["count"] == "1"
    assert out["name"] == "NVIDIA H100 80GB HBM3"
    assert out["sms"] == "132"
    assert out["charged"] == str(1 << 20)
    assert out["roundtrip"] == "True"
    # 1000 blocks x 2 us; the start event is taken on an idle stream, so the host's time
    # until the launch counts too, as on a GPU: tenths of a millisecond, more on a loaded
    # machine (2.4 ms was seen once)
    assert 1.99 <= float(out["kernel_ms"]) <= 3.0
    assert out["oom"] == "CUDA_ERROR_OUT_OF_MEMORY"
