"""The paper's pattern, checked on a study's arms, and what the training records say where it does not hold.

The DreamGym paper's Table 1 pattern: DreamGym (synthetic only) reaches at least 0.95 x the held-out success of
GRPO in the real environment; DreamGym-S2R (synthetic, then a small real budget) goes above both; each ablation
(no retrieval, no reasoning, no task generation, no rules) stays below DreamGym. Two more claims say whether the
experience model earns its place: DreamGym above the copy-top-1 simulator (``copy-sim``) and above behaviour
cloning on the same offline expert data (``bc``). Each claim is checked on the *paired* difference of the two arms'
held-out episodes (``dreamgym.study.paired``: same tasks, same training seeds) and marked *resolved* only when its
95% paired-bootstrap interval excludes 0 (for the share claim: the interval of DreamGym - 0.95 x real). A study
without per-episode records (older runs) falls back to the arms' means and their t-intervals over seeds
(resolved: the intervals do not overlap).

Where a claim does not hold, the diagnosis names the part of the loop that can explain it, from the runs' own
records (``metrics.jsonl``): learner steps taken against the budget (a step whose groups have no reward
variance is skipped), the share of GRPO groups with reward variance (the only groups with a gradient), and for
synthetic training the simulator: its invalid-transition rate, the agreement of synthetic episodes' reward with
their success, and the synthetic success rate beside the held-out real one (a simulator far easier or harder
than the game trains a policy for another game).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dreamgym.runs import MetricsLog

#: Ablation arms: each should stay below ``dreamgym``.
ABLATIONS = ("no-retrieval", "no-reasoning", "no-task-generation", "no-rules")

#: DreamGym's share of real-environment GRPO's success the paper's pattern asks for.
DREAMGYM_SHARE = 0.95


def training_diagnostics(run_dir: Path) -> dict[str, Any]:
    """What a run's training iterations recorded (``iteration`` records of ``metrics.jsonl``): GRPO groups and
    those with reward variance, and over synthetic iterations the mean synthetic success rate and the mean
    agreement of reward with success."""
    groups = mixed = 0.0
    synthetic_success: list[float] = []
    agreement: list[float] = []
    for r in MetricsLog(run_dir).read():
        if r.get("event") != "iteration":
            continue
        g = r.get("groups") or {}
        groups += float(g.get("groups", 0))
        mixed += float(g.get("mixed_groups", 0))
        ro = r.get("rollout") or {}
        if r.get("phase") == "synthetic":
            if ro.get("success_rate") is not None:
                synthetic_success.append(float(ro["success_rate"]))
            if ro.get("outcome_agreement_rate") is not None:
                agreement.append(float(ro["outcome_agreement_rate"]))
    return {
        "groups": groups,
        "mixed_groups": mixed,
        "mixed_group_share": mixed / groups if groups else None,
        "synthetic_success": sum(synthetic_success) / len(synthetic_success) if synthetic_success else None,
        "reward_success_agreement": sum(agreement) / len(agreement) if agreement else None,
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _overlap(a: dict[str, Any], b: dict[str, Any]) -> bool | None:
    """Whether two 95% intervals overlap; ``None`` when either has none (a single seed)."""
    if a["low"] is None or b["low"] is None:
        return None
    return not (a["high"] < b["low"] or b["high"] < a["low"])


def _diagnosis(arm: str, a: dict[str, Any]) -> str:
    """One line on the parts of ``arm``'s training that can explain its success."""
    parts = [f"learner steps {a['learner_steps']:.1f} of {'/'.join(map(str, a['iterations_configured'])) or '-'}"
             if a.get("learner_steps") is not None else "learner steps -"]
    parts.append(f"groups with reward variance {_pct(a.get('mixed_group_share'))}")
    if a.get("synthetic_transitions"):
        inv = a["invalid_transitions"] / a["synthetic_transitions"]
        parts.append(f"invalid synthetic transitions {_pct(inv)}")
        parts.append(f"reward/success agreement {_pct(a.get('reward_success_agreement'))}")
        parts.append(f"synthetic success {_pct(a.get('synthetic_success'))} vs held-out real "
                     f"{_pct(a['success']['mean'])}")
    return f"{arm}: " + "; ".join(parts)


