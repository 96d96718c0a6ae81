"""``dreamgym annotate``, ``train-experience-model`` and ``eval-experience-model``.

``run_annotate``, ``run_train`` and ``run_eval`` do the work and return their summaries; the ``cmd_*``
bodies load the config and print them. Heavy imports stay inside the functions.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from dreamgym.config import DreamGymConfig, load_config
from dreamgym.errors import ConfigError
from dreamgym.runs import MetricsLog, create_run_dir


def run_annotate(cfg: DreamGymConfig) -> dict[str, Any]:
    from dreamgym.experience.annotate import annotate_file, annotator_from_config

    a = cfg.experience_model.annotate
    if a.data is None:
        raise ConfigError("annotate needs the transitions to annotate: --data PATH.parquet")
    run_dir = create_run_dir(cfg, "annotate")
    out = Path(a.out) if a.out else run_dir / "annotated.parquet"
    budget = cfg.experience_model.train.step_budget
    annotator = annotator_from_config(a, budget)
    t0 = time.perf_counter()
    summary = annotate_file(a.data, out, annotator, batch_size=a.batch_size)
    summary.update(run_dir=str(run_dir), seconds=round(time.perf_counter() - t0, 2),
                   annotator="teacher" if a.teacher_url else "template")
    MetricsLog(run_dir).write(event="annotate", **summary)
    return summary


def run_train(cfg: DreamGymConfig) -> dict[str, Any]:
    from learner.sft_experience import train_experience_model

    t = cfg.experience_model.train
    if t.data is None:
        raise ConfigError("train-experience-model needs annotated transitions: --data PATH.parquet")
    run_dir = create_run_dir(cfg, "train-experience-model")
    out = Path(t.out) if t.out else run_dir / "model"
    metrics = MetricsLog(run_dir)

    def log(rec: dict[str, Any]) -> None:
        metrics.write(event="sft", **rec)
        print(f"step {rec['step']:>5}  loss {rec['loss']:.4f}  reasoning {rec['reasoning_nll']:.4f}  "
              f"state {rec['state_nll']:.4f}  {rec['tokens_per_s']:.0f} tok/s", flush=True)

    summary = train_experience_model(cfg, out, log=log)
    summary["run_dir"] = str(run_dir)
    metrics.write(event="summary", **summary)
    return summary


def run_eval(cfg: DreamGymConfig) -> tuple[dict[str, Any], str]:
    """Evaluate the configured model and the copy baseline; returns (result, table)."""
    from dreamgym.experience.evaluate import evaluate, format_fidelity, format_table
    from dreamgym.experience.setup import build_model, prompt_options

    em, e = cfg.experience_model, cfg.experience_model.eval
    if e.data is None:
        raise ConfigError("eval-experience-model needs held-out transitions: --data HELDOUT.parquet")
    run_dir = create_run_dir(cfg, "eval-experience-model")
    opts = prompt_options(em, cfg.env.state_max_chars)
    client = None
    model = None
    if e.simulator_url:
        return _eval_served(cfg, run_dir, opts)
    if em.model != "none":
        if em.backend == "ray":
            from actors.cluster import connect
            from actors.experience_model import connect_experience_model

            connect(cfg.ray)
            client = connect_experience_model(em)
        else:
            from dreamgym.experience.backends import open_client

            client = open_client(em)
        # Fidelity: every query goes to the model, so ruled-out actions get a first reply too; the rules are
        # applied afterwards (model_after_rules), as settling would have before the call.
        model = build_model(em.model_copy(update={"inadmissible": "model"}) if e.fidelity else em, client,
                            cfg.env.state_max_chars)
    try:
        result = evaluate(e.data, e.store, opts, model.predict if model else None, limit=e.limit,
                          step_budget=e.step_budget, seed=cfg.run.seed, batch_size=e.batch_size,
                          fidelity=e.fidelity and model is not None)
    finally:
        if client is not None:
            client.close()
    result["data"].update(model=em.model, backend=em.backend)
    if model is not None:
        result["model_stats"] = model.stats.as_dict()
    out = Path(e.out) if e.out else run_dir / "eval.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    result["json"] = str(out)
    result["run_dir"] = str(run_dir)
    table = format_table(result)
    if "fidelity" in result:
        table += "\n\nfidelity (first reply: before retries and rules)\n" + format_fidelity(result["fidelity"])
    return result, table


def cmd_annotate(args: argparse.Namespace, overrides: list[str]) -> int:
    s = run_annotate(load_config(args.config, overrides))
    print(f"annotated {s['rows']} transitions ({s['teacher']} by the teacher, {s['template']} by template) "
          f"into {s['out']} in {s['seconds']:.1f} s; run directory {s['run_dir']}")
    return 0


def cmd_train_experience_model(args: argparse.Namespace, overrides: list[str]) -> int:
    s = run_train(load_config(args.config, overrides))
    print(f"trained on {s['examples_seen']} of {s['examples']} examples ({s['transitions']} transitions, "
          f"{s['duplicates']} duplicates) for "
          f"{s['steps']} steps in {s['train_seconds']:.0f} s: loss {s['loss_first']:.3f} -> {s['loss_last']:.3f}; "
          f"model in {s['out']}; run directory {s['run_dir']}")
    return 0


def cmd_eval_experience_model(args: argparse.Namespace, overrides: list[str]) -> int:
    result, table = run_eval(load_config(args.config, overrides))
    d = result["data"]
    print(f"{d['evaluated']} held-out transitions ({d['unseen']} with an unseen (state, action)); "
          f"store {d['store_transitions']} transitions; model {d['model']} ({d['backend']})")
    print(table)
    if "model_stats" in result:
        st = result["model_stats"]
        print(f"model calls {st['model_calls']}, retries {st['retries']}, invalid {st['invalid']}, "
              f"reasons {st['reasons']}")
    print(f"JSON: {result['json']}")
    return 0


def _eval_served(cfg: DreamGymConfig, run_dir: Path, opts: Any) -> tuple[dict[str, Any], str]:
    """``run_eval`` for a served simulator (``experience_model.eval.simulator_url``): the same held-out items and
    copy baseline, the simulator's predictions from its ``POST /predict``."""
    from dreamgym.experience.evaluate import evaluate, format_table
    from dreamgym.experience.served_simulator import ServedSimulator
    from dreamgym.secrets import resolve

    e = cfg.experience_model.eval
    assert e.simulator_url is not None
    sim = ServedSimulator(e.simulator_url, resolve(cfg.env.token, "env.token"),
                          timeout_s=cfg.experience_model.request_timeout_s, concurrency=e.batch_size)
    try:
        result = evaluate(e.data, e.store, opts, sim.predict, limit=e.limit, step_budget=e.step_budget,
                          seed=cfg.run.seed, batch_size=e.batch_size)
    finally:
        sim.close()
    result["data"].update(model=f"served simulator at {e.simulator_url} ({sim.about.get('model')})",
                          backend=f"served:{sim.about.get('backend')}", simulator=sim.about)
    out = Path(e.out) if e.out else run_dir / "eval.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    result["json"] = str(out)
    result["run_dir"] = str(run_dir)
    return result, format_table(result)
