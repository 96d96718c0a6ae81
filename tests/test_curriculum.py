"""The curriculum library: V_tau, selection with the lambda cap, never-solved tasks, text variants
through the experience model's client seam (a scripted ``FunctionClient``), task files, resume."""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

import pytest

from dreamgym.config import CurriculumConfig, load_config
from dreamgym.curriculum import REJECT_REASONS, ClientTextGenerator, Curriculum, reward_variance
from dreamgym.curriculum.grammar import TaskGrammar
from dreamgym.curriculum.prompts import parse_choice, parse_task_reply
from dreamgym.curriculum.taskfile import load_task_file
from dreamgym.errors import ConfigError
from dreamgym.experience.client import FunctionClient
from dreamgym.types import Group, Task, Trajectory

COIN = "Your task is to search the environment and find the coin. Once you find the coin, take it."


def _tasks(n: int, env: str = "twx:coin") -> list[Task]:
    return [Task(f"t{i}", env, COIN, {"seed": i, "split": "train"}) for i in range(n)]


def _group(task: Task, rewards: list[float]) -> Group:
    return Group(task, [Trajectory(task, [], success=r >= 1.0, total_reward=r) for r in rewards])


class ScriptedPolicy:
    """Succeeds on task ``t`` with known probability ``p[t]`` (generated tasks inherit a parent's p,
    shifted down a little: harder)."""

    def __init__(self, p: dict[str, float], seed: int = 0) -> None:
        self.p = dict(p)
        self.rng = random.Random(seed)

    def prob(self, task_id: str) -> float:
        if task_id not in self.p:
            parent = task_id.split("#")[0]
            self.p[task_id] = max(0.0, self.prob(parent) - 0.1)
        return self.p[task_id]

    def group(self, task: Task, n: int) -> Group:
        return _group(task, [float(self.rng.random() < self.prob(task.task_id)) for _ in range(n)])


def _scripted_client(replies: list[str], choice: str = "Choice: 1") -> FunctionClient:
    """An experience model that answers proposal ``k`` of each parent with ``replies[k]``."""
    from dreamgym.curriculum.prompts import ASPECTS

    def fn(messages: list[dict[str, str]], sampling: object) -> str:
        text = messages[-1]["content"]
        if "Candidate new tasks" in text:
            return choice
        k = next(i for i, a in enumerate(ASPECTS) if a in text)
        return replies[k % len(replies)]

    return FunctionClient(fn)


VOCAB = {"search", "environment", "find", "coin", "take", "kitchen", "pantry", "fridge", "open", "room",
         "rooms", "corridor", "bring", "door", "doors", "table"}


def test_reward_variance_is_population_variance() -> None:
    assert reward_variance([0, 1]) == 0.25
    assert reward_variance([1, 1, 1, 1]) == 0.0
    assert reward_variance([0, 1, 1, 1]) == pytest.approx(0.1875)
    assert reward_variance([0.5]) == 0.0


def test_selection_concentrates_on_tasks_near_half() -> None:
    """Scripted policy, p known per task: after exploring, selected tasks sit near p = 0.5."""
    n_tasks, group_size = 40, 16
    p = {f"t{i}": i / (n_tasks - 1) for i in range(n_tasks)}
    cfg = CurriculumConfig(tasks_per_iteration=8, generate_every=0, seed=0)
    cur = Curriculum(cfg, _tasks(n_tasks))
    policy = ScriptedPolicy(p, seed=1)
    picked: list[float] = []
    for it in range(40):
        batch = cur.select()
        assert len(batch) == 8 and len({t.task_id for t in batch}) == 8
        if it >= 10:
            picked += [abs(p[t.task_id] - 0.5) for t in batch]
        cur.update([policy.group(t, group_size) for t in batch])
        cur.end_iteration()
    pool_mean = sum(abs(v - 0.5) for v in p.values()) / n_tasks
    selected_mean = sum(picked) / len(picked)
    print(f"mean |p-0.5|: pool {pool_mean:.3f}, selected {selected_mean:.3f}")
    assert pool_mean == pytest.approx(0.256, abs=1e-3)
    assert selected_mean < 0.6 * pool_mean  # measured 0.083 (0.32x) with the default strategy
    # every task was explored once before preference took over
    assert all(r.tried for r in cur.pool)


