"""What the user watches during ``dreamgym train``: a live progress display and the metric sinks.

``Progress`` prints one status line per phase (iteration, phase, rollouts/s, reward, success, invalid
replies, real transitions used), so it reads the same in a terminal, a log file and ``ray job logs``.

``MetricSinks`` sends every numeric metric to TensorBoard (``<run>/tensorboard``) and, only when they are
installed *and* configured by their usual environment variables, to Weights & Biases (``WANDB_PROJECT``)
and MLflow (``MLFLOW_TRACKING_URI``). ``metrics.jsonl`` (``dreamgym.runs.MetricsLog``) is always written.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

from dreamgym.secrets import export_wandb_key, scrub


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a nested dict as ``a/b/c -> float`` (bools as 0/1; lists and strings skipped)."""
    out: dict[str, float] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "/"))
        elif isinstance(v, (bool, int | float)):
            out[key] = float(v)
    return out


class Progress:
    """One line per phase on stderr: ``[mm:ss] it 2/5 synthetic | 16 ep 0.4 ep/s | reward 0.50 ...``."""

    def __init__(self, enabled: bool, iterations: int, started: float | None = None) -> None:
        self.enabled = enabled
        self.iterations = iterations
        self.t0 = started or time.time()

    def line(self, iteration: int | str, phase: str, text: str) -> None:
        if not self.enabled:
            return
        el = int(time.time() - self.t0)
        it = iteration if isinstance(iteration, str) else f"it {iteration}/{self.iterations}"
        print(f"[{el // 60:02d}:{el % 60:02d}] {it:<9} {phase:<10} | {text}", file=sys.stderr, flush=True)

    def rollouts(self, iteration: int, phase: str, s: dict[str, Any], real_used: int, budget: int | None) -> None:
        budget_s = f"/{budget}" if budget else ""
        self.line(iteration, phase,
                  f"{int(s['episodes'])} ep {s['episodes_per_s']:.2f} ep/s {s['steps_per_s']:.1f} steps/s | "
                  f"reward {s['mean_reward']:.2f} success {s['success_rate']:.0%} | unparsable "
                  f"{s['unparsable_rate']:.0%} invalid-act {s['invalid_action_rate']:.0%} invalid-trans "
                  f"{s['invalid_transition_rate']:.0%} | real used {real_used}{budget_s}")


class MetricSinks:
    """TensorBoard always (when enabled); W&B and MLflow only when installed and configured."""

    def __init__(self, run_dir: Path, tensorboard: bool, config: dict[str, Any], resume: bool = False) -> None:
        self.tb: Any = None
        self.wandb: Any = None
        self.mlflow: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
        config = scrub(config)  # callers pass a dump, which hides keys already; never send one anyway
        if os.environ.get("WANDB_PROJECT") and importlib.util.find_spec("wandb"):
            import wandb

            export_wandb_key()  # W&B reads WANDB_API_KEY; it may be in the secrets file instead

            self.wandb = wandb.init(project=os.environ["WANDB_PROJECT"], name=Path(run_dir).name, config=config,
                                    id=Path(run_dir).name, resume="allow" if resume else None)
        if os.environ.get("MLFLOW_TRACKING_URI") and importlib.util.find_spec("mlflow"):
            import mlflow

            mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", "dreamgym"))
            self.mlflow = mlflow
            mlflow.start_run(run_name=Path(run_dir).name)

    def log(self, step: int, metrics: dict[str, Any], prefix: str = "") -> None:
        flat = flatten(metrics, prefix)
        if self.tb is not None:
            for k, v in flat.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(flat, step=step)
        if self.mlflow is not None:
            self.mlflow.log_metrics({k.replace("/", ".")[:250]: v for k, v in flat.items()}, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
        if self.mlflow is not None:
            self.mlflow.end_run()