def _claim(arms: dict[str, Any], paired: list[dict[str, Any]], text: str, left: str, right: str, *,
           sign: int = 1, scale: float = 1.0) -> dict[str, Any]:
    """``left`` above ``scale`` x ``right`` (``sign`` 1; at least, for a share below 1) or below it (``sign`` -1)."""
    a, b = arms.get(left), arms.get(right)
    if a is None or b is None or a["success"]["mean"] is None or b["success"]["mean"] is None:
        return {"claim": text, "left": left, "right": right, "holds": None, "resolved": None,
                "detail": "not measured (an arm has no finished seed)", "diagnosis": []}
    la, rb = a["success"]["mean"], b["success"]["mean"]
    pair = next((p for p in paired if (p["a"], p["b"]) == (left, right) and p["scale"] == scale
                 and p.get("diff") is not None), None)
    detail = f"{left} {_pct(la)} vs {right} {_pct(rb)}"
    if pair is not None:
        d, (lo, hi) = pair["diff"], pair["ci95"]
        ok = sign * d >= 0 if scale != 1.0 else sign * d > 0
        resolved: bool | None = lo > 0 or hi < 0
        what = f"{left} - {scale:g} x {right}" if scale != 1.0 else f"{left} - {right}"
        detail += (f"; paired {what} {100 * d:+.1f} points [{100 * lo:+.1f}, {100 * hi:+.1f}] over {pair['n']} "
                   f"episode pairs, McNemar p {pair['p_mcnemar']:.3g}"
                   + ("" if resolved else " (the paired interval includes 0: not resolved)"))
    else:
        gap = la - scale * rb
        ok = sign * gap >= 0 if scale != 1.0 else sign * gap > 0
        overlap = _overlap(a["success"], b["success"])
        resolved = None if overlap is None else not overlap
        if overlap is None:
            detail += " (one seed and no episode records: no interval)"
        elif overlap:
            detail += " (no episode records; 95% t-intervals overlap: the seeds do not separate them)"
    diagnosis = [] if ok else [_diagnosis(x, arms[x]) for x in (left, right) if x not in ("base", "bc")]
    return {"claim": text, "left": left, "right": right, "left_success": la, "right_success": rb, "holds": bool(ok),
            "resolved": resolved, "detail": detail, "diagnosis": diagnosis,
            "paired": None if pair is None else {k: pair[k] for k in ("diff", "ci95", "p_mcnemar", "n")}}


def paper_pattern(arms: dict[str, Any], paired: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Each claim of the paper's pattern on the aggregated arms (``results.aggregate()['arms']``) and their paired
    comparisons (``results.paired_results``; none: the fallback on means and t-intervals)."""
    p = paired or []
    claims = [
        _claim(arms, p, f"DreamGym >= {DREAMGYM_SHARE} x real-environment GRPO", "dreamgym", "real",
               scale=DREAMGYM_SHARE),
        _claim(arms, p, "DreamGym-S2R above real-environment GRPO", "dreamgym-s2r", "real"),
        _claim(arms, p, "DreamGym-S2R above DreamGym", "dreamgym-s2r", "dreamgym"),
        _claim(arms, p, "DreamGym above the copy-top-1 simulator (the model earns its place)", "dreamgym", "copy-sim"),
        _claim(arms, p, "DreamGym above behaviour cloning on the offline expert episodes", "dreamgym", "bc"),
    ]
    claims += [_claim(arms, p, f"{x} below DreamGym", x, "dreamgym", sign=-1) for x in ABLATIONS]
    claims += [_claim(arms, p, f"{x} above the base policy", x, "base")
               for x in ("real", "dreamgym", "dreamgym-s2r", "copy-sim", "bc")]
    return claims


def pattern_lines(claims: list[dict[str, Any]]) -> list[str]:
    """The Markdown section of the results table."""
    lines = ["", "The paper's pattern (on paired held-out episodes; resolved: the 95% paired-bootstrap interval of the "
                 "difference excludes 0):"]
    for c in claims:
        verdict = {None: "n/a", True: "holds", False: "DOES NOT HOLD"}[c["holds"]]
        lines.append(f"- {c['claim']}: {verdict}: {c['detail']}")
        lines += [f"  - {d}" for d in c["diagnosis"]]
    return lines
