"""A study's results, rebuilt from whatever arm-seeds have finished: ``results.md`` (the table),
``results.json`` and ``success_vs_real.png`` in the study directory.

An arm-seed has finished when its run directory holds ``summary.json`` (``dreamgym train`` writes it last).
Its point is the final held-out real success (``success_final``: the last evaluation; for ``base`` the only
one), beside the random-valid-action agent on the same held-out tasks (``baseline_success``), against the
real transitions its training used (evaluation and the shared offline data are counted apart).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dreamgym.config import STUDY_ARMS
from dreamgym.study.arms import ARM_LABELS
from dreamgym.study.pattern import paper_pattern, pattern_lines, training_diagnostics
from dreamgym.study.stats import Interval, mean_interval

TABLE = "results.md"
JSON = "results.json"
PLOT = "success_vs_real.png"
#: Written by ``dreamgym study`` into each arm-seed directory: when it ran, how it ended, where its experience
#: model came from.
RUN_RECORD = "study_run.json"


@dataclass
class ArmSeed:
    """One arm-seed run directory as found on disk."""

    arm: str
    seed: int
    path: Path
    summary: dict[str, Any] | None
    config: dict[str, Any]
    record: dict[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.summary is not None

    def eval_set(self) -> dict[str, Any]:
        """The held-out task set of the run (every arm must share it)."""
        e = self.config.get("train", {}).get("eval", {})
        env = e.get("env") or self.config.get("env", {})
        return {"env": env.get("name"), "params": env.get("params"), "split": e.get("split"),
                "first_seed": e.get("first_seed"), "tasks": e.get("tasks"),
                "episodes_per_task": e.get("episodes_per_task")}

    def to_dict(self) -> dict[str, Any]:
        s = self.summary or {}
        t = self.config.get("train", {})
        return {"arm": self.arm, "seed": self.seed, "run_dir": str(self.path), "finished": self.finished,
                "success": s.get("success_final"), "random_valid_success": s.get("baseline_success"),
                "success_start": s.get("success_start"), "real_transitions": s.get("real_transitions"),
                "synthetic_transitions": s.get("synthetic_transitions"),
                "invalid_transitions": s.get("invalid_transitions"), "learner_steps": s.get("learner_steps"),
                "iterations": s.get("iterations"), "iterations_configured": t.get("iterations"),
                "real_budget": t.get("real_budget") if t.get("mode") == "s2r" else None,
                "offline_transitions": s.get("offline_transitions"), "wall_seconds": s.get("wall_seconds"),
                "eval": self.eval_set(), "status": self.record.get("status", "finished" if self.finished else "-"),
                "error": self.record.get("error"), "experience_model_from": self.record.get("experience_model_from"),
                **training_diagnostics(self.path)}


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, json.JSONDecodeError):
        return None  # a file being written right now: not finished yet


def scan(study_dir: Path) -> list[ArmSeed]:
    """Every arm-seed directory of the study (finished or not), arms in their run order, seeds ascending."""
    found: list[ArmSeed] = []
    for arm in STUDY_ARMS:
        arm_dir = study_dir / arm
        if not arm_dir.is_dir():
            continue
        seeds = []
        for d in arm_dir.glob("seed-*"):
            tail = d.name.removeprefix("seed-")
            if d.is_dir() and tail.isdigit():
                seeds.append((int(tail), d))
        for seed, d in sorted(seeds):
            cfg_path = d / "config.yaml"
            config = (yaml.safe_load(cfg_path.read_text()) or {}) if cfg_path.is_file() else {}
            found.append(ArmSeed(arm, seed, d, _read_json(d / "summary.json"), config,
                                 _read_json(d / RUN_RECORD) or {}))
    return found


def _mean(values: list[Any]) -> float | None:
    xs = [float(v) for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def aggregate(runs: list[ArmSeed]) -> dict[str, Any]:
    """Per arm: the mean and 95% t-interval of held-out success over finished seeds, and the means of the
    other figures; plus the checks that make the arms comparable (same learner steps, same held-out set)."""
    arms: dict[str, Any] = {}
    for arm in STUDY_ARMS:
        mine = [r for r in runs if r.arm == arm]
        if not mine:
            continue
        done = [r.to_dict() for r in mine if r.finished]
        arms[arm] = {
            "label": ARM_LABELS[arm],
            "seeds_finished": [d["seed"] for d in done],
            "seeds_unfinished": [r.seed for r in mine if not r.finished],
            "success": mean_interval([d["success"] for d in done if d["success"] is not None]).clipped().to_dict(),
            "random_valid_success": mean_interval([d["random_valid_success"] for d in done
                                                   if d["random_valid_success"] is not None]).clipped().to_dict(),
            **{k: _mean([d[k] for d in done]) for k in ("real_transitions", "synthetic_transitions",
                                                          "invalid_transitions", "learner_steps", "wall_seconds",
                                                          "offline_transitions", "mixed_group_share",
                                                          "synthetic_success", "reward_success_agreement")},
            "iterations_configured": sorted({d["iterations_configured"] for d in done
                                             if d["iterations_configured"] is not None}),
            "real_budget": sorted({d["real_budget"] for d in done if d["real_budget"] is not None}),
        }
    finished = [r for r in runs if r.finished]
    everything = [r.to_dict() for r in runs]
    trained = {tuple(a["iterations_configured"]) for name, a in arms.items() if name != "base" and
               a["iterations_configured"]}
    eval_sets = {json.dumps(r.eval_set(), sort_keys=True) for r in finished}
    checks = {
        "same_learner_step_budget": len(trained) <= 1,
        "learner_step_budget": sorted({x for t in trained for x in t}),
        "same_eval_set": len(eval_sets) <= 1,
        "eval_sets": [json.loads(x) for x in sorted(eval_sets)],
    }
    real = arms.get("real", {}).get("real_transitions")
    s2r = arms.get("dreamgym-s2r", {}).get("real_transitions")
    if real and s2r is not None:
        checks["s2r_real_share"] = s2r / real
    return {"arms": arms, "runs": everything, "checks": checks, "pattern": paper_pattern(arms),
            "random_valid_success": mean_interval([r.summary["baseline_success"] for r in finished
                                                   if r.summary and r.summary.get("baseline_success") is not None
                                                   ]).clipped().to_dict()}


def _fmt(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _synthetic(a: dict[str, Any]) -> str:
    if a.get("synthetic_success") is None:
        return "-"
    return f"{_share(a['synthetic_success'])} ({_share(a.get('reward_success_agreement'))})"


def table(result: dict[str, Any], name: str) -> str:
    """The Markdown table: one row per arm, success as mean [95% t-interval] over its finished seeds."""
    lines = [f"# Study {name}", "",
             "Held-out real success rate: mean over training seeds [95% t-interval, Student's t with n-1 degrees "
             "of freedom, cut to 0-100%]; n/a with a single seed. Real transitions are those training used (the "
             "offline data shared by every arm and the evaluation episodes are not counted).", "",
             "| arm | seeds | held-out success | random-valid success | real transitions | synthetic transitions "
             "| invalid synthetic | learner steps (configured) | groups with reward variance "
             "| synthetic success (reward/success agreement) | minutes |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, a in result["arms"].items():
        seeds = f"{len(a['seeds_finished'])}" + (f" (+{len(a['seeds_unfinished'])} unfinished)"
                                                  if a["seeds_unfinished"] else "")
        conf = "/".join(str(x) for x in a["iterations_configured"]) or "-"
        wall = a["wall_seconds"] / 60 if a["wall_seconds"] is not None else None
        lines.append(f"| {arm}: {a['label']} | {seeds} | {Interval(**a['success']).format()} | "
                     f"{Interval(**a['random_valid_success']).format()} | {_fmt(a['real_transitions'])} | "
                     f"{_fmt(a['synthetic_transitions'])} | {_fmt(a['invalid_transitions'])} | "
                     f"{_fmt(a['learner_steps'], 1)} ({conf}) | {_share(a.get('mixed_group_share'))} | "
                     f"{_synthetic(a)} | {_fmt(wall, 1)} |")
    c = result["checks"]
    lines += ["", "Checks:",
              f"- every trained arm had the same learner-step budget (train.iterations): "
              f"{'yes' if c['same_learner_step_budget'] else 'NO'} {c['learner_step_budget']} (a step with no "
              "reward variance in any group is skipped, so the steps taken can be fewer)",
              f"- every finished run was evaluated on the same held-out tasks: "
              f"{'yes' if c['same_eval_set'] else 'NO'} ({'; '.join(json.dumps(e) for e in c['eval_sets'])})"]
    if "s2r_real_share" in c:
        lines.append(f"- dreamgym-s2r used {c['s2r_real_share']:.1%} of the real arm's real transitions (the paper's "
                     "S2R: under 10%)")
    off = _mean([a["offline_transitions"] for a in result["arms"].values()])
    if off is not None:
        lines.append(f"- offline real transitions shared by every arm: {off:.0f}")
    lines += pattern_lines(result["pattern"])
    failed = [r for r in result["runs"] if not r["finished"]]
    if failed:
        lines += ["", "Unfinished arm-seeds:"]
        lines += [f"- {r['arm']} seed {r['seed']}: {r['status']}" + (f": {r['error']}" if r["error"] else "")
                  + f" ({r['run_dir']})" for r in failed]
    return "\n".join(lines) + "\n"


def _dodge(xs: list[float], width: float) -> list[float]:
    """Spread points that share an x (the synthetic arms all use 0 real transitions) side by side."""
    out = list(xs)
    groups: dict[float, list[int]] = {}
    for i, x in enumerate(xs):
        groups.setdefault(round(x, 6), []).append(i)
    for members in groups.values():
        for j, i in enumerate(members):
            out[i] = xs[i] + (j - (len(members) - 1) / 2) * width
    return out


def plot(result: dict[str, Any], out: Path, name: str) -> Path:
    """Left: held-out real success against real transitions used in training, one point per arm (mean, 95%
    interval as error bar) with its seeds faint behind it; arms at the same x are set side by side. Right: the same
    success per arm as bars. The random-valid agent is the dashed line in both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [(arm, a) for arm, a in result["arms"].items() if a["success"]["mean"] is not None]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11.0, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    colours = plt.get_cmap("tab10")
    span = max([a["real_transitions"] or 0.0 for _, a in arms] + [1.0])
    xs = _dodge([a["real_transitions"] or 0.0 for _, a in arms], 0.02 * span)
    for i, ((arm, a), x) in enumerate(zip(arms, xs, strict=True)):
        c, s = colours(i % 10), a["success"]
        seeds = [r["success"] for r in result["runs"] if r["arm"] == arm and r["finished"] and r["success"] is not None]
        ax.scatter([x] * len(seeds), seeds, color=c, alpha=0.3, s=14)
        yerr = None if s["low"] is None else [[s["mean"] - s["low"]], [s["high"] - s["mean"]]]
        ax.errorbar([x], [s["mean"]], yerr=yerr, fmt="o", color=c, capsize=4, label=f"{arm} (n={s['n']})")
        bx.bar(i, s["mean"], yerr=yerr, color=c, capsize=4, alpha=0.8)
    rv = result["random_valid_success"]
    for axis in (ax, bx):
        if rv["mean"] is not None:
            axis.axhline(rv["mean"], color="grey", ls="--", lw=1, label="random valid action" if axis is ax else None)
        axis.set_ylim(-0.05, 1.05)
        axis.grid(alpha=0.3)
    ax.set_xlim(-0.08 * span, 1.08 * span)
    ax.set_xlabel("real transitions used in training")
    ax.set_ylabel("held-out real success rate")
    ax.legend(fontsize=7, loc="best")
    bx.set_xticks(range(len(arms)), [arm for arm, _ in arms], rotation=30, ha="right", fontsize=8)
    fig.suptitle(f"Study {name}: held-out real success (mean over seeds, 95% t-interval)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def write_results(study_dir: Path, name: str, extra: dict[str, Any] | None = None) -> dict[str, Path]:
    """Rebuild ``results.md``, ``results.json`` and ``success_vs_real.png`` from the finished arm-seeds."""
    result = aggregate(scan(study_dir))
    if extra:
        result.update(extra)
    result["name"] = name
    paths = {"table": study_dir / TABLE, "json": study_dir / JSON, "plot": study_dir / PLOT}
    paths["table"].write_text(table(result, name))
    tmp = paths["json"].with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    tmp.replace(paths["json"])
    plot(result, paths["plot"], name)
    return paths
