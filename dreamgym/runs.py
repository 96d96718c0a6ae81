"""Run directories: every command that does work writes one.

Layout: ``<run.out_dir>/<run.name>-<command>-<YYYYmmdd-HHMMSS>/`` with ``config.yaml`` (the resolved
config), ``metrics.jsonl`` (one JSON object per line) and whatever the command produces
(data files, ``checkpoints/``, the report).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from dreamgym.config import DreamGymConfig, save_config


def create_run_dir(cfg: DreamGymConfig, command: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(cfg.run.out_dir) / f"{cfg.run.name}-{command}-{stamp}"
    run_dir, n = base, 1
    while run_dir.exists():
        n += 1
        run_dir = base.with_name(f"{base.name}-{n}")
    run_dir.mkdir(parents=True)
    save_config(cfg, run_dir / "config.yaml")
    return run_dir


class MetricsLog:
    """Append-only ``metrics.jsonl``; each record gets a wall-clock ``time``."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"

    def write(self, **record: Any) -> None:
        record.setdefault("time", time.time())
        with self.path.open("a") as f:
            f.write(json.dumps(record, default=str) + "\n")

    def read(self) -> list[dict[str, Any]]:
        """Every record; a last line cut short (the process died mid-write) is left out."""
        if not self.path.exists():
            return []
        lines = [line for line in self.path.read_text().splitlines() if line.strip()]
        records = [json.loads(line) for line in lines[:-1]]
        if lines:
            with contextlib.suppress(ValueError):
                records.append(json.loads(lines[-1]))
        return records
