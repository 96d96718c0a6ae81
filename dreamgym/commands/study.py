"""``dreamgym study``: the arms of the paper's Table 1 on one environment, each arm-seed one ``dreamgym train`` run.

Layout of a study directory (``<run.out_dir>/study-<name>/``)::

    study.yaml                    the study's config (every arm-seed's config derives from it)
    offline.parquet               the offline real data, collected once (unless train.offline_data is given)
    <arm>/seed-<k>/               a dreamgym train run directory: config.yaml, train.log, summary.json, report.md
    <arm>/seed-<k>/study_run.json how the study ran it (status, times, where its experience model came from)
    results.md  results.json  success_vs_real.png   rebuilt after every arm-seed from the finished ones

Each arm-seed runs as a subprocess (``dreamgym train --resume <arm>/seed-<k>`` on the config written there):
its Ray cluster, engines and memory go away with it, a crash or a timeout ends that arm-seed only, and a
killed study resumes where it was (a finished arm-seed has ``summary.json``; an unfinished one continues from
its last checkpoint). An arm-seed's config is fixed when it first starts.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dreamgym.config import STUDY_ARMS, DreamGymConfig, load_config, save_config
from dreamgym.errors import ConfigError
from dreamgym.study.arms import (
    arm_seed_config,
    arm_seed_dir,
    experience_variant,
    fine_tunes_experience_model,
    s2r_budget,
    study_dir_for,
    study_name,
)
from dreamgym.study.results import RUN_RECORD, scan, write_results

STUDY_CONFIG = "study.yaml"


def _say(name: str, text: str) -> None:
    print(f"study {name}: {text}", flush=True)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "dreamgym.cli", *args]


def _run(cmd: list[str], log: Path, timeout_s: float | None) -> tuple[int | None, float]:
    """Run ``cmd`` in its own process group with its output appended to ``log``; ``(exit code or None on
    timeout, seconds)``. On timeout or Ctrl-C the whole group (the command and the local Ray it started) ends."""
    t0 = time.perf_counter()
    with log.open("a") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s), time.perf_counter() - t0
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            return None, time.perf_counter() - t0
        except BaseException:
            _stop_group(proc)
            raise


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group we started (the command and the local Ray it started), SIGKILL after 60 s."""
    for sig, wait_s in ((signal.SIGTERM, 60.0), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _last_line(log: Path) -> str:
    lines = [x.strip() for x in log.read_text(errors="replace").splitlines() if x.strip()] if log.is_file() else []
    return lines[-1][:300] if lines else "no output"


# -- offline data ----------------------------------------------------------------------------------------
def offline_data(cfg: DreamGymConfig, study_dir: Path, name: str) -> Path | None:
    """The offline real data every arm reads: ``train.offline_data``, else one ``dreamgym collect`` into
    ``<study>/offline.parquet`` (kept for ``--resume``); ``None`` with ``collect.episodes 0``."""
    if cfg.train.offline_data is not None:
        path = Path(cfg.train.offline_data).resolve()
        if not path.is_file():
            raise ConfigError(f"train.offline_data {path} does not exist")
        return path
    path = (study_dir / "offline.parquet").resolve()
    if path.is_file():
        return path
    if cfg.collect.episodes == 0:
        return None
    partial = study_dir / "offline.partial.parquet"
    c = cfg.model_copy(deep=True)
    c.collect.out = partial.resolve()
    c.run.out_dir = (study_dir / "stages").resolve()
    save_config(c, study_dir / "collect.yaml")
    _say(name, f"collecting the offline data once for every arm: {cfg.collect.episodes} {cfg.collect.policy} "
               f"episodes of {cfg.env.name} (log {study_dir / 'collect.log'})")
    rc, seconds = _run(_cli("collect", str(study_dir / "collect.yaml")), study_dir / "collect.log", None)
    if rc != 0 or not partial.is_file():
        raise ConfigError(f"collecting the offline data failed (exit {rc}): {_last_line(study_dir / 'collect.log')}")
    partial.replace(path)
    _say(name, f"offline data {path} collected in {seconds / 60:.1f} min")
    return path


def check_expert_data(cfg: DreamGymConfig, offline: Path | None) -> None:
    """The ``bc`` arm clones the offline data's expert episodes; without any it would collect gold episodes of its
    own (real transitions no other arm gets), so the study refuses it up front."""
    from dreamgym.data.expert import offline_split

    n = offline_split(offline, cfg.env.name)["expert_episodes"] if offline is not None else 0
    if n == 0:
        raise ConfigError(f"the bc arm clones the offline data's expert episodes, and "
                          f"{offline or 'the study (collect.episodes 0)'} has none of {cfg.env.name}: collect with "
                          "collect.policy gold or mixed (collect.gold_fraction > 0), or leave bc out of study.arms")


# -- one arm-seed ----------------------------------------------------------------------------------------
def _donor(study_dir: Path, variant: str) -> Path | None:
    """A fine-tuned experience model of this variant that an earlier arm-seed of the study trained. Its weights
    must be there: an exported study (``--export``) keeps the fine-tune's summary but not its weights."""
    from dreamgym.models import is_model_dir

    for run in scan(study_dir):
        folder = run.path / "experience_model"
        if run.record.get("variant") == variant and (folder / "dreamgym_sft.json").is_file() and is_model_dir(folder):
            return folder.resolve()
    return None


def _prepare(cfg: DreamGymConfig, study_dir: Path, arm: str, seed: int, offline: Path | None) -> dict[str, Any]:
    """Write the arm-seed's ``config.yaml`` (once) and return its study record."""
    d = arm_seed_dir(study_dir, arm, seed)
    record_path = d / RUN_RECORD
    if (d / "config.yaml").is_file() and record_path.is_file():
        return json.loads(record_path.read_text())  # started before: its config stays as it was
    record: dict[str, Any] = {"arm": arm, "seed": seed, "attempts": 0}
    budget = None
    if arm == "dreamgym-s2r":
        real = [r.summary["real_transitions"] for r in scan(study_dir) if r.arm == "real" and r.summary]
        budget, record["real_budget_from"] = s2r_budget(cfg, real)
        record["real_budget"] = budget
    d.mkdir(parents=True, exist_ok=True)
    c = arm_seed_config(cfg, arm, seed, offline, real_budget=budget)
    if fine_tunes_experience_model(c):
        record["variant"] = experience_variant(c)
        donor = _donor(study_dir, record["variant"]) if cfg.study.share_experience_model else None
        if donor is not None:
            c = arm_seed_config(cfg, arm, seed, offline, real_budget=budget, experience_model=donor)
            record["experience_model_from"] = str(donor)
    save_config(c, d / "config.yaml")
    _write_json(record_path, record)
    return record


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def run_arm_seed(cfg: DreamGymConfig, study_dir: Path, arm: str, seed: int, offline: Path | None,
                 position: str) -> bool:
    """Run (or continue) one arm-seed unless it has finished; one status line at its start and one at its end.
    Returns whether it has finished."""
    name, d = study_name(cfg), arm_seed_dir(study_dir, arm, seed)
    if (d / "summary.json").is_file():
        _say(name, f"{position} {arm} seed {seed}: finished before, skipped")
        return True
    record = _prepare(cfg, study_dir, arm, seed, offline)
    c = load_config(d / "config.yaml")
    t = c.train
    what = f"train.mode {t.mode}, {t.iterations} iterations"
    if t.mode == "s2r":
        what += f" ({t.iterations - t.synthetic_iterations} real, budget {t.real_budget} real transitions)"
    if record.get("experience_model_from"):
        what += f", experience model from {record['experience_model_from']}"
    elif fine_tunes_experience_model(c):
        what += ", fine-tunes the experience model first"
    _say(name, f"{position} {arm} seed {seed}: start ({what}; log {d / 'train.log'})")
    record.update(attempts=record.get("attempts", 0) + 1, status="running", started=time.time(), error=None)
    _write_json(d / RUN_RECORD, record)
    rc, seconds = _run(_cli("train", "--resume", str(d)), d / "train.log", cfg.study.run_timeout_s)
    summary_path = d / "summary.json"
    if rc == 0 and summary_path.is_file():
        s = json.loads(summary_path.read_text())
        record.update(status="finished", ended=time.time(), seconds=round(seconds, 1))
        _write_json(d / RUN_RECORD, record)
        episodes = s["evals"][-1]["episodes"] if s.get("evals") else 0
        _say(name, f"{position} {arm} seed {seed}: done in {seconds / 60:.1f} min: held-out success "
                   f"{_pct(s.get('success_final'))} (random valid {_pct(s.get('baseline_success'))}) on "
                   f"{episodes:.0f} episodes; real transitions {s['real_transitions']}, synthetic "
                   f"{s['synthetic_transitions']} ({s['invalid_transitions']} invalid); learner steps "
                   f"{s['learner_steps']}/{t.iterations}")
        return True
    why = f"timed out after {cfg.study.run_timeout_s:.0f} s" if rc is None else f"exit {rc}"
    record.update(status="failed", ended=time.time(), seconds=round(seconds, 1),
                  error=f"{why}: {_last_line(d / 'train.log')}")
    _write_json(d / RUN_RECORD, record)
    _say(name, f"{position} {arm} seed {seed}: FAILED after {seconds / 60:.1f} min ({record['error']}); "
               f"--resume continues it")
    return False


# -- the command -----------------------------------------------------------------------------------------
def _study_dir(flag: str, path: str) -> Path:
    """The study directory given to ``flag`` (``--resume``, ``--report``, ``--export``), refused without its config."""
    d = Path(path)
    if not (d / STUDY_CONFIG).is_file():
        raise ConfigError(f"{flag} {d}: not a study directory (no {STUDY_CONFIG})")
    return d


def _open(args: argparse.Namespace, overrides: list[str]) -> tuple[DreamGymConfig, Path]:
    if args.resume:
        d = _study_dir("--resume", args.resume)
        # Overrides apply to this invocation: the arm-seeds it starts keep them in their own config.yaml. study.yaml,
        # the study's design, stays as it was, so a --study.seeds 1 given to run one seed now does not shrink the
        # study for every later --resume (or for an export).
        cfg = load_config(d / STUDY_CONFIG, overrides)
        return cfg, d
    from dreamgym.commands.train import default_train_config

    cfg = load_config(args.config or default_train_config(), overrides)
    d = study_dir_for(cfg)
    if d.exists():
        raise ConfigError(f"study directory {d} exists: continue it with --resume {d}, rebuild its table with "
                          f"--report {d}, or set another --study.name")
    d.mkdir(parents=True)
    save_config(cfg, d / STUDY_CONFIG)
    return cfg, d


def _selected_arms(cfg: DreamGymConfig, chosen: list[str] | None) -> list[str]:
    if not chosen:
        return list(cfg.study.arms)
    unknown = [a for a in chosen if a not in STUDY_ARMS]
    if unknown:
        raise ConfigError(f"--arm {', '.join(unknown)}: unknown arm; arms: {', '.join(STUDY_ARMS)}")
    return [a for a in STUDY_ARMS if a in chosen]


#: What ``--export`` leaves out of a finished arm-seed: model weights and stores that its results do not need.
EXPORT_SKIP_DIRS = ("checkpoints", "experience_model", "model", "replay", "qdrant")
EXPORT_MAX_FILE_BYTES = 20 * 2**20


def export_study(d: Path, out: Path) -> list[str]:
    """Copy what a study's results are made of into ``out``, small enough to commit: ``study.yaml``, the offline
    data, the results files and every *finished* arm-seed without its weights and stores (``EXPORT_SKIP_DIRS``,
    files over ``EXPORT_MAX_FILE_BYTES``). ``dreamgym study --resume`` on a copy of ``out`` skips those arm-seeds and
    runs the rest, so a study too long for one machine session goes on in the next (each session fine-tunes its
    own experience model once: the export does not carry weights). Returns the arm-seeds exported."""
    import shutil

    if out.resolve() == d.resolve():
        raise ConfigError(f"--export: the output {out} is the study directory itself; name another folder")
    out.mkdir(parents=True, exist_ok=True)
    for name in (STUDY_CONFIG, "offline.parquet", "results.md", "results.json", "success_vs_real.png"):
        if (d / name).is_file():
            shutil.copy2(d / name, out / name)
    exported: list[str] = []
    for run in scan(d):
        if not run.finished:
            continue
        target = out / run.path.relative_to(d)
        if target.exists():
            shutil.rmtree(target)
        for f in sorted(run.path.rglob("*")):
            rel = f.relative_to(run.path)
            if not f.is_file() or rel.parts[0] in EXPORT_SKIP_DIRS or f.stat().st_size > EXPORT_MAX_FILE_BYTES:
                continue
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, target / rel)
        exported.append(f"{run.arm}/seed-{run.seed}")
    return exported