def test_untried_tasks_first_and_stale_scores_decay() -> None:
    cfg = CurriculumConfig(tasks_per_iteration=4, explore_fraction=0.5, score_decay=0.5, generate_every=0)
    cur = Curriculum(cfg, _tasks(10))
    first = cur.select()
    assert [t.task_id for t in first] == ["t0", "t1", "t2", "t3"]  # nothing tried: all explore, pool order
    for t in first:
        cur.record(t.task_id, [0, 1, 0, 1])
    cur.end_iteration()
    second = [t.task_id for t in cur.select()]
    assert second[:2] == ["t4", "t5"]  # explore_fraction 0.5 of 4 slots
    rec = cur.pool.get("t0")
    w_fresh = cur.weight(rec)
    assert w_fresh == pytest.approx(0.25)
    cur.end_iteration()
    cur.end_iteration()
    assert cur.weight(rec) == pytest.approx(0.25 * 0.5**2)


def test_never_solved_tasks_are_down_weighted_not_parents_and_recover() -> None:
    cfg = CurriculumConfig(tasks_per_iteration=4, unsolved_after=2, generate_every=0, min_parent_variance=0.01)
    cur = Curriculum(cfg, _tasks(3))
    partial = [0.0, 0.5, 0.25, 0.5]  # partial credit, never a success: V_tau > 0
    for _ in range(2):
        cur.record("t0", partial)
        cur.record("t1", [1, 1, 1, 1])  # always solved: V_tau = 0
        cur.record("t2", [0, 1, 0, 1])
        cur.end_iteration()
    t0, t1, t2 = (cur.pool.get(f"t{i}") for i in range(3))
    assert t0.variance > 0 and cur.never_solved(t0)
    assert cur.weight(t0) == pytest.approx(cfg.min_weight * cfg.unsolved_weight)
    assert cur.weight(t0) < cur.weight(t1) < cur.weight(t2)
    assert [r.task_id for r in cur.parents()] == ["t2"]
    assert cur.metrics()["pool_never_solved"] == 1
    # over many draws, the never-solved task is picked less often than the mastered one
    counts = {"t0": 0, "t1": 0}
    for _ in range(400):
        ids = [t.task_id for t in cur.select(2)]
        for k in counts:
            counts[k] += k in ids
    assert counts["t0"] < counts["t1"]
    cur.record("t0", [1, 0, 0, 0])  # one success clears the state
    assert not cur.never_solved(t0) and cur.weight(t0) > cfg.min_weight


ROOMS = ("kitchen", "pantry", "corridor", "bedroom", "garden")
OBJECTS = ("apple", "key", "ball", "book", "mug", "plate", "lamp", "sock", "shoe", "pen", "cup", "coin")
VOCAB |= {"bedroom", "garden", "box", "drawer", *OBJECTS}


def _variant_fn(messages: list[dict[str, str]], sampling: object) -> str:
    """A stateless scripted experience model: a valid variant chosen by a hash of the prompt."""
    text = messages[-1]["content"]
    if "Candidate new tasks" in text:
        return "Choice: 2"
    rng = random.Random(hashlib.sha1(text.encode()).hexdigest())
    room, obj, other = rng.choice(ROOMS), rng.choice(OBJECTS), rng.choice(OBJECTS)
    box = rng.choice(("fridge", "box", "drawer"))
    return f"Task: Search the {room} and find the {obj}, then open the {box} and take the {other}."


def _generating_curriculum(lam: float, batch: int, seed: int = 0) -> tuple[Curriculum, ScriptedPolicy]:
    """A curriculum whose experience model keeps proposing valid, distinct variants."""
    fn = _variant_fn
    cfg = CurriculumConfig(tasks_per_iteration=batch, generated_fraction=lam, llm_variants=2, param_variants=0,
                           min_parent_variance=0.0, max_children=50, seed=seed)
    cur = Curriculum(cfg, _tasks(12), generator=ClientTextGenerator(FunctionClient(fn)),
                     grammar=TaskGrammar(set(VOCAB)))
    policy = ScriptedPolicy({f"t{i}": i / 11 for i in range(12)}, seed=seed)
    return cur, policy


