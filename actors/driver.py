"""``dreamgym train``: the DreamGym loop on Ray.

``Run.iterate`` is one iteration of the paper's Algorithm 1 (with GRPO); its docstring lists the six lines.
Where each iteration trains (``synthetic``, ``real`` or ``s2r``: synthesis first, then the real environment
within ``train.real_budget`` real transitions) is ``dreamgym.schedule``. With ``train.max_staleness >= 1``
the rollouts of ``t+1`` are launched before the learner step of ``t`` (they overlap it and may sample with
weights one version old; groups staler than the bound are dropped and counted). The real environment
evaluates the policy on a fixed held-out task set before training, every ``train.eval.every`` iterations
and at the end, always beside the random-valid-action baseline on the same tasks, with the real
transitions spent so far; every evaluated episode is kept in ``eval_episodes.jsonl`` (``dreamgym.eval_records``).

Setup (offline data, replay seeding, actors, warm start) is ``actors.train_setup``; the counters, the
iteration log and checkpoints ``dreamgym.train_state``; the report ``dreamgym.report``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from actors.cluster import connect, stop_on_sigterm
from actors.train_setup import (
    STATUS_INTERVAL_S,
    Actors,
    check_resources,
    check_run_dir,
    experience_sft,
    gold_for_warm_start,
    offline_data,
    seed_replay,
    start_actors,
    warm_start,
)
from dreamgym.config import DreamGymConfig, load_config, save_config
from dreamgym.errors import ActorDiedStartingError, ActorHungError, ConfigError, ReplayTimeoutError, TrainingFaultError
from dreamgym.eval_records import append_records, episode_records
from dreamgym.experience.accounting import counts_from, rule_figures
from dreamgym.guard import SimulatorCollapsedError, SimulatorGuard
from dreamgym.progress import MetricSinks, Progress
from dreamgym.rollout import (
    RolloutStats,
    group_stats,
    group_trajectories,
    learnable_part,
    repeat_tasks,
    split_stale,
)
from dreamgym.runs import MetricsLog, create_run_dir
from dreamgym.schedule import Schedule, TrainingPhase
from dreamgym.sync_choice import sleeps_engines
from dreamgym.train_state import (
    IterationLog,
    TrainState,
    checkpoint_dir,
    latest_run_checkpoint,
    load_driver_state,
    save_driver_state,
    write_json_atomic,
)
from dreamgym.types import Group, Task, Trajectory
from dreamgym.verdict import episode_outcomes
from dreamgym.watchdog import hung_message

#: The actors the driver waits on through ``Run.remote``: the name its messages give each and the
#: ``train.watchdog`` field that bounds one call to it.
WATCHED = {"learner": ("the learner actor", "learner_s"), "curriculum": ("the curriculum actor", "curriculum_s"),
           "worker": ("rollout worker 0", "worker_s"), "engine": ("a policy engine", "engine_s")}


@dataclass
class RolloutCall:
    """One worker's share of a phase's episodes, kept so that it can run again if the worker dies."""

    worker: int
    tasks: list[Task]
    phase: str
    temperature: float | None
    seed: int
    ref: ray.ObjectRef
    attempts: int = 1


@dataclass
class Collected:
    """A phase's finished episodes, its merged stats, and the tasks whose episodes were lost with a worker."""

    trajectories: list[Trajectory]
    stats: dict[str, Any]
    lost_tasks: set[str]


@dataclass
class Launched:
    """An iteration whose rollouts are running: its tasks, phase and the workers' calls."""

    iteration: int
    """0-based index of the iteration."""
    phase: TrainingPhase
    tasks: list[Task]
    calls: list[RolloutCall]
    started: float
    """``time.perf_counter()`` at launch (the rollout phase runs from here to its collection)."""
    skipped_llm_tasks: int = 0
    """Text-only task variants left out of a real iteration (``Schedule.trainable_tasks``)."""


#: Rollout seed offset of an iteration's extra rounds (``train.resample``): round ``r`` samples with
#: ``iteration + r * stride``, clear of the seeds of the other iterations' first rounds.
RESAMPLE_SEED_STRIDE = 100_003


@dataclass
class Gathered:
    """An iteration's collected episodes: their learnable part, the fresh groups the learner takes, and the groups
    the curriculum has not recorded yet (``train.resample`` records each round it extends: at most the last one)."""

    learnable: list[Trajectory]
    fresh: list[Group]
    unrecorded: list[Group]