def _report(cfg: DreamGymConfig, d: Path) -> dict[str, Path]:
    return write_results(d, study_name(cfg))


def cmd_study(args: argparse.Namespace, overrides: list[str]) -> int:
    if args.export:
        d, out = _study_dir("--export", args.export[0]), Path(args.export[1])
        done = export_study(d, out)
        print(f"exported {len(done)} finished arm-seed(s) of {d} to {out}: {', '.join(done) or 'none'}; continue "
              f"elsewhere with: cp -r {out} {d} && dreamgym study --resume {d}")
        return 0
    if args.report:
        d = _study_dir("--report", args.report)
        paths = _report(load_config(d / STUDY_CONFIG), d)
        print(f"table {paths['table']}; plot {paths['plot']}; JSON {paths['json']}")
        return 0
    if args.resume and args.config:
        raise ConfigError("give either a CONFIG (a new study) or --resume DIR (its study.yaml is the config)")
    cfg, d = _open(args, overrides)
    name, arms, seeds = study_name(cfg), _selected_arms(cfg, args.arm), cfg.study.seeds
    placeholder = (d / "offline.parquet").resolve()
    for arm in arms:  # every arm-seed's config is valid before anything runs
        for seed in cfg.study.seeds_of(arm):
            arm_seed_config(cfg, arm, seed, placeholder, real_budget=1)
    todo = [(a, s) for a in arms for s in cfg.study.seeds_of(a)]
    fewer = {a: n for a, n in cfg.study.arm_seeds.items() if a in arms and n < len(seeds)}
    _say(name, f"{len(todo)} arm-seed(s) in {d}: {', '.join(arms)}; seeds {seeds}"
               f"{' (fewer: ' + json.dumps(fewer) + ')' if fewer else ''}; "
               f"{cfg.train.iterations} iterations each; held-out {cfg.study.eval_episodes or cfg.train.eval.tasks} "
               f"episodes per point")
    offline = offline_data(cfg, d, name)
    if "bc" in arms:
        check_expert_data(cfg, offline)
    failed = 0
    t0 = time.perf_counter()
    for i, (arm, seed) in enumerate(todo, 1):
        try:
            done = run_arm_seed(cfg, d, arm, seed, offline, f"[{i}/{len(todo)}]")
        except ConfigError as e:  # e.g. dreamgym-s2r with no real result to take its budget from
            _say(name, f"[{i}/{len(todo)}] {arm} seed {seed}: not started: {e}")
            done = False
        failed += not done
        _report(cfg, d)
    paths = _report(cfg, d)
    _say(name, f"{len(todo) - failed}/{len(todo)} arm-seeds finished in {(time.perf_counter() - t0) / 60:.1f} min; "
               f"table {paths['table']}; plot {paths['plot']}; JSON {paths['json']}")
    return 1 if failed else 0
