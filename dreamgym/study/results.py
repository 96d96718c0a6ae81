"""A study's results, rebuilt from whatever arm-seeds have finished: ``results.md`` (the table),
``results.json`` and ``success_vs_real.png`` in the study directory.

An arm-seed has finished when its run directory holds ``summary.json`` (``dreamgym train`` writes it last).
Its point is the final held-out real success (``success_final``: the last evaluation; for ``base`` the only
one), beside the random-valid-action agent on the same held-out tasks (``baseline_success``). What each arm
consumed is counted apart: offline real transitions it learned from (expert / other; ``offline_used``), online
real transitions its training spent, evaluation transitions and synthetic transitions. The plot's x-axis is
offline + online real transitions.

Arms are compared *paired* on the final evaluation's episodes (``eval_episodes.jsonl``; ``dreamgym.study.paired``):
for each pair the paper's pattern names (``PAIRS``) the mean paired difference, its 95% paired-bootstrap interval
over tasks and training seeds, and McNemar's exact p; the pattern's claims are judged on those intervals, and a
power calculation from the measured spread says how many seeds x episodes resolve a 10-point difference.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dreamgym.config import STUDY_ARMS
from dreamgym.eval_records import final_records
from dreamgym.study.arms import ARM_LABELS
from dreamgym.study.paired import compare, power_table
from dreamgym.study.pattern import ABLATIONS, paper_pattern, pattern_lines, training_diagnostics
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
        ws = t.get("warm_start") or {}
        ws_steps = int(ws.get("steps", 0)) if ws.get("method") == "sft" else 0
        warm = ws_steps if "warm_start" in (s.get("phase_seconds") or {}) else 0
        # the arm-seed's folder inside the study (``arm/seed-N``): the report stays true when the study is moved
        return {"arm": self.arm, "seed": self.seed, "run_dir": f"{self.arm}/{self.path.name}",
                "finished": self.finished,
                "success": s.get("success_final"), "random_valid_success": s.get("baseline_success"),
                "success_start": s.get("success_start"), "real_transitions": s.get("real_transitions"),
                "synthetic_transitions": s.get("synthetic_transitions"),
                "invalid_transitions": s.get("invalid_transitions"),
                # learner steps: behaviour-cloning (warm-start) steps and GRPO steps alike, so ``bc`` (all of its
                # steps cloning) and the RL arms share one budget
                "learner_steps": None if s.get("learner_steps") is None else s["learner_steps"] + warm,
                "iterations": s.get("iterations"), "iterations_configured": (t.get("iterations") or 0) + ws_steps,
                "real_budget": t.get("real_budget") if t.get("mode") == "s2r" else None,
                "offline_transitions": s.get("offline_transitions"), "wall_seconds": s.get("wall_seconds"),
                **offline_used(self.config),
                "online_real_transitions": (None if s.get("real_transitions") is None
                                            else s["real_transitions"] + _gold_collected(self.path)),
                "eval_transitions": s.get("eval_transitions"),
                **{f"rules_{k}": (s.get("simulator_rules") or {}).get(k)
                   for k in ("settled_share", "would_settle_share", "first_reply_rule_agreement",
                             "first_reply_final_agreement")},
                "eval": self.eval_set(), "status": self.record.get("status", "finished" if self.finished else "-"),
                "error": self.record.get("error"), "experience_model_from": self.record.get("experience_model_from"),
                **training_diagnostics(self.path)}


#: The pairs the paper's pattern names, ``(a, b)``: the paired difference is ``a - b``.
PAIRS: tuple[tuple[str, str], ...] = (
    ("dreamgym", "real"), ("dreamgym-s2r", "real"), ("dreamgym-s2r", "dreamgym"), ("dreamgym", "copy-sim"),
    ("dreamgym", "bc"),
    *((a, "base") for a in STUDY_ARMS if a != "base"),
    *((a, "dreamgym") for a in ABLATIONS),
)


@functools.lru_cache(maxsize=16)
def _split(path: str, env: str | None, gold_limit: int | None, mtime: float) -> dict[str, int]:
    from dreamgym.data.expert import offline_split

    return offline_split(path, env, gold_limit)


def offline_used(config: dict[str, Any]) -> dict[str, int]:
    """Offline real transitions an arm-seed learned from, from its config: all of the offline file (expert and
    other) when it trains in synthesis (the SFT data, the retrieval store, the first states, the curriculum's tasks
    and the admissible lists come from it); the expert episodes it cloned when it warm-starts by behaviour cloning
    (``bc``); none otherwise (``base``, ``real``: they read none of it)."""
    t = config.get("train", {})
    path = t.get("offline_data")
    zero = {"offline_real_transitions": 0, "offline_expert_transitions": 0, "offline_other_transitions": 0}
    if not path or not Path(path).is_file():
        return zero
    env = config.get("env", {}).get("name")
    mode = t.get("mode")
    synthetic = mode == "synthetic" or (mode == "s2r" and (t.get("synthetic_iterations") or 0) > 0)
    ws = t.get("warm_start") or {}
    mtime = Path(path).stat().st_mtime
    if synthetic:
        sp = _split(str(path), env, None, mtime)
        return {"offline_real_transitions": sp["total"], "offline_expert_transitions": sp["expert"],
                "offline_other_transitions": sp["other"]}
    if ws.get("method") == "sft":
        sp = _split(str(path), env, ws.get("episodes"), mtime)
        return {**zero, "offline_real_transitions": sp["expert"], "offline_expert_transitions": sp["expert"]}
    return zero


def _gold_collected(run_dir: Path) -> int:
    """Real transitions a warm start collected itself (``<run>/gold.parquet``: the offline data had no gold)."""
    gold = run_dir / "gold.parquet"
    if not gold.is_file():
        return 0
    from dreamgym.data.transitions import open_transitions

    return int(open_transitions(gold).metadata.num_rows)


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


#: Per-arm figures averaged over its finished seeds.
MEANS = ("real_transitions", "synthetic_transitions", "invalid_transitions", "learner_steps", "wall_seconds",
         "offline_transitions", "mixed_group_share", "synthetic_success", "reward_success_agreement",
         "offline_real_transitions", "offline_expert_transitions", "offline_other_transitions",
         "online_real_transitions", "eval_transitions", "rules_settled_share", "rules_would_settle_share",
         "rules_first_reply_rule_agreement", "rules_first_reply_final_agreement")


def outcomes(runs: list[ArmSeed]) -> dict[str, dict[tuple[int, str, int], float]]:
    """Per arm, the final evaluation's episodes of its finished seeds: ``(seed, task_id, episode) -> success``."""
    out: dict[str, dict[tuple[int, str, int], float]] = {}
    for r in runs:
        if not r.finished:
            continue
        mine = out.setdefault(r.arm, {})
        for e in final_records(r.path):
            mine[(r.seed, e["task_id"], int(e["episode"]))] = float(bool(e["success"]))
    return {a: o for a, o in out.items() if o}


