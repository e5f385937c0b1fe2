"""The machine a figure was measured on: the CPU's model name and the ISA extensions that change
the kernels' speed (AVX-512 VNNI, AMX, ...), printed beside every table so that figures from
different machines are never mixed."""

from __future__ import annotations

import os
import platform
import threading
import time
from pathlib import Path

import numpy as np

# x86 and Arm feature names (as /proc/cpuinfo spells them) that decide which instructions run
SPEED_FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16",
                  "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16", "asimd", "asimddp", "i8mm", "sve", "sve2",
                  "bf16")


def cpu_description() -> str:
    """`CPU: <model name>, <n> cores, <features>` from /proc/cpuinfo where there is one."""
    model, features = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if key in ("model name", "cpu model") and value.strip():
                model = value.strip()
            elif key in ("flags", "features"):
                features.update(value.split())
    except OSError:
        pass
    listed = [name for name in SPEED_FEATURES if name in features]
    return f"CPU: {model}, {os.cpu_count()} cores, {' '.join(listed) or 'no listed ISA extensions'}"


def read_bandwidth_gbs(threads: int, megabytes: int = 512, repeats: int = 5) -> float:
    """Best GB/s of summing a large float32 array split over `threads` threads (numpy frees the GIL)."""
    data = np.ones(megabytes * (1 << 20) // 4, dtype=np.float32)
    parts = np.array_split(data, threads)
    best = 0.0
    for _ in range(repeats):
        workers = [threading.Thread(target=part.sum) for part in parts]
        start = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        best = max(best, data.nbytes / (time.perf_counter() - start) / 1e9)
    return best


if __name__ == "__main__":
    print(cpu_description())