def merge_rounds(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One iteration's rollout stats from its rounds (``train.resample``), which ran one after the other."""
    if len(rounds) == 1:
        return rounds[0]
    out = _merge_stats(rounds)
    out["seconds"] = sum(r["seconds"] for r in rounds)
    out["real_resets"] = max(r["real_resets"] for r in rounds)
    out["lost_tasks"] = sum(r["lost_tasks"] for r in rounds)
    return out


def _merge_stats(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    total = RolloutStats()
    extra: dict[str, float] = {}
    for p in parts:
        total += RolloutStats(**{k: p[k] for k in RolloutStats.__dataclass_fields__})
        for k, v in p.items():
            if k.startswith("em_"):
                extra[k] = extra.get(k, 0) + v
    wall = max((p["seconds"] for p in parts), default=0.0)
    total.seconds = wall  # workers run in parallel: the phase took as long as the slowest one
    return {**total.as_dict(), **extra, "real_resets": sum(p.get("real_resets", 0) for p in parts)}


class Run:
    """One training run (fresh or resumed) and its driver-side state."""

    def __init__(self, cfg: DreamGymConfig, run_dir: Path, state: TrainState, resumed_from: Path | None,
                 stop_on_sigterm: bool = False, after_fault: str | None = None) -> None:
        self.cfg = cfg
        self.after_fault = after_fault  # this session resumes the run by itself after that fault
        self.schedule = Schedule.from_config(cfg.train)
        self.run_dir = run_dir
        self.state = state
        self.resumed_from = resumed_from
        self.metrics = MetricsLog(run_dir)
        self.progress = Progress(cfg.train.report.progress, cfg.train.iterations)
        self.sinks: MetricSinks | None = None
        self.a = Actors()
        self.t_session = time.time()
        self.eval_tasks: list[Task] = [Task.from_dict(d) for d in state.eval_tasks]
        self.guard = SimulatorGuard(cfg.train.guard)
        self.stop_on_sigterm = stop_on_sigterm

    # -- helpers ---------------------------------------------------------------------------------------
    def say(self, text: str, phase: str = "setup") -> None:
        self.progress.line("", phase, text)

    def record(self, event: str, step: int, **data: Any) -> None:
        self.metrics.write(**{"event": event, "iteration": step, **data})
        if self.sinks is not None:
            self.sinks.log(step, {k: v for k, v in data.items() if k != "iteration"}, prefix=f"{event}/")

    def rollouts(self, tasks: Sequence[Task], phase: str, temperature: float | None = None,
                 seed: int = 0) -> list[RolloutCall]:
        """Launch one episode per task, split evenly over the workers."""
        w = self.a.workers
        chunks = [list(tasks[i::len(w)]) for i in range(len(w))]
        return [RolloutCall(i, c, phase, temperature, seed,
                            w[i].run.remote(c, phase, temperature, seed, self.a.worker_parts()))
                for i, c in enumerate(chunks) if c]

    def _live_progress(self, phase: str) -> dict[int, dict[str, Any]]:
        """Progress of the workers that answer within a few seconds (a dead, restarting or frozen one does not),
        by worker index."""
        refs = [w.progress.remote() for w in self.a.workers]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=5.0)
        out = []
        for r in ready:
            try:
                out.append(ray.get(r))
            except ray.exceptions.RayActorError:
                continue
        return {int(p["index"]): p for p in out if p["phase"] == phase}

    def watch_workers(self, pending: Sequence[RolloutCall], live: dict[int, dict[str, Any]],
                      seen: dict[int, tuple[Any, float]], iteration: int | str) -> None:
        """The worker watchdog: a worker whose episodes took no step, and that may not even answer its
        ``progress``, for ``train.watchdog.worker_s`` is killed for Ray to restart; its call then fails like a
        dead worker's and its share runs again (``lost_worker``). ``seen``: per worker, its last progress and
        when it changed."""
        bound, now = self.cfg.train.watchdog.worker_s, time.monotonic()
        for c in pending:
            p = live.get(c.worker)
            mark = None if p is None else (p["episodes"], p["steps"])
            last, since = seen.setdefault(c.worker, (mark, now))
            if mark is not None and mark != last:
                seen[c.worker] = (mark, now)
            elif now - since > bound:
                what = hung_message(f"rollout worker {c.worker} ({len(c.tasks)} {c.phase} episodes)", bound,
                                    "train.watchdog.worker_s") + ": restarting it"
                self.progress.line(iteration, c.phase, what)
                self.record("actor_hung", self.state.iteration, what=what)
                ray.kill(self.a.workers[c.worker], no_restart=False)
                seen[c.worker] = (None, now)

    def collect(self, calls: Sequence[RolloutCall], iteration: int | str, phase: str) -> Collected:
        """Wait for the workers' episodes, with a status line every ``STATUS_INTERVAL_S`` (a synthetic
        iteration on CPU takes minutes).

        A worker that dies (killed, out of memory, node lost) is restarted by Ray (``train.rollout.max_restarts``)
        and its share runs again on it, up to ``train.rollout.retries`` times; past that the share is dropped
        whole, and its tasks are returned in ``lost_tasks`` so that no partial GRPO group reaches the learner.
        """
        t0 = time.perf_counter()
        pending, results, lost = list(calls), [], set()
        seen: dict[int, tuple[Any, float]] = {}
        while pending:
            ready, _ = ray.wait([c.ref for c in pending], num_returns=len(pending), timeout=STATUS_INTERVAL_S)
            done = {r.hex() for r in ready}
            for c in [c for c in pending if c.ref.hex() in done]:
                pending.remove(c)
                try:
                    results.append(ray.get(c.ref))
                except ray.exceptions.RayTaskError as e:  # a DreamGymError inside: the CLI unwraps it
                    if isinstance(e.cause, ActorHungError | ReplayTimeoutError):  # an engine or the shards hung
                        raise self.fault(f"rollout worker {c.worker}: {e.cause}") from None
                    if isinstance(e.cause, ray.exceptions.RayActorError):  # an actor the worker called died
                        raise self.fault(f"rollout worker {c.worker} lost an actor it was calling (a policy engine "
                                         f"or an experience-model replica) during {c.phase} episodes: "
                                         f"{type(e.cause).__name__}") from None
                    raise
                except ray.exceptions.RayActorError as e:
                    again = self.lost_worker(c, iteration, e)
                    if again is not None:
                        pending.append(again)
                    else:
                        lost.update(t.task_id for t in c.tasks)
            if pending:
                live = self._live_progress(phase)
                self.watch_workers(pending, live, seen, iteration)
                ps = list(live.values())
                n, total = sum(p["episodes"] for p in ps), sum(p["tasks"] for p in ps)
                steps = sum(p["steps"] for p in ps)
                waits = [p for p in ps if p.get("waiting")]
                waiting = ""
                if waits:
                    w = max(waits, key=lambda p: p["waiting_s"])
                    waiting = f"; worker {w['index']} waits on {w['waiting']} for {w['waiting_s']:.0f} s"
                silent = sorted(c.worker for c in pending if c.worker not in live)
                if silent:
                    waiting += f"; no progress report from worker(s) {', '.join(map(str, silent))}"
                self.progress.line(iteration, phase, f"running: {n}/{total} episodes, {steps} steps "
                                                     f"({time.perf_counter() - t0:.0f} s){waiting}")
        for _, s in results:  # replicas a worker restarted because they hung (``ReplicaRouter.restart_hung``)
            for note in s.pop("notices", []):
                self.progress.line(iteration, phase, note)
                self.record("actor_hung", self.state.iteration, what=note)
        trajs = [t for tr, _ in results for t in tr]
        if lost:
            trajs = [t for t in trajs if t.task.task_id not in lost]
        stats = _merge_stats([s for _, s in results])
        stats["lost_tasks"] = len(lost)
        return Collected(trajs, stats, lost)

    def fault(self, what: str) -> TrainingFaultError:
        """A stop that names what failed and how to go on from the last checkpoint."""
        last = latest_run_checkpoint(self.run_dir)
        where = (f"resume from {last.name} with `dreamgym train --resume {self.run_dir}`" if last is not None
                 else f"no checkpoint was written yet: start again (`dreamgym train --resume {self.run_dir}` "
                 "starts over in place)")
        self.record("fault", self.state.iteration, what=what)
        return TrainingFaultError(f"training stopped at iteration {self.state.iteration + 1}: {what}; {where}")

    def remote(self, ref: ray.ObjectRef, what: str, actor: str = "learner") -> Any:
        """``ray.get`` of one driver call to an actor (``WATCHED``: the learner, the curriculum, a worker's
        ``tasks``), the one path every such call takes. While it runs, a status line every ``STATUS_INTERVAL_S``
        says what is waited for and for how long; an actor that died there, or did not answer within its
        ``train.watchdog`` bound, stops the run by name (a fault: the run resumes itself, ``train.auto_resume``).
        Killing a hung actor is left to the session's shutdown."""
        name, field = WATCHED[actor]
        bound = float(getattr(self.cfg.train.watchdog, field))
        t0 = time.monotonic()
        while not ray.wait([ref], timeout=max(0.0, min(STATUS_INTERVAL_S, bound - (time.monotonic() - t0))))[0]:
            waited = time.monotonic() - t0
            if waited >= bound:
                raise self.fault(hung_message(f"{what} ({name})", bound, f"train.watchdog.{field}"))
            # the iteration in progress (``state.iteration`` counts finished ones), as the phase lines around it
            in_progress = min(self.state.iteration + 1, self.cfg.train.iterations)
            self.progress.line(in_progress, "waiting", f"{what}: waiting on {name} for {waited:.0f} s "
                                                           f"(bound {bound:.0f} s, train.watchdog.{field})")
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as e:
            raise self.fault(f"{what} failed: {name} died ({type(e).__name__})") from None
        except ray.exceptions.RayTaskError as e:  # a DreamGymError inside: the CLI unwraps it
            if isinstance(e.cause, ray.exceptions.RayActorError):
                raise self.fault(f"{what} failed: an actor it called died ({type(e.cause).__name__})") from None
            raise  # a bug, not a fault: its traceback is what a maintainer needs

    @contextmanager
    def engines_asleep(self, log: IterationLog) -> Iterator[bool]:
        """The policy engines asleep for the learner's steps inside the block (``train.sleep_engines``: on one GPU
        shared with the learner, a step needs the memory their weights and KV cache hold), everything woken when it
        ends, also on an error. Yields whether they sleep (False when off)."""
        if not sleeps_engines(self.cfg):
            yield False
            return
        with log.timed("sleep"):
            timeout = self.cfg.learner.sync_timeout_s
            for i, e in enumerate(self.a.engines):
                self.remote(e.sleep.remote(1, timeout), f"putting policy engine {i} to sleep", "engine")
        try:
            yield True
        finally:
            self.wake_engines(log, None)

    def wake_engines(self, log: IterationLog, tags: list[str] | None) -> None:
        """Wake what ``tags`` names in every policy engine (``None``: everything; awake engines ignore it)."""
        with log.timed("wake"):
            for i, e in enumerate(self.a.engines):
                self.remote(e.wake_up.remote(tags), f"waking policy engine {i} ({'all' if tags is None else tags})",
                            "engine")

    def wait_restarted(self, index: int) -> None:
        """Until Ray has restarted worker ``index`` (a call to a restarting actor fails), within
        ``train.rollout.restart_timeout_s``."""
        bound = self.cfg.train.rollout.restart_timeout_s
        deadline = time.monotonic() + bound
        while True:
            try:
                ray.get(self.a.workers[index].ready.remote(), timeout=max(1.0, deadline - time.monotonic()))
                return
            except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
                pass
            except ray.exceptions.RayActorError:
                raise self.fault(f"rollout worker {index} died and Ray did not restart it (train.rollout.max_restarts "
                                 f"{self.cfg.train.rollout.max_restarts} spent)") from None
            if time.monotonic() > deadline:
                raise self.fault(f"rollout worker {index} died and was not back within {bound:.0f} s "
                                 "(train.rollout.restart_timeout_s)")
            time.sleep(1.0)

    def lost_worker(self, call: RolloutCall, iteration: int | str, error: Exception) -> RolloutCall | None:
        """Run a dead worker's share again on its restarted actor, or give it up (``None``)."""
        retries = self.cfg.train.rollout.retries
        again = call.attempts <= retries
        self.record("rollout_worker_lost", self.state.iteration, worker=call.worker, phase=call.phase,
                    episodes=len(call.tasks), attempt=call.attempts, rerun=again, error=type(error).__name__)
        what = (f"running its {len(call.tasks)} episodes again (attempt {call.attempts + 1} of {retries + 1})"
                if again else f"dropping its {len(call.tasks)} episodes and every other episode of their tasks")
        self.progress.line(iteration, call.phase, f"rollout worker {call.worker} died "
                                                  f"({type(error).__name__}): {what}")
        self.wait_restarted(call.worker)  # also when dropping: the next iteration must not meet it still restarting
        if not again:
            return None
        w = self.a.workers[call.worker]
        ref = w.run.remote(call.tasks, call.phase, call.temperature, call.seed, self.a.worker_parts())
        return RolloutCall(call.worker, call.tasks, call.phase, call.temperature, call.seed, ref, call.attempts + 1)

    # -- evaluation ------------------------------------------------------------------------------------
    def evaluate(self, label: str) -> None:
        """The policy on the held-out tasks, beside the random-valid-action baseline (``train.eval``)."""
        t = self.cfg.train
        if not t.eval.enabled:
            return
        tasks = repeat_tasks(self.eval_tasks, t.eval.episodes_per_task)
        t0 = time.perf_counter()
        seeds = {"label": label, "iteration": self.state.iteration, "run_seed": self.cfg.run.seed}
        if self.state.baseline is None:
            got = self.collect(self.rollouts(tasks, "random", seed=self.cfg.run.seed), self.state.iteration, "random")
            base = got.stats
            self.state.baseline = {k: base[k] for k in ("success_rate", "mean_reward", "episodes", "steps")}
            self.state.eval_transitions += int(base["steps"])
            append_records(self.run_dir, episode_records(got.trajectories, self.eval_tasks, policy="random",
                                                         sampling_seed=self.cfg.run.seed, **seeds))
        got = self.collect(self.rollouts(tasks, "eval", t.eval.temperature, seed=self.state.iteration),
                           self.state.iteration, "eval")
        s = got.stats
        episodes = episode_records(got.trajectories, self.eval_tasks, policy="policy",
                                   sampling_seed=self.cfg.policy.engine.seed, **seeds)
        append_records(self.run_dir, episodes)
        self.state.eval_transitions += int(s["steps"])
        seconds = time.perf_counter() - t0
        self.state.add_phase("eval", seconds, int(s["episodes"]), int(s["steps"]))
        b = self.state.baseline
        rec = {"label": label, "iteration": self.state.iteration, "real_transitions": self.state.real_transitions,
               "success_rate": s["success_rate"], "mean_reward": s["mean_reward"], "episodes": s["episodes"],
               "unparsable_rate": s["unparsable_rate"], "invalid_action_rate": s["invalid_action_rate"],
               "baseline_success_rate": b["success_rate"], "baseline_mean_reward": b["mean_reward"],
               "seconds": seconds, "outcomes": episode_outcomes(episodes)}
        self.state.evals.append(rec)
        self.record("eval", self.state.iteration, **rec)
        self.progress.line(self.state.iteration, "eval",
                           f"held-out {len(tasks)} ep: success {s['success_rate']:.0%} reward {s['mean_reward']:.2f} "
                           f"(random valid action: {b['success_rate']:.0%} / {b['mean_reward']:.2f}) | unparsable "
                           f"{s['unparsable_rate']:.0%} invalid-act {s['invalid_action_rate']:.0%} | "
                           f"real used {self.state.real_transitions} | {seconds:.0f} s")

    # -- checkpoints -------------------------------------------------------------------------------------
    def checkpoint(self) -> None:
        """The learner's checkpoint (a run that only evaluates has no learner: the initial weights need none), then
        the curriculum's state and the driver's counters."""
        t0 = time.perf_counter()
        d = checkpoint_dir(self.run_dir, self.state.iteration)
        if self.a.learner is not None:
            self.remote(self.a.learner.save_checkpoint.remote(str(d)), f"the checkpoint {d.name}")
        d.mkdir(parents=True, exist_ok=True)
        self.state.wall_seconds += time.time() - self.t_session
        self.t_session = time.time()
        save_driver_state(d, self.state, self.remote(self.a.curriculum.state_dict.remote(),
                                                     "the curriculum's state", "curriculum"))
        self.state.add_phase("checkpoint", time.perf_counter() - t0)
        self.record("checkpoint", self.state.iteration, path=str(d), seconds=time.perf_counter() - t0)

    # -- the loop ------------------------------------------------------------------------------------------
    def can_launch(self, iteration: int) -> bool:
        return self.schedule.can_launch(iteration, self.state.real_transitions)

    def launch(self, iteration: int) -> Launched:
        """``tasks = curriculum.select()`` and their rollouts, ``n`` episodes per task (one GRPO group each)."""
        phase = self.schedule.phase(iteration)
        selected = self.remote(self.a.curriculum.select.remote(), "the curriculum's task selection", "curriculum")
        tasks, skipped = self.schedule.trainable_tasks(selected, phase)
        calls = self.rollouts(repeat_tasks(tasks, self.cfg.learner.group_size), phase, seed=iteration)
        return Launched(iteration, phase, tasks, calls, time.perf_counter(), skipped)

    def iterate(self, launched: Launched) -> Launched | None:
        """Finish iteration ``t`` (the paper's Algorithm 1, one GRPO step) and return iteration ``t+1``, launched::

            groups = rollouts(tasks x n, env)          # launched by ``launch``, collected here
            replay.add(valid transitions of groups)    # the buffer grows with the policy's experience
            learner.step(groups) -> weights v+1        # GRPO, group-relative advantages
            sync(weights v+1 -> every policy engine)   # the next rollouts sample from v+1
            curriculum.step(groups)                    # reward variance V_tau per task, task generation
            tasks = curriculum.select()                # ``launch`` of t+1 (before the learner step when
                                                       # ``train.max_staleness >= 1``)
        """
        st, log = self.state, IterationLog(self.state)
        got = self.collect_groups(launched, log)
        learnable, fresh = got.learnable, got.fresh
        if launched.phase == "synthetic":
            self.guard_simulator(log)
        nxt = self.launch(launched.iteration + 1) if self.overlaps_next(launched.iteration + 1) else None
        with log.timed("replay"):
            try:
                added = self.a.replay.add([tr for t in learnable for tr in t.transitions],
                                          iteration=launched.iteration)
            except ReplayTimeoutError as e:  # a shard stuck or not back in time: like a dead learner
                raise self.fault(str(e)) from None
        with self.engines_asleep(log) as asleep:
            with log.timed("learner"):
                lm = self.remote(self.a.learner.step.remote(fresh), "the learner step")
            sync: dict[str, Any] = {}
            if not lm.get("skipped"):
                st.learner_steps += 1
                if asleep:  # the sync writes into the engines' weight memory: wake it first, the KV cache after
                    self.wake_engines(log, ["weights"])
                with log.timed("sync"):
                    sync = self.remote(self.a.learner.sync.remote(self.a.engines), f"the weight sync of "
                                       f"v{int(lm['version'])} to {len(self.a.engines)} policy engine(s)")
        # Earlier rounds were recorded as they ended.
        cm = self.remote(self.a.curriculum.step.remote(got.unrecorded), "the curriculum step", "curriculum")
        st.iteration = launched.iteration + 1
        log.note(learner=lm, sync=sync, replay=added.to_dict(),
                 curriculum={k: v for k, v in cm.items() if not isinstance(v, list)})
        self.end_iteration(log, cm)
        if nxt is None and self.can_launch(st.iteration):
            nxt = self.launch(st.iteration)
        return nxt

    def guard_simulator(self, log: IterationLog) -> None:
        """Stop the run, before the learner sees this iteration's groups, when the simulator went bad
        (``dreamgym.guard``): the last checkpoint stays the run's latest, and the message says what was seen."""
        verdict = self.guard.observe(log.fields["rollout"])
        log.note(guard=verdict.to_dict())
        if not verdict.tripped:
            return
        self.record("guard", self.state.iteration, **verdict.to_dict())
        self.progress.line(self.state.iteration + 1, "guard", "; ".join(verdict.reasons))
        if latest_run_checkpoint(self.run_dir) is None:
            self.checkpoint()
        raise SimulatorCollapsedError(verdict.message())

    def overlaps_next(self, iteration: int) -> bool:
        """Bounded staleness: with ``train.max_staleness >= 1`` the rollouts of ``t+1`` sample while the
        learner steps on ``t``'s groups."""
        return self.cfg.train.max_staleness >= 1 and self.can_launch(iteration)

    def collect_groups(self, launched: Launched, log: IterationLog) -> Gathered:
        """The learnable part of the iteration's trajectories (``learnable_part``: what the replay buffer and the
        learner may take), its GRPO groups, and the groups fresh enough to learn from.

        With ``train.resample`` on, an iteration whose groups fall short of ``min_mixed_groups`` with reward
        variance runs further rounds of curriculum tasks (the curriculum records each finished round first, so
        that selection moves past the tasks whose groups all earned the same reward)."""
        st, phase, n = self.state, launched.phase, self.cfg.learner.group_size
        want, extra = self.cfg.train.resample.min_mixed_groups, self.cfg.train.resample.rounds(phase)
        calls, started, tasks = launched.calls, launched.started, list(launched.tasks)
        learnable: list[Trajectory] = []
        groups: list[Group] = []
        unrecorded: list[Group] = []
        stats: list[dict[str, Any]] = []
        left_out = skipped = 0
        for rnd in range(extra + 1):
            got = self.collect(calls, launched.iteration + 1, phase)
            trajs, s = got.trajectories, got.stats
            log.add(phase, time.perf_counter() - started, int(s["episodes"]), int(s["steps"]))
            if phase == "real":
                st.real_transitions += int(s["steps"])
            else:
                st.synthetic_transitions += int(s["steps"])
                st.invalid_transitions += int(s["invalid_transitions"])
            st.real_resets = max(st.real_resets, int(s["real_resets"]))
            stats.append(s)
            self.progress.rollouts(launched.iteration + 1, phase, s, st.real_transitions, self.cfg.train.real_budget)
            kept = [p for p in (learnable_part(t, self.cfg.train.invalid_episodes) for t in trajs) if p is not None]
            got_groups, small = group_trajectories(kept, min_size=1 if self.cfg.learner.algorithm == "ppo" else 2)
            learnable += kept
            groups += got_groups
            unrecorded = got_groups
            left_out += len(trajs) - len(kept) + small
            mixed = int(group_stats(groups)["mixed_groups"])
            spent = phase == "real" and not self.schedule.budget_left(st.real_transitions)
            if mixed >= want or rnd == extra or spent:
                break
            self.remote(self.a.curriculum.update.remote(got_groups), "the curriculum's recording", "curriculum")
            unrecorded = []
            more, n_skipped = self.schedule.trainable_tasks(
                self.remote(self.a.curriculum.select.remote(), "the curriculum's task selection", "curriculum"), phase)
            if not more:
                break
            self.progress.line(launched.iteration + 1, phase,
                               f"{mixed} group(s) with reward variance, {want} wanted: round {rnd + 2} of "
                               f"{extra + 1}, {len(more)} more tasks (train.resample)")
            skipped += n_skipped
            tasks += more
            started = time.perf_counter()
            seed = launched.iteration + RESAMPLE_SEED_STRIDE * (rnd + 1)
            calls = self.rollouts(repeat_tasks(more, n), phase, seed=seed)
        merged = merge_rounds(stats)
        if phase == "synthetic":  # what the rules settled, how the model's own first replies fared
            merged.update(counts_from(merged).rule_shares())
        version = int(self.remote(self.a.learner.version.remote(), "asking the learner its weight version"))
        fresh, stale = split_stale(groups, version, self.cfg.train.max_staleness)
        log.note(phase=phase, rollout=merged, groups=group_stats(groups), stale_groups=len(stale), left_out=left_out,
                 rollout_seconds=log.seconds[phase], rounds=len(stats),
                 skipped_llm_tasks=launched.skipped_llm_tasks + skipped, tasks=[t.task_id for t in tasks])
        return Gathered(learnable, fresh, unrecorded)

    def end_iteration(self, log: IterationLog, curriculum: dict[str, Any]) -> None:
        """The iteration's status line and metrics record; then evaluation and checkpoint when they are due."""
        st, t, r = self.state, self.cfg.train, log.fields
        lm, sync, gs = r["learner"], r["sync"], r["groups"]
        self.progress.line(st.iteration, "learner",
                           f"{int(gs['groups'])} groups ({int(gs['mixed_groups'])} with reward variance, "
                           f"{r['stale_groups']} stale, {r['left_out']} invalid episodes left out) | loss "
                           f"{lm.get('loss', 0):.4f} {lm.get('tokens_per_s', 0):.0f} tok/s {lm.get('seconds', 0):.0f} s"
                           f" | weights v{int(lm['version'])} synced in {sync.get('seconds', 0):.1f} s | "
                           f"pool {curriculum.get('pool_size')}")
        self.record("iteration", st.iteration, **log.record(), real_transitions=st.real_transitions,
                    synthetic_transitions=st.synthetic_transitions)
        if t.eval.every and st.iteration % t.eval.every == 0 and st.iteration < t.iterations:
            self.evaluate(f"iteration {st.iteration}")
        if t.checkpoint_every and st.iteration % t.checkpoint_every == 0:
            self.checkpoint()

    def execute(self) -> dict[str, Any]:
        cfg, st = self.cfg, self.state
        st.sessions += 1
        where = connect(cfg.ray)
        if self.stop_on_sigterm:
            stop_on_sigterm()
        self.say(f"run directory {self.run_dir} ({where}); mode {cfg.train.mode}, "
                 f"{'resuming at iteration ' + str(st.iteration) if self.resumed_from else 'fresh start'}")
        self.sinks = MetricSinks(self.run_dir, cfg.train.report.tensorboard, cfg.model_dump(mode="json"),
                                 resume=self.resumed_from is not None)
        if self.after_fault is not None:
            self.say(f"automatic resume (train.auto_resume) after: {self.after_fault}", "resume")
            self.record("auto_resume", st.iteration, after=self.after_fault, sessions=st.sessions,
                        checkpoint=str(self.resumed_from) if self.resumed_from else None)
        check_resources(cfg)  # before any work: a run that cannot place its actors fails now
        check_run_dir(cfg, self.run_dir, self.say)  # and one whose run directory some node cannot see
        t0 = time.perf_counter()
        offline = offline_data(cfg, self.run_dir, self.say)
        if not st.offline_transitions and offline is not None:
            from dreamgym.data.transitions import open_transitions

            st.offline_transitions = int(open_transitions(offline).metadata.num_rows)
        if (cfg.train.experience_sft and self.schedule.uses_synthetic and cfg.experience_model.backend == "ray"
                and offline is not None):
            t1 = time.perf_counter()
            cfg.experience_model.model = str(experience_sft(cfg, offline, self.run_dir, self.say))
            st.add_phase("experience_sft", time.perf_counter() - t1)
            t0 += time.perf_counter() - t1
        gold = None
        if cfg.train.warm_start.method == "sft" and not st.warm_started:
            gold = gold_for_warm_start(cfg, offline, self.run_dir)
        curriculum_state = None
        if self.resumed_from is not None:
            _, curriculum_state = load_driver_state(self.resumed_from)
        try:
            self.a = start_actors(cfg, self.run_dir, offline, self.resumed_from, curriculum_state, self.say)
        except (ActorDiedStartingError, ray.exceptions.RayActorError) as e:
            # An actor killed while the actors start (a soak found it: a replica killed during an automatic
            # resume) is a fault like a death mid-run: recorded, and train.auto_resume starts the session again.
            raise self.fault(f"an actor died while the run's actors started ({type(e).__name__}: {e})") from None
        if cfg.train.seed_replay and not st.replay_seeded and offline is not None:
            rep = seed_replay(self.a.replay, offline, cfg.replay.write_batch_size)
            st.replay_seeded = True
            self.say(f"replay buffer seeded: {rep['stored']} real transitions stored ({rep['duplicates']} "
                     f"duplicates) in {rep['seconds']:.1f} s")
            self.record("replay_seed", st.iteration, **rep)
        if not self.eval_tasks and cfg.train.eval.enabled:
            t = cfg.train
            self.eval_tasks = self.remote(self.a.workers[0].tasks.remote(t.eval.tasks, t.eval.first_seed, t.eval.split),
                                          "the held-out tasks", "worker")
            st.eval_tasks = [x.to_dict() for x in self.eval_tasks]
        st.add_phase("setup", time.perf_counter() - t0)
        if gold is not None:
            t0 = time.perf_counter()
            with self.engines_asleep(IterationLog(st)):  # cloning steps the learner as RL does
                warm_start(cfg, self.a, gold, lambda m: self.say(m, "warm-start"),
                           lambda m: self.record("warm_start", 0, **m), get=self.remote)
            st.warm_started = True
            st.add_phase("warm_start", time.perf_counter() - t0)
        if self.a.learner is not None and int(self.remote(self.a.learner.version.remote(),
                                                          "asking the learner its weight version")) > 0:
            t0 = time.perf_counter()  # resumed or warm-started weights
            rep = self.remote(self.a.learner.sync.remote(self.a.engines), "the weight sync to the policy engines")
            st.add_phase("sync", time.perf_counter() - t0)
            self.say(f"engines serve weights v{rep['version']} ({rep['seconds']:.1f} s)", "sync")
        if cfg.train.eval.at_start and not st.evals:
            self.evaluate("start")
        launched = self.launch(st.iteration) if self.can_launch(st.iteration) else None
        while launched is not None:
            launched = self.iterate(launched)
        if not self.schedule.budget_left(st.real_transitions):
            self.say(f"real-transition budget spent ({st.real_transitions}/{cfg.train.real_budget})", "s2r")
        if cfg.train.eval.enabled and (not st.evals or st.evals[-1]["iteration"] != st.iteration):
            self.evaluate("final")
        st.wall_seconds += time.time() - self.t_session
        self.t_session = time.time()
        final = checkpoint_dir(self.run_dir, st.iteration)
        if (final / "learner.json").is_file():  # the learner is saved at this iteration: refresh the counters
            save_driver_state(final, st, self.remote(self.a.curriculum.state_dict.remote(), "the curriculum's state",
                                                     "curriculum"))
        else:
            self.checkpoint()
        summary = self.summary()
        write_json_atomic(self.run_dir / "summary.json", summary)
        self.record("summary", st.iteration, **{k: v for k, v in summary.items() if not isinstance(v, list | dict)})
        return summary

    def summary(self) -> dict[str, Any]:
        st = self.state
        last = st.evals[-1] if st.evals else {}
        # Only an evaluation before the first iteration is a start figure (``train.eval.at_start``); without one the
        # first evaluation is the final one, and calling it the start would show a change of exactly zero.
        first = next((e for e in st.evals if e.get("label") == "start"), {})
        return {"run_dir": str(self.run_dir), "mode": self.cfg.train.mode, "iterations": st.iteration,
                "learner_steps": st.learner_steps, "real_transitions": st.real_transitions,
                "synthetic_transitions": st.synthetic_transitions, "invalid_transitions": st.invalid_transitions,
                "eval_transitions": st.eval_transitions, "offline_transitions": st.offline_transitions,
                "success_start": first.get("success_rate"), "success_final": last.get("success_rate"),
                "reward_final": last.get("mean_reward"),
                "baseline_success": (st.baseline or {}).get("success_rate"),
                "baseline_reward": (st.baseline or {}).get("mean_reward"),
                "wall_seconds": round(st.wall_seconds, 1), "phase_seconds": st.phase_seconds, "evals": st.evals,
                "simulator_rules": rule_figures([r for r in self.metrics.read() if r.get("event") == "iteration"])}

    def close(self) -> None:
        if self.sinks is not None:
            self.sinks.close()
        self.a.shutdown()


def prepare_run(cfg: DreamGymConfig | None, resume: str | Path | None,
                overrides: list[str] | None = None) -> tuple[DreamGymConfig, Path, TrainState, Path | None]:
    """A fresh run directory, or the resumed one with its config (plus ``overrides``) and state."""
    if resume is None:
        assert cfg is not None
        run_dir = create_run_dir(cfg, "train")
        return cfg, run_dir, TrainState(), None
    run_dir = Path(resume)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"--resume {run_dir}: not a run directory (no config.yaml)")
    cfg = load_config(run_dir / "config.yaml", overrides or None)
    save_config(cfg, run_dir / "config.yaml")
    ckpt = latest_run_checkpoint(run_dir)
    if ckpt is None:
        return cfg, run_dir, TrainState(), None  # killed before the first checkpoint: start over in place
    state, _ = load_driver_state(ckpt)
    return cfg, run_dir, state, ckpt