def paired_results(runs: list[ArmSeed], resamples: int = 2000) -> list[dict[str, Any]]:
    """``PAIRS`` whose two arms both have final episodes: ``{a, b, diff, ci95, p_mcnemar, n, ...}``
    (``dreamgym.study.paired.compare``), plus ``dreamgym`` against 0.95 x ``real`` for the paper's share claim."""
    got = outcomes(runs)
    out = []
    for a, b in PAIRS:
        if a in got and b in got:
            out.append({"a": a, "b": b, **compare(got[a], got[b], resamples=resamples)})
    if "dreamgym" in got and "real" in got:
        from dreamgym.study.pattern import DREAMGYM_SHARE

        out.append({"a": "dreamgym", "b": "real", **compare(got["dreamgym"], got["real"], scale=DREAMGYM_SHARE,
                                                              resamples=resamples)})
    return out


def power(paired: list[dict[str, Any]], delta: float = 0.10) -> dict[str, Any]:
    """The power calculation from the measured spread of one pair: ``dreamgym`` vs ``real`` when measured, else the
    pair with the largest per-episode spread, the most demanding one (``dreamgym.study.paired.power_table``)."""
    measured = [p for p in paired if p.get("spread") and p["scale"] == 1.0]
    if not measured:
        return {"delta": delta, "rows": [], "note": "no paired episodes measured"}
    pick = next((p for p in measured if (p["a"], p["b"]) == ("dreamgym", "real")),
                max(measured, key=lambda p: p["spread"]["sigma_episode2"] or 0.0))
    return {"pair": [pick["a"], pick["b"]], **power_table(pick["spread"], delta)}