@pytest.mark.parametrize(("lam", "batch"), [(0.0, 6), (0.25, 8), (0.5, 5), (0.9, 4), (1.0, 6)])
def test_lambda_cap_always_holds(lam: float, batch: int) -> None:
    cur, policy = _generating_curriculum(lam, batch, seed=int(lam * 10) + batch)
    cap = min(int(lam * batch), batch - cur.cfg.min_seed_tasks)
    most = 0
    for _ in range(12):
        chosen = cur.select()
        n_gen = sum(t.origin == "generated" for t in chosen)
        most = max(most, n_gen)
        assert n_gen <= cap
        assert len(chosen) - n_gen >= cur.cfg.min_seed_tasks
        metrics = cur.step([policy.group(t, 8) for t in chosen])
        assert metrics["selected_generated"] <= metrics["generated_cap"] == cap
    assert cur.pool.count(generated=True) > cap  # generation outpaced the cap ...
    assert most == cap  # ... and the cap, not a lack of generated tasks, is what bounded the batches


def test_text_variants_validated_through_the_client_seam() -> None:
    replies = [
        "Task: Search the kitchen and the pantry, find the coin, then open the fridge and take the coin.",
        "Task: <<garbage>> {{x}}",
        f"Task: {COIN}",
        "Task: Buy a spaceship and fly to Mars with the coin quickly.",
    ]
    client = _scripted_client(replies, choice="Choice: 1")
    cfg = CurriculumConfig(tasks_per_iteration=2, llm_variants=4, param_variants=0, parents_per_iteration=1,
                           min_parent_variance=0.0)
    cur = Curriculum(cfg, _tasks(2), generator=ClientTextGenerator(client), grammar=TaskGrammar(set(VOCAB)))
    cur.record("t0", [0, 1, 0, 1])
    accepted = cur.generate()
    assert len(accepted) == 1
    task = accepted[0]
    assert task.origin == "generated" and task.kind == "llm" and task.params == {"seed": 0, "split": "train"}
    assert task.instruction.startswith("Search the kitchen") and task.task_id.startswith("t0#llm-")
    m = cur.metrics()
    assert m["generation_attempts_llm"] == 4 and m["generation_accepted_llm"] == 1
    assert m["rejected"] == {"format": 1, "same_as_parent": 1, "grammar": 1}
    assert m["generated_task_ids"] == [task.task_id]
    outs = cur.outcomes()
    assert len(outs) == 4 and all(o["accepted"] or o["reason"] in REJECT_REASONS for o in outs)
    grammar_detail = next(o["detail"] for o in outs if o["reason"] == "grammar")
    assert "spaceship" in grammar_detail
    # the same variant proposed again is a duplicate of the accepted one
    cur.record("t0", [0, 1, 0, 1])
    assert cur.generate() == []
    assert cur.metrics()["rejected"]["duplicate"] == 1


def test_selection_step_picks_and_falls_back() -> None:
    replies = [
        "Task: Search the kitchen and find the coin, then open the fridge.",
        "Task: Search the pantry and the corridor, find the coin and take it to the table.",
    ]
    cfg = CurriculumConfig(llm_variants=2, param_variants=0, parents_per_iteration=1, min_parent_variance=0.0)
    cur = Curriculum(cfg, _tasks(2), generator=ClientTextGenerator(_scripted_client(replies, "Choice: 2")),
                     grammar=TaskGrammar(set(VOCAB)))
    cur.record("t0", [0, 1])
    (task,) = cur.generate()
    assert "pantry" in task.instruction
    assert cur.metrics()["rejected"] == {"not_selected": 1}
    cur2 = Curriculum(cfg, _tasks(2), generator=ClientTextGenerator(_scripted_client(replies, "no idea")),
                      grammar=TaskGrammar(set(VOCAB)))
    cur2.record("t0", [0, 1])
    assert len(cur2.generate()) == 1 and cur2.metrics()["selection_fallback"] == 1


def test_reply_parsing() -> None:
    assert parse_task_reply("Sure!\nTask: Find the coin in the pantry.\n") == ("Find the coin in the pantry.", "")
    assert parse_task_reply('**Task:** "Open the door"')[0] == "Open the door"
    assert parse_task_reply("just one line")[0] == "just one line"
    assert parse_task_reply("two\nlines")[0] is None
    assert parse_choice("Choice: 3", 4) == 2
    assert parse_choice("I pick 2.", 4) == 1
    assert parse_choice("Choice: 9", 4) is None


