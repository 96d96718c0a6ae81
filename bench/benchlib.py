"""What the benchmark scripts share: the machine a result was measured on, the load average, and how the JSON is
printed and written (``bench/results/``)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import socket
from pathlib import Path
from typing import Any

from dreamgym.hardware import cpu_flags

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    """The CPU model, its core count and the instruction sets that decide CPU speed here (bf16 is emulated, 5-15x
    slower than fp32, without AVX512-BF16 / AMX)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    flags = cpu_flags()
    return {"cpu": model or platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "avx2": "avx2" in flags, "avx512f": "avx512f" in flags, "avx512_bf16": "avx512_bf16" in flags,
            "python": platform.python_version()}


def load_average() -> list[float]:
    """The 1-, 5- and 15-minute load averages, rounded: a figure measured under load says so."""
    return [round(x, 2) for x in os.getloadavg()]


def emit(result: dict[str, Any], out: str | Path | None = None, indent: int = 1) -> Path | None:
    """Print ``result`` as JSON, and write it to ``out`` too when one is given."""
    text = json.dumps(result, indent=indent)
    print(text)
    if not out:
        return None
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text + "\n")
    return target


def write_result(result: dict[str, Any], name: str, out: str | Path | None = None) -> Path:
    """``emit`` to ``out``, by default ``bench/results/<name>-<host>-<date>.json``."""
    target = emit(result, out or RESULTS / f"{name}-{socket.gethostname()}-{datetime.date.today().isoformat()}.json")
    assert target is not None
    return target