def run_train(cfg: DreamGymConfig | None = None, resume: str | Path | None = None,
              overrides: list[str] | None = None, stop_on_sigterm: bool = False) -> dict[str, Any]:
    """Run (or resume) training; returns the summary. Writes the report at the end. ``stop_on_sigterm``
    (the CLI): SIGTERM stops the run like Ctrl-C (``actors.cluster.stop_on_sigterm``)."""
    cfg, run_dir, state, ckpt = prepare_run(cfg, resume, overrides)
    fault: str | None = None
    for attempt in itertools.count():
        run = Run(cfg, run_dir, state, ckpt, stop_on_sigterm, after_fault=fault)
        try:
            summary = run.execute()
            break
        except TrainingFaultError as e:
            # Something died beyond its own restarts (learner, engine, worker): every actor starts again from
            # the last checkpoint; the replay buffer reopens its storage with what it acknowledged.
            if attempt >= cfg.train.auto_resume:
                raise
            fault = str(e)
        finally:
            run.close()
        cfg, run_dir, state, ckpt = prepare_run(None, run_dir)
    if cfg.train.report.markdown:
        from dreamgym.report import write_report

        summary["report"] = str(write_report(run_dir))
    return summary


__all__ = ["Collected", "Launched", "RolloutCall", "Run", "run_train"]