def test_state_dict_round_trip_is_exact() -> None:
    cur, policy = _generating_curriculum(0.5, 6, seed=3)
    for _ in range(5):
        cur.step([policy.group(t, 8) for t in cur.select()])
    batch = cur.select()  # mid-iteration: counters are part of the state
    state = json.loads(json.dumps(cur.state_dict()))
    assert state["pool"]["records"] and cur.pool.count(generated=True) > 0

    restored, _ = _generating_curriculum(0.5, 6, seed=99)
    restored.load_state_dict(state)
    assert restored.state_dict() == cur.state_dict()
    assert restored.metrics() == cur.metrics()
    # both continue identically: same rewards in, same selections, generations and metrics out
    p2 = ScriptedPolicy(policy.p, seed=7)
    groups = [p2.group(t, 8) for t in batch]
    assert cur.step(groups) == restored.step(groups)
    for _ in range(3):
        a, b = cur.select(), restored.select()
        assert a == b
        groups = [p2.group(t, 8) for t in a]
        assert cur.step(groups) == restored.step(groups)
    assert restored.state_dict() == cur.state_dict()


def test_task_file_yaml_and_jsonl(tmp_path: Path) -> None:
    y = tmp_path / "tasks.yaml"
    y.write_text(
        "tasks:\n"
        "  - {instruction: 'Find the coin.', params: {seed: 3, numLocations: 4}}\n"
        "  - {task_id: big, instruction: 'Find the coin in a big house.', params: {seed: 4, numLocations: 8}}\n"
    )
    tasks = load_task_file(y, "twx:coin")
    assert [t.task_id for t in tasks] == ["twx:coin/file/0", "big"]
    assert tasks[0].params == {"seed": 3, "numLocations": 4} and tasks[0].origin == "seed"
    j = tmp_path / "tasks.jsonl"
    j.write_text(json.dumps({"instruction": "i need a red shirt", "params": {"goal": 7}}) + "\n\n"
                 + json.dumps({"instruction": "i want blue socks"}) + "\n")
    assert [t.instruction for t in load_task_file(j, "remote:webshop")] == ["i need a red shirt", "i want blue socks"]

    bad = {
        "unknown": ("[{instruction: x, colour: red, params: {seed: 1}}]", "unknown key(s) colour"),
        "empty": ("[{instruction: '  ', params: {seed: 1}}]", "'instruction' must be non-empty"),
        "env": ("[{instruction: x, env: 'twx:twc', params: {seed: 1}}]", "is not this run's environment"),
        "dup": ("[{task_id: a, instruction: x, params: {seed: 1}}, {task_id: a, instruction: y, params: {seed: 2}}]",
                "repeats"),
        "param": ("[{instruction: x, params: {seed: 1, numRooms: 3}}]", "no game parameter 'numRooms'"),
        "seed": ("[{instruction: x}]", "need a 'seed'"),
        "shape": ("{instruction: x}", "must hold a list of tasks"),
    }
    for name, (text, msg) in bad.items():
        f = tmp_path / f"{name}.yaml"
        f.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(msg)):
            load_task_file(f, "twx:coin")
    jl = tmp_path / "bad.jsonl"
    jl.write_text('{"instruction": "a"}\n{oops\n')
    with pytest.raises(ConfigError, match="line 2: not valid JSON"):
        load_task_file(jl, "remote:webshop")


def test_config_section_validates() -> None:
    cfg = load_config(overrides=["--curriculum.generated_fraction", "0.5", "--curriculum.tasks_per_iteration", "8"])
    assert cfg.curriculum.generated_fraction == 0.5
    with pytest.raises(ConfigError, match=r"curriculum\.generated_fraction"):
        load_config(overrides=["--curriculum.generated_fraction", "1.5"])
    with pytest.raises(ConfigError, match="min_seed_tasks"):
        load_config(overrides=["--curriculum.min_seed_tasks", "9", "--curriculum.tasks_per_iteration", "8"])
    with pytest.raises(ConfigError, match="valid keys here"):
        load_config(overrides=["--curriculum.lambda", "0.3"])


def test_cli_lists_and_validates_task_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dreamgym.cli import main

    f = tmp_path / "tasks.jsonl"
    f.write_text(json.dumps({"task_id": "shirt", "instruction": "i need a red shirt"}) + "\n")
    assert main(["tasks", "--env", "remote:webshop", "--task-file", str(f)]) == 0
    assert "shirt\ti need a red shirt" in capsys.readouterr().out
    f.write_text(json.dumps({"instruction": "i need a red shirt", "colour": "red"}) + "\n")
    assert main(["tasks", "--env", "remote:webshop", "--task-file", str(f)]) == 2
    assert "line 1: unknown key(s) colour" in capsys.readouterr().err
