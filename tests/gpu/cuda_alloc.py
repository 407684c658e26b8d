"""GPU work with nothing but the driver: allocate and touch device memory through libcuda.

    python3 cuda_alloc.py TARGET_MIB [STEP_MIB] [HOLD_S]

Allocates TARGET_MIB in steps of STEP_MIB (default 256) on the first visible device
through the CUDA driver API (``libcuda.so.1``, which the driver ships), fills each block,
prints one JSON line ``{"allocated_mib", "target_mib", "error"}`` and keeps the memory
HOLD_S seconds (default 0) so that nvidia-smi can see it.  ``error`` is the driver's
error name of the first refused step (``CUDA_ERROR_OUT_OF_MEMORY`` past an MPS cap),
else null.  Exit status 1 when the driver or a context cannot be had.  Standard
library only: it runs inside the check's containers with the host's python3.
"""

from __future__ import annotations

import ctypes
import json
import sys
import time


def error_name(cuda: ctypes.CDLL, code: int) -> str:
    name = ctypes.c_char_p()
    if cuda.cuGetErrorName(code, ctypes.byref(name)) != 0 or not name.value:
        return f"CUDA error {code}"
    return name.value.decode()


def allocate(cuda: ctypes.CDLL, target: int, step: int) -> tuple[int, str | None]:
    allocated = 0
    while allocated < target:
        size = min(step, target - allocated) << 20
        pointer = ctypes.c_uint64()
        code = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size))
        if code == 0:
            code = cuda.cuMemsetD8_v2(pointer, ctypes.c_ubyte(0x5A), ctypes.c_size_t(size))
        if code != 0:
            return allocated, error_name(cuda, code)
        allocated += size >> 20
    code = cuda.cuCtxSynchronize()
    return allocated, (error_name(cuda, code) if code else None)


def main(argv: list[str]) -> int:
    target = int(argv[1])
    step = int(argv[2]) if len(argv) > 2 else 256
    hold = float(argv[3]) if len(argv) > 3 else 0.0
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        print(json.dumps({"allocated_mib": 0, "target_mib": target, "error": str(err)}), flush=True)
        return 1
    device, context = ctypes.c_int(), ctypes.c_void_p()
    for call in (lambda: cuda.cuInit(0), lambda: cuda.cuDeviceGet(ctypes.byref(device), 0),
                 lambda: cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device)):
        code = call()
        if code != 0:
            print(json.dumps({"allocated_mib": 0, "target_mib": target,
                              "error": error_name(cuda, code)}), flush=True)
            return 1
    allocated, error = allocate(cuda, target, step)
    print(json.dumps({"allocated_mib": allocated, "target_mib": target, "error": error}), flush=True)
    time.sleep(hold)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
