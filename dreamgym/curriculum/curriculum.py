"""``Curriculum``: the task pool, reward-variance scoring, batch selection and task generation.

One iteration, as the driver runs it::

    batch = curriculum.select()          # tasks for this iteration's GRPO groups
    ...                                   # rollouts: one group of n trajectories per task
    curriculum.update(groups)            # V_tau of each task from its group's rewards
    metrics = curriculum.end_iteration()  # generation round (every generate_every), metrics, t += 1

Scoring and never-solved treatment: ``dreamgym.curriculum.scoring``. Selection with the ``lambda``
cap: ``dreamgym.curriculum.selection``. Generation: for the top-``V_tau`` parents, real parameter
variants checked in the real environment (``param_variants``) and text variants proposed ``m`` at a
time by the experience model, one of which a second call selects (``prompts``), each validated
(``grammar``). Every candidate ends as accepted or rejected with a recorded reason.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from dreamgym.curriculum.generator import GENERATOR_ERROR_PREFIX, TextGenerator
from dreamgym.curriculum.grammar import TaskGrammar, check_format, jaccard
from dreamgym.curriculum.param_variants import (
    CheckResult,
    ParamCandidate,
    checked_task,
    has_param_variants,
    propose_param_variants,
)
from dreamgym.curriculum.pool import TaskPool, TaskRecord
from dreamgym.curriculum.prompts import ASPECTS, parse_choice, parse_task_reply, propose_prompt, select_prompt
from dreamgym.curriculum.scoring import TaskWeights, variance_histogram
from dreamgym.curriculum.selection import SelectionRule, select_batch
from dreamgym.types import Group, Task

if TYPE_CHECKING:
    from dreamgym.config import CurriculumConfig

STATE_VERSION = 1

#: Reasons a generated candidate is rejected (the keys of ``rejected`` in the metrics).
REJECT_REASONS = (
    "generator_error",  # the backend refused the request
    "format",           # the reply is not one line of natural language of acceptable length
    "same_as_parent",   # the variant is the parent's instruction (or too close to it)
    "duplicate",        # the pool already has this task (same instruction/words, or same game)
    "grammar",          # outside the environment's task grammar (unknown words, off-topic)
    "env_refused",      # the real environment refused the parameters
    "env_error",        # the real environment failed on them
    "infeasible",       # no expert plan, or one longer than the step budget
    "not_selected",     # valid, but the selection step picked another candidate
    "pool_full",        # max_generated reached
)


@dataclass
class GenerationOutcome:
    """What happened to one generated candidate."""

    iteration: int
    parent: str
    kind: str
    """``param`` or ``llm``."""
    text: str
    """The raw reply (``llm``) or the change (``param``)."""
    accepted: bool
    reason: str = ""
    """Empty when accepted, else one of ``REJECT_REASONS``."""
    detail: str = ""
    task_id: str | None = None


class Curriculum:
    """The curriculum over a pool of tasks (library class; ``actors/curriculum.py`` wraps it in Ray).

    ``generator`` proposes and selects text variants (``None``: no text variants). ``checker`` resets
    parameter variants in the real environment (``None``: no parameter variants). ``grammar`` holds
    the environment's vocabulary for text variants; ``world`` completes "an agent that acts in ..." in
    the generation prompts.
    """

    def __init__(
        self,
        cfg: CurriculumConfig,
        seed_tasks: Sequence[Task],
        *,
        generator: TextGenerator | None = None,
        checker: Callable[[Task], CheckResult] | None = None,
        grammar: TaskGrammar | None = None,
        world: str = "a text environment",
        seed: int = 0,
    ) -> None:
        if not seed_tasks:
            raise ValueError("the curriculum needs at least one seed task")
        self.cfg = cfg
        self.generator = generator
        self.checker = checker
        self.grammar = grammar if grammar is not None else TaskGrammar(min_known=cfg.min_known_words)
        self.grammar.extend(t.instruction for t in seed_tasks)
        self.world = world
        self.weights = TaskWeights(cfg.score_decay, cfg.min_weight, cfg.unsolved_after, cfg.unsolved_weight)
        self.rule = SelectionRule(cfg.generated_fraction, cfg.min_seed_tasks, cfg.explore_fraction,
                                  cfg.strategy, cfg.sharpness)
        self.rng = random.Random(cfg.seed if cfg.seed is not None else seed)
        self.pool = TaskPool(cfg.history_per_task)
        for t in seed_tasks:
            self.pool.add(TaskRecord(t if t.origin == "seed" and not t.kind else _as_seed(t)))
        self.iteration = 0
        self.log: deque[GenerationOutcome] = deque(maxlen=cfg.log_size)
        self._reset_counters()

    # -- scores ----------------------------------------------------------------------------------
    def weight(self, rec: TaskRecord) -> float:
        """Selection weight of a tried task (``TaskWeights``)."""
        last = rec.last_iteration
        age = 0 if last is None else self.iteration - last - 1
        return self.weights.weight(rec.variance, age, rec.groups, rec.successes)

    def never_solved(self, rec: TaskRecord) -> bool:
        return self.weights.never_solved(rec.groups, rec.successes)

    # -- selection -------------------------------------------------------------------------------
    def select(self, batch_size: int | None = None) -> list[Task]:
        """The tasks of this iteration (see ``selection``); at most ``lambda`` of them generated."""
        b = batch_size or self.cfg.tasks_per_iteration
        chosen = select_batch(self.pool.records(), b, self.weight, self.rule, self.rng)
        n_gen = sum(r.generated for r in chosen)
        cap = self.rule.generated_cap(b)
        if n_gen > cap:  # selection guarantees this; the check keeps the guarantee explicit
            raise AssertionError(f"selection broke the lambda cap: {n_gen} generated > {cap}")
        for r in chosen:
            r.selected += 1
        c = self._counters
        c["batches"] += 1
        c["selected"] += len(chosen)
        c["selected_generated"] += n_gen
        c["selected_untried"] += sum(not r.tried for r in chosen)
        c["generated_cap"] = cap
        tried = [r.variance for r in chosen if r.tried]
        c["selected_variance_sum"] += sum(tried)
        c["selected_tried"] += len(tried)
        self._selected_ids.extend(r.task_id for r in chosen)
        return [r.task for r in chosen]

    # -- rewards ---------------------------------------------------------------------------------
    def update(self, groups: Sequence[Group]) -> None:
        """Record each group's rewards (and successes) as its task's result of this iteration."""
        for g in groups:
            self.record(g.task.task_id, g.rewards, successes=sum(t.success for t in g.trajectories))

    def record(self, task_id: str, rewards: Sequence[float], successes: int | None = None) -> float:
        """Record one group of ``rewards`` for ``task_id``; returns its ``V_tau``. Without
        ``successes``, rollouts whose reward reaches ``success_reward`` count as successes."""
        if successes is None:
            successes = sum(r >= self.cfg.success_reward for r in rewards)
        group = self.pool.record_group(task_id, self.iteration, rewards, successes)
        self._counters["groups"] += 1
        self._counters["group_variance_sum"] += group.variance
        return group.variance

    # -- generation ------------------------------------------------------------------------------
    def parents(self) -> list[TaskRecord]:
        """Generation parents: tried tasks that are not never-solved, whose latest ``V_tau`` is at
        least ``min_parent_variance`` and that have fewer than ``max_children`` variants, best first."""
        cands = [r for r in self.pool if r.tried and not self.never_solved(r)
                 and r.variance >= self.cfg.min_parent_variance and r.children < self.cfg.max_children]
        cands.sort(key=self.weight, reverse=True)
        return cands[: self.cfg.parents_per_iteration]

    def generate(self) -> list[Task]:
        """One generation round; returns the accepted tasks (already in the pool)."""
        self._counters["generation_rounds"] += 1
        if self.pool.count(generated=True) >= self.cfg.max_generated:
            self._counters["generation_skipped_pool_full"] += 1
            return []
        parents = self.parents()
        accepted: list[Task] = []
        if self.checker is not None and self.cfg.param_variants > 0:
            for p in parents:
                if p.task.kind != "llm" and has_param_variants(p.task.env):
                    accepted += self._param_round(p)
        if self.generator is not None and self.cfg.llm_variants > 0 and parents:
            accepted += self._llm_round(parents)
        return accepted

    def _param_round(self, parent: TaskRecord) -> list[Task]:
        assert self.checker is not None
        variations = getattr(self.checker, "variations", None)
        cands = propose_param_variants(parent.task, self.cfg.param_variants, self.rng, variations)
        valid: list[tuple[ParamCandidate, CheckResult]] = []
        seen: set[str] = set()
        for c in cands:
            self._counters["attempts_param"] += 1
            if self.pool.has_params(c.task) or c.task.task_id in self.pool or c.task.task_id in seen:
                self._reject(parent, "param", c.change, "duplicate", "the pool already has this game")
                continue
            seen.add(c.task.task_id)
            res = self.checker(c.task)
            if not res.ok:
                self._reject(parent, "param", c.change, res.reason, res.detail)
                continue
            valid.append((c, res))
        if not valid:
            return []
        # Harder but feasible: the first harder candidate in (RNG-restored) proposal order, else the first
        # new world. Not the expert plan's length: TextWorldExpress draws a new plan on every request.
        best = min(range(len(valid)), key=lambda i: (not valid[i][0].harder, i))
        for i, (c, _res) in enumerate(valid):
            if i != best:
                self._reject(parent, "param", c.change, "not_selected",
                             f"another candidate was selected ({valid[best][0].change})")
        c, res = valid[best]
        task = checked_task(c, res)
        detail = f"expert plan {res.expert_steps} steps" if res.expert_steps is not None else ""
        return [task] if self._accept(parent, task, c.change, detail) else []

    def _llm_round(self, parents: Sequence[TaskRecord]) -> list[Task]:
        assert self.generator is not None
        m = self.cfg.llm_variants
        lo, hi = self.cfg.instruction_chars
        prompts, owners = [], []
        for p in parents:
            examples = [i for i in self.pool.instructions(p.task.env) if i != p.task.instruction][:3]
            for k in range(m):
                prompts.append(propose_prompt(p.task.env, self.world, p.task.instruction, examples,
                                              ASPECTS[k % len(ASPECTS)]))
                owners.append(p)
        replies = self.generator(prompts, temperature=self.cfg.generation_temperature,
                                 max_tokens=self.cfg.generation_max_tokens)
        if len(replies) != len(prompts):
            raise RuntimeError(f"the text generator answered {len(replies)} of {len(prompts)} prompts")
        valid: dict[str, list[tuple[str, str]]] = {}
        for p, reply in zip(owners, replies, strict=True):
            self._counters["attempts_llm"] += 1
            if reply.startswith(GENERATOR_ERROR_PREFIX):
                self._reject(p, "llm", reply, "generator_error", reply[len(GENERATOR_ERROR_PREFIX):])
                continue
            text, why = parse_task_reply(reply)
            why = why or check_format(text or "", lo, hi) or ""
            if why:
                self._reject(p, "llm", reply, "format", why)
                continue
            assert text is not None
            reason, detail = self._check_text(text, p, [t for t, _ in valid.get(p.task_id, [])])
            if reason:
                self._reject(p, "llm", reply, reason, detail)
                continue
            valid.setdefault(p.task_id, []).append((text, reply))
        # Step 2: the model selects one candidate per parent.
        multi = [pid for pid, c in valid.items() if len(c) > 1]
        choices: dict[str, int] = {}
        if multi:
            sel_prompts = [select_prompt(self.pool.get(pid).task.env, self.world,
                                         self.pool.get(pid).task.instruction, [t for t, _ in valid[pid]])
                           for pid in multi]
            sel_replies = self.generator(sel_prompts, temperature=0.0, max_tokens=16)
            for pid, reply in zip(multi, sel_replies, strict=True):
                k = parse_choice(reply, len(valid[pid]))
                if k is None:  # fallback: the candidate least similar to its parent
                    self._counters["selection_fallback"] += 1
                    parent_text = self.pool.get(pid).task.instruction
                    k = min(range(len(valid[pid])), key=lambda i: jaccard(valid[pid][i][0], parent_text))
                choices[pid] = k
        accepted = []
        for pid, cands in valid.items():
            parent = self.pool.get(pid)
            k = choices.get(pid, 0)
            for i, (_, reply) in enumerate(cands):
                if i != k:
                    self._reject(parent, "llm", reply, "not_selected", "the selection step chose another candidate")
            text, reply = cands[k]
            digest = hashlib.sha1(text.encode()).hexdigest()[:10]
            task = Task(task_id=f"{pid}#llm-{digest}", env=parent.task.env, instruction=text,
                        params=dict(parent.task.params), origin="generated", kind="llm")
            if self._accept(parent, task, reply, ""):
                accepted.append(task)
        return accepted

    def _check_text(self, text: str, parent: TaskRecord, same_round: Sequence[str]) -> tuple[str, str]:
        """``(reason, detail)`` of a rejected text variant, ``('', '')`` if it passes."""
        thr = self.cfg.duplicate_similarity
        if jaccard(text, parent.task.instruction) >= thr:
            return "same_as_parent", f"word overlap {jaccard(text, parent.task.instruction):.2f} with its parent"
        owner = self.pool.instruction_owner(text)
        if owner is not None:
            return "duplicate", f"same instruction as {owner}"
        for other in [*same_round, *self.pool.instructions(parent.task.env)]:
            sim = jaccard(text, other)
            if sim >= thr:
                return "duplicate", f"word overlap {sim:.2f} with {other[:80]!r}"
        why = self.grammar.check(text, parent.task)
        if why:
            return "grammar", why
        return "", ""

    def _accept(self, parent: TaskRecord, task: Task, text: str, detail: str) -> bool:
        if self.pool.count(generated=True) >= self.cfg.max_generated:
            self._reject(parent, task.kind, text, "pool_full", f"max_generated={self.cfg.max_generated}")
            return False
        if task.task_id in self.pool:
            self._reject(parent, task.kind, text, "duplicate", f"task id {task.task_id} is in the pool")
            return False
        self.pool.add(TaskRecord(task, added_iteration=self.iteration, parent=parent.task_id,
                                 change=text if task.kind == "param" else "text variant"))
        parent.children += 1
        if task.kind == "param":  # the real environment's own words belong to its grammar
            self.grammar.extend([task.instruction])
        self._counters[f"accepted_{task.kind}"] += 1
        self._generated_ids.append(task.task_id)
        self.log.append(GenerationOutcome(self.iteration, parent.task_id, task.kind, text, True, "", detail,
                                          task.task_id))
        return True

    def _reject(self, parent: TaskRecord, kind: str, text: str, reason: str, detail: str) -> None:
        assert reason in REJECT_REASONS, reason
        self._rejected[reason] += 1
        self._rejected_by_kind[f"{kind}:{reason}"] += 1
        self.log.append(GenerationOutcome(self.iteration, parent.task_id, kind, text[:500], False, reason,
                                          detail[:500]))

    # -- iterations and metrics ------------------------------------------------------------------
    def end_iteration(self) -> dict[str, Any]:
        """Run the generation round if due, return this iteration's metrics and start the next one."""
        every = self.cfg.generate_every
        if every and (self.iteration + 1) % every == 0:
            self.generate()
        out = self.metrics()
        self.iteration += 1
        self._reset_counters()
        return out

    def step(self, groups: Sequence[Group]) -> dict[str, Any]:
        """``update(groups)`` then ``end_iteration()``."""
        self.update(groups)
        return self.end_iteration()

    def metrics(self) -> dict[str, Any]:
        """Metrics of the current iteration so far (pool, selection, scores, generation)."""
        c = self._counters
        recs = self.pool.records()
        tried = [r for r in recs if r.tried]
        n_gen = sum(r.generated for r in recs)
        attempts = c["attempts_param"] + c["attempts_llm"]
        accepted = c["accepted_param"] + c["accepted_llm"]
        return {
            "iteration": self.iteration,
            "pool_size": len(recs),
            "pool_seed": len(recs) - n_gen,
            "pool_generated": n_gen,
            "pool_generated_param": sum(r.task.kind == "param" for r in recs),
            "pool_generated_llm": sum(r.task.kind == "llm" for r in recs),
            "share_generated_pool": n_gen / len(recs),
            "pool_tried": len(tried),
            "pool_never_solved": sum(self.never_solved(r) for r in tried),
            "pool_mean_variance": sum(r.variance for r in tried) / len(tried) if tried else 0.0,
            "variance_histogram": variance_histogram([r.variance for r in tried]),
            "selected": c["selected"],
            "selected_generated": c["selected_generated"],
            "share_generated_selected": c["selected_generated"] / c["selected"] if c["selected"] else 0.0,
            "generated_cap": c["generated_cap"],
            "selected_untried": c["selected_untried"],
            "selected_mean_variance": c["selected_variance_sum"] / c["selected_tried"] if c["selected_tried"] else 0.0,
            "selected_task_ids": list(self._selected_ids),
            "groups": c["groups"],
            "group_mean_variance": c["group_variance_sum"] / c["groups"] if c["groups"] else 0.0,
            "generation_rounds": c["generation_rounds"],
            "generation_attempts": attempts,
            "generation_attempts_param": c["attempts_param"],
            "generation_attempts_llm": c["attempts_llm"],
            "generation_accepted": accepted,
            "generation_accepted_param": c["accepted_param"],
            "generation_accepted_llm": c["accepted_llm"],
            "generation_rejected": sum(self._rejected.values()),
            "rejected": dict(self._rejected),
            "rejected_by_kind": dict(self._rejected_by_kind),
            "selection_fallback": c["selection_fallback"],
            "generation_skipped_pool_full": c["generation_skipped_pool_full"],
            "generated_task_ids": list(self._generated_ids),
        }

    def _reset_counters(self) -> None:
        self._counters: Counter[str] = Counter()
        self._rejected: Counter[str] = Counter()
        self._rejected_by_kind: Counter[str] = Counter()
        self._selected_ids: list[str] = []
        self._generated_ids: list[str] = []

    def outcomes(self, last: int | None = None) -> list[dict[str, Any]]:
        """The latest generation outcomes (accepted and rejected, with reasons), oldest first."""
        items = list(self.log)
        return [asdict(o) for o in (items[-last:] if last else items)]

    # -- resume ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly: the pool with histories, the iteration, the sampling
        RNG, this iteration's counters and the generation log. JSON-serialisable."""
        version, internal, gauss = self.rng.getstate()
        return {
            "version": STATE_VERSION,
            "iteration": self.iteration,
            "pool": self.pool.state_dict(),
            "rng": [version, list(internal), gauss],
            "counters": {"counters": dict(self._counters), "rejected": dict(self._rejected),
                         "rejected_by_kind": dict(self._rejected_by_kind),
                         "selected_ids": list(self._selected_ids), "generated_ids": list(self._generated_ids)},
            "log": [asdict(o) for o in self.log],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"curriculum state version {state.get('version')!r} is not {STATE_VERSION}")
        self.iteration = int(state["iteration"])
        self.pool = TaskPool.from_state_dict(state["pool"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        c = state["counters"]
        self._counters = Counter(c["counters"])
        self._rejected = Counter(c["rejected"])
        self._rejected_by_kind = Counter(c["rejected_by_kind"])
        self._selected_ids = list(c["selected_ids"])
        self._generated_ids = list(c["generated_ids"])
        self.log = deque((GenerationOutcome(**o) for o in state["log"]), maxlen=self.cfg.log_size)
        self.grammar.extend(r.task.instruction for r in self.pool if r.task.kind != "llm")


def _as_seed(task: Task) -> Task:
    return replace(task, origin="seed", kind="")
