"""The paper's pattern, checked on a study's arms, and what the training records say where it does not hold.

The DreamGym paper's Table 1 pattern: DreamGym (synthetic only) reaches at least 0.95 x the held-out success of
GRPO in the real environment; DreamGym-S2R (synthetic, then a small real budget) goes above both; each ablation
(no retrieval, no reasoning, no task generation) stays below DreamGym. Each claim is checked on the arms' mean
held-out success, and marked *resolved* only when the two arms' 95% intervals do not overlap (otherwise the seeds
cannot tell the arms apart, whichever way the means fall).

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
ABLATIONS = ("no-retrieval", "no-reasoning", "no-task-generation")

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


def _claim(arms: dict[str, Any], text: str, left: str, right: str, holds: Any) -> dict[str, Any]:
    a, b = arms.get(left), arms.get(right)
    if a is None or b is None or a["success"]["mean"] is None or b["success"]["mean"] is None:
        return {"claim": text, "left": left, "right": right, "holds": None, "resolved": None,
                "detail": "not measured (an arm has no finished seed)", "diagnosis": []}
    la, rb = a["success"]["mean"], b["success"]["mean"]
    ok = bool(holds(la, rb))
    overlap = _overlap(a["success"], b["success"])
    detail = f"{left} {_pct(la)} vs {right} {_pct(rb)}"
    if overlap is None:
        detail += " (one seed: no interval)"
    elif overlap:
        detail += " (95% intervals overlap: the seeds do not separate them)"
    diagnosis = [] if ok else [_diagnosis(x, arms[x]) for x in (left, right) if x != "base"]
    return {"claim": text, "left": left, "right": right, "left_success": la, "right_success": rb, "holds": ok,
            "resolved": None if overlap is None else not overlap, "detail": detail, "diagnosis": diagnosis}


def paper_pattern(arms: dict[str, Any]) -> list[dict[str, Any]]:
    """Each claim of the paper's pattern on the aggregated arms (``results.aggregate()['arms']``)."""
    claims = [
        _claim(arms, f"DreamGym >= {DREAMGYM_SHARE} x real-environment GRPO", "dreamgym", "real",
               lambda d, r: d >= DREAMGYM_SHARE * r),
        _claim(arms, "DreamGym-S2R above real-environment GRPO", "dreamgym-s2r", "real", lambda s, r: s > r),
        _claim(arms, "DreamGym-S2R above DreamGym", "dreamgym-s2r", "dreamgym", lambda s, d: s > d),
    ]
    claims += [_claim(arms, f"{x} below DreamGym", x, "dreamgym", lambda x_, d: x_ < d) for x in ABLATIONS]
    claims += [_claim(arms, f"{x} above the base policy", x, "base", lambda x_, b: x_ > b)
               for x in ("real", "dreamgym", "dreamgym-s2r")]
    return claims


def pattern_lines(claims: list[dict[str, Any]]) -> list[str]:
    """The Markdown section of the results table."""
    lines = ["", "The paper's pattern (on mean held-out success; resolved: the 95% intervals do not overlap):"]
    for c in claims:
        verdict = {None: "n/a", True: "holds", False: "DOES NOT HOLD"}[c["holds"]]
        lines.append(f"- {c['claim']}: {verdict}: {c['detail']}")
        lines += [f"  - {d}" for d in c["diagnosis"]]
    return lines