def setting(runs: list[ArmSeed], arms: dict[str, Any], random_valid: dict[str, Any]) -> dict[str, Any]:
    """The study's setting: environment, its parameters, base and random-valid success, the iteration budget."""
    cfg = next((r.config for r in runs if r.config), {})
    env = cfg.get("env", {})
    iterations = [int(r.config.get("train", {}).get("iterations", 0)) for r in runs if r.config]
    return {"env": env.get("name"), "params": env.get("params"),
            "base_success": arms.get("base", {}).get("success", {}).get("mean"),
            "random_valid_success": random_valid.get("mean"),
            "iterations": max(iterations, default=None)}  # the trained arms' (``base`` and ``bc`` run none)


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
            **{k: _mean([d[k] for d in done]) for k in MEANS},
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
    paired = paired_results(runs)
    random_valid = mean_interval([r.summary["baseline_success"] for r in finished
                                  if r.summary and r.summary.get("baseline_success") is not None]).clipped().to_dict()
    return {"arms": arms, "runs": everything, "checks": checks, "pattern": paper_pattern(arms, paired),
            "paired": paired, "power": power(paired), "setting": setting(runs, arms, random_valid),
            "random_valid_success": random_valid}


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
             "of freedom, cut to 0-100%]; n/a with a single seed. Real transitions are counted by where they "
             "came from: offline (the data the arm learned from: expert / other episodes), online (spent by "
             "training) and evaluation (held-out episodes, policy and random baseline).", "",
             "| arm | seeds | held-out success | random-valid success | offline real (expert / other) "
             "| online real | eval | synthetic transitions | invalid synthetic | settled by rules (would) "
             "| first-reply rule / final agreement | learner steps (configured) | groups with reward variance "
             "| synthetic success (reward/success agreement) | minutes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, a in result["arms"].items():
        seeds = f"{len(a['seeds_finished'])}" + (f" (+{len(a['seeds_unfinished'])} unfinished)"
                                                  if a["seeds_unfinished"] else "")
        conf = "/".join(str(x) for x in a["iterations_configured"]) or "-"
        wall = a["wall_seconds"] / 60 if a["wall_seconds"] is not None else None
        offline = (f"{_fmt(a.get('offline_real_transitions'))} ({_fmt(a.get('offline_expert_transitions'))} / "
                   f"{_fmt(a.get('offline_other_transitions'))})")
        rules = f"{_share(a.get('rules_settled_share'))} ({_share(a.get('rules_would_settle_share'))})"
        first = (f"{_share(a.get('rules_first_reply_rule_agreement'))} / "
                 f"{_share(a.get('rules_first_reply_final_agreement'))}")
        lines.append(f"| {arm}: {a['label']} | {seeds} | {Interval(**a['success']).format()} | "
                     f"{Interval(**a['random_valid_success']).format()} | {offline} | "
                     f"{_fmt(a.get('online_real_transitions'))} | {_fmt(a.get('eval_transitions'))} | "
                     f"{_fmt(a['synthetic_transitions'])} | {_fmt(a['invalid_transitions'])} | {rules} | {first} | "
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
    lines += paired_lines(result.get("paired", []), result.get("power", {}))
    lines += pattern_lines(result["pattern"])
    failed = [r for r in result["runs"] if not r["finished"]]
    if failed:
        lines += ["", "Unfinished arm-seeds:"]
        # "running" is what the study wrote when it started the arm-seed; a stopped study cannot have updated it
        lines += [f"- {r['arm']} seed {r['seed']}: "
                  + ("started, not finished (still running, or stopped: --resume continues it)"
                     if r["status"] == "running" else r["status"])
                  + (f": {r['error']}" if r["error"] else "") + f" ({r['run_dir']})" for r in failed]
    return "\n".join(lines) + "\n"


def paired_lines(paired: list[dict[str, Any]], pw: dict[str, Any]) -> list[str]:
    """The Markdown sections of the paired differences and the power calculation."""
    lines = ["", "Paired differences of final held-out success (a - b, percentage points; pairs share the training "
                 "seed, the held-out task and its episode index; 95% interval: two-way paired bootstrap over tasks "
                 "and training seeds, 2000 resamples; McNemar: exact, two-sided):", "",
             "| a | b | diff | 95% interval | McNemar p | pairs (a won / b won) | seeds | tasks |",
             "|---|---|---|---|---|---|---|---|"]
    for p in paired:
        b = p["b"] if p["scale"] == 1.0 else f"{p['scale']:g} x {p['b']}"
        if p["diff"] is None:
            lines.append(f"| {p['a']} | {b} | - | - | - | 0 | - | - |")
            continue
        lo, hi = p["ci95"]
        lines.append(f"| {p['a']} | {b} | {100 * p['diff']:+.1f} | [{100 * lo:+.1f}, {100 * hi:+.1f}] | "
                     f"{p['p_mcnemar']:.3g} | {p['n']} ({p['n10']} / {p['n01']}) | {len(p['seeds'])} | {p['tasks']} |")
    if not paired:
        lines.append("| - | - | - | - | - | no arm pair with per-episode records | - | - |")
    if pw.get("rows"):
        sd = pw["sigma_seed2"]
        lines += ["", f"Power ({pw['pair'][0]} - {pw['pair'][1]}; two-sided 0.05, power 0.8): per-episode variance "
                      f"{pw['sigma_episode2']:.3f}, between-seed variance "
                      f"{'-' if sd is None else f'{sd:.4f}'} ({pw['note']}). The measured design "
                      f"({pw['measured_seeds']} seed(s) x {pw['measured_episodes_per_seed']} episodes) resolves a "
                      f"paired difference of {100 * pw['resolvable_now']:.1f} points; a "
                      f"{100 * pw['delta']:.0f}-point difference needs:"]
        lines += [f"- {r['episodes_per_seed']} episodes per seed: {r['seeds_needed']} seed(s)" for r in pw["rows"]]
    elif pw:
        lines += ["", f"Power: {pw.get('note', 'not computed')}."]
    return lines


def json_view(result: dict[str, Any]) -> dict[str, Any]:
    """``results.json``: the aggregate with ``arms`` as a list, each with ``arm``, ``success`` (mean, 0-1),
    ``success_interval`` (the t-interval over seeds), ``seeds`` and what it consumed."""
    arms = []
    for name, a in result["arms"].items():
        arms.append({"arm": name, **a, "success": a["success"]["mean"], "success_interval": a["success"],
                     "seeds": a["seeds_finished"]})
    return {**result, "arms": arms}


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
    """Left: held-out real success against real transitions learned from (offline + online), one point per arm
    (mean, 95% interval as error bar) with its seeds faint behind it; arms at the same x are set side by side. Right:
    the same success per arm as bars. The random-valid agent is the dashed line in both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [(arm, a) for arm, a in result["arms"].items() if a["success"]["mean"] is not None]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11.0, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    colours = plt.get_cmap("tab10")
    real = [(a.get("offline_real_transitions") or 0.0) + (a.get("online_real_transitions") or 0.0) for _, a in arms]
    span = max([*real, 1.0])
    xs = _dodge(real, 0.02 * span)
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
    ax.set_xlabel("real transitions learned from (offline + online)")
    ax.set_ylabel("held-out real success rate")
    if ax.get_legend_handles_labels()[0]:  # a study with no finished arm-seed has nothing to label yet
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
    tmp.write_text(json.dumps(json_view(result), indent=1, default=str))
    tmp.replace(paths["json"])
    plot(result, paths["plot"], name)
    return paths
