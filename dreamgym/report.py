"""The run report of ``dreamgym train``: ``report.md`` with PNG plots, from ``metrics.jsonl`` and ``summary.json``.

Plots (``<run>/plots/``):

- ``training_reward.png``: mean episode reward and success rate of the training rollouts per iteration,
  coloured by phase (synthetic rewards are the experience model's, real ones the environment's);
- ``eval_success.png``: held-out real success rate against the real transitions spent on training (the
  paper's x-axis), beside the random-valid-action baseline on the same tasks;
- ``curriculum.png``: task pool size, generated tasks, groups with reward variance and mean ``V_tau``;
- ``throughput.png``: episodes/s and steps/s of the rollouts per phase, and wall time per phase.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dreamgym.runs import MetricsLog
from dreamgym.verdict import learning_verdict

PHASE_COLOURS = {"synthetic": "tab:purple", "real": "tab:green", "eval": "tab:blue"}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _integer_x(*axes: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _training_plot(iters: list[dict[str, Any]], out: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for phase in ("synthetic", "real"):
        pts = [(r["iteration"], r["rollout"]) for r in iters if r["phase"] == phase]
        if pts:
            xs = [p[0] for p in pts]
            ax.plot(xs, [p[1]["mean_reward"] for p in pts], "o-", color=PHASE_COLOURS[phase],
                    label=f"mean reward ({phase})")
            ax.plot(xs, [p[1]["success_rate"] for p in pts], "s--", color=PHASE_COLOURS[phase], alpha=0.6,
                    label=f"success rate ({phase})")
    ax.set_xlabel("iteration")
    ax.set_ylabel("training rollouts")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Training reward per iteration")
    _integer_x(ax)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _eval_plot(evals: list[dict[str, Any]], out: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    xs = [e["real_transitions"] for e in evals]
    ax.plot(xs, [e["success_rate"] for e in evals], "o-", color="tab:blue", label="policy")
    for e in evals:
        ax.annotate(e["label"], (e["real_transitions"], e["success_rate"]), fontsize=7, xytext=(3, 4),
                    textcoords="offset points")
    ax.plot(xs, [e["baseline_success_rate"] for e in evals], "--", color="gray", label="random valid action")
    ax.set_xlabel("real transitions used for training")
    ax.set_ylabel("held-out real success rate")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Real-environment success vs real transitions")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _curriculum_plot(iters: list[dict[str, Any]], out: Path) -> None:
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8.8, 3.4))
    xs = [r["iteration"] for r in iters]
    cur = [r.get("curriculum", {}) for r in iters]
    a1.plot(xs, [c.get("pool_size", 0) for c in cur], "o-", label="pool size")
    a1.plot(xs, [c.get("pool_generated", 0) for c in cur], "s-", label="generated tasks")
    a1.plot(xs, [r["groups"]["mixed_groups"] for r in iters], "^-", label="groups with reward variance")
    a1.plot(xs, [r["groups"]["groups"] for r in iters], "v:", label="groups")
    a1.set_xlabel("iteration")
    a1.legend(fontsize=7)
    a1.grid(alpha=0.3)
    a2.plot(xs, [c.get("group_mean_variance", 0) for c in cur], "o-", color="tab:red", label="mean V_tau of groups")
    a2.plot(xs, [c.get("pool_mean_variance", 0) for c in cur], "s--", color="tab:orange", label="mean V_tau of pool")
    a2.set_xlabel("iteration")
    a2.set_ylim(bottom=0)
    a2.legend(fontsize=7)
    a2.grid(alpha=0.3)
    fig.suptitle("Curriculum")
    _integer_x(a1, a2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _throughput_plot(summary: dict[str, Any], iters: list[dict[str, Any]], out: Path) -> None:
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8.8, 3.4))
    phases = [p for p in ("synthetic", "real") if any(r["phase"] == p for r in iters)]
    eps = [sum(r["rollout"]["episodes"] for r in iters if r["phase"] == p)
           / max(sum(r["rollout_seconds"] for r in iters if r["phase"] == p), 1e-9) for p in phases]
    steps = [sum(r["rollout"]["steps"] for r in iters if r["phase"] == p)
             / max(sum(r["rollout_seconds"] for r in iters if r["phase"] == p), 1e-9) for p in phases]
    x = range(len(phases))
    a1.bar([i - 0.2 for i in x], eps, width=0.4, label="episodes/s")
    a1.bar([i + 0.2 for i in x], steps, width=0.4, label="steps/s")
    a1.set_xticks(list(x), phases)
    a1.set_title("rollout throughput", fontsize=9)
    a1.legend(fontsize=7)
    ps = summary.get("phase_seconds", {})
    names = sorted(ps, key=lambda k: -ps[k])
    a2.barh(names, [ps[n] for n in names], color=[PHASE_COLOURS.get(n, "tab:gray") for n in names])
    a2.set_xlabel("seconds")
    a2.set_title("wall time per phase", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _invalid_reasons(iters: list[dict[str, Any]]) -> list[str]:
    """Why synthetic replies were refused (malformed, or breaking the family's reward rule), summed over the
    run, with the share of valid synthetic episodes whose reward agrees with their success."""
    reasons: dict[str, int] = {}
    agree = episodes = 0
    for r in iters:
        if r.get("phase") != "synthetic":
            continue
        s = r["rollout"]
        for k, v in s.items():
            if k.startswith("em_reason:"):
                reasons[k.removeprefix("em_reason:")] = reasons.get(k.removeprefix("em_reason:"), 0) + int(v)
        agree += int(s.get("outcome_agreements", 0))
        episodes += int(s["episodes"]) - int(s.get("invalid_episodes", 0))
    rate = agree / episodes if episodes else None
    out = [f"- synthetic episodes whose reward agrees with their success: {_pct(rate)} of {episodes} valid episodes"]
    if reasons:
        top = ", ".join(f"`{k}` {v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])[:8])
        out.append(f"- refused experience-model replies by reason (every attempt): {top}")
    return [*out, ""]


def write_report(run_dir: str | Path) -> Path:
    """Write ``report.md`` and ``plots/*.png`` for a finished (or interrupted) run; returns the report path."""
    run_dir = Path(run_dir)
    records = MetricsLog(run_dir).read()
    summary_path = run_dir / "summary.json"
    summary: dict[str, Any] = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    iters = [r for r in records if r.get("event") == "iteration"]
    evals = summary.get("evals") or [r for r in records if r.get("event") == "eval"]
    plots = run_dir / "plots"
    plots.mkdir(exist_ok=True)
    made = []
    if iters:
        _training_plot(iters, plots / "training_reward.png")
        _curriculum_plot(iters, plots / "curriculum.png")
        _throughput_plot(summary, iters, plots / "throughput.png")
        made += ["training_reward", "curriculum", "throughput"]
    if evals:
        _eval_plot(evals, plots / "eval_success.png")
        made.append("eval_success")
    lines = [f"# DreamGym run report: `{run_dir.name}`", ""]
    if summary:
        lines += learning_verdict(summary).markdown()
        lines += [
            "## The run",
            "",
            f"- mode **{summary.get('mode')}**, {summary.get('iterations')} iterations "
            f"({summary.get('learner_steps')} learner steps), wall time {summary.get('wall_seconds', 0) / 60:.1f} min",
            f"- real transitions: {summary.get('real_transitions')} for training, {summary.get('eval_transitions')} "
            f"for evaluation, {summary.get('offline_transitions')} offline (collected before training)",
            f"- synthetic transitions: {summary.get('synthetic_transitions')} "
            f"({summary.get('invalid_transitions')} invalid, left out of training)",
            f"- held-out real success: **{_pct(summary.get('success_start'))} -> {_pct(summary.get('success_final'))}**"
            f" (random valid action on the same tasks: {_pct(summary.get('baseline_success'))})",
            "",
        ]
        if any(r.get("phase") == "synthetic" for r in iters):
            lines += _invalid_reasons(iters)
    if evals:
        lines += ["## Evaluations (held-out real tasks)", "",
                  "| when | iteration | real transitions used | success | mean reward | random-valid success "
                  "| random-valid reward | unparsable replies | invalid actions |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for e in evals:
            lines.append(f"| {e['label']} | {e['iteration']} | {e['real_transitions']} | {_pct(e['success_rate'])} | "
                         f"{e['mean_reward']:.2f} | {_pct(e['baseline_success_rate'])} | "
                         f"{e['baseline_mean_reward']:.2f} | {_pct(e.get('unparsable_rate'))} | "
                         f"{_pct(e.get('invalid_action_rate'))} |")
        lines.append("")
    if iters:
        lines += ["## Iterations", "", "| it | phase | episodes | reward | success | reward agrees with success "
                  "| unparsable | invalid actions | invalid transitions | groups (mixed) | loss | weights |",
                  "|---" * 12 + "|"]
        for r in iters:
            s, lm = r["rollout"], r["learner"]
            lines.append(f"| {r['iteration']} | {r['phase']} | {int(s['episodes'])} | {s['mean_reward']:.2f} | "
                         f"{_pct(s['success_rate'])} | {_pct(s.get('outcome_agreement_rate'))} | "
                         f"{_pct(s['unparsable_rate'])} | "
                         f"{_pct(s['invalid_action_rate'])} | "
                         f"{_pct(s['invalid_transition_rate'])} | {int(r['groups']['groups'])} "
                         f"({int(r['groups']['mixed_groups'])}) | "
                         f"{'skipped' if lm.get('skipped') else format(lm.get('loss', 0.0), '.4f')} | "
                         f"v{int(lm.get('version', 0))} |")
        lines.append("")
    ppo = [r for r in iters if "value_loss" in r.get("learner", {})]
    if ppo:
        lines += ["## Critic (PPO)", "", "| it | value loss | explained variance | advantage mean | advantage std "
                  "| critic share of the step |", "|---" * 6 + "|"]
        for r in ppo:
            lm = r["learner"]
            lines.append(f"| {r['iteration']} | {lm['value_loss']:.4f} | {lm.get('explained_variance', 0.0):.3f} | "
                         f"{lm.get('adv_mean', 0.0):.3f} | {lm.get('adv_std', 0.0):.3f} | "
                         f"{_pct(lm.get('critic_share'))} |")
        lines.append("")
    if summary.get("phase_seconds"):
        lines += ["## Time per phase", "", "| phase | seconds |", "|---|---|"]
        lines += [f"| {k} | {v:.0f} |" for k, v in sorted(summary["phase_seconds"].items(), key=lambda kv: -kv[1])]
        lines.append("")
    titles = {"training_reward": "Training reward", "eval_success": "Real success vs real transitions",
              "curriculum": "Curriculum", "throughput": "Throughput per phase"}
    for name in made:
        lines += [f"## {titles[name]}", "", f"![{titles[name]}](plots/{name}.png)", ""]
    out = run_dir / "report.md"
    out.write_text("\n".join(lines))
    return out
