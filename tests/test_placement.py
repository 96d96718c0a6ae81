"""The placement plan (``dreamgym.placement``), NCCL ranks, the dry run, and the plan on a Ray node with fake GPUs.

Issue 11's defects these catch: engines asking for GPUs again outside the colocated group (double
reservation), every engine getting NCCL rank offset 1, and ``check_resources`` rejecting a cluster at once
instead of asking the autoscaler and waiting within a bound.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dreamgym.config import load_config
from dreamgym.placement import NcclRanks, PlacementPlan, plan_placement

REPO = Path(__file__).resolve().parents[1]


def eight_gpu_config(policy_engines: int = 2, policy_tp: int = 1, colocate: bool = True, **over: object):
    """Policy ``policy_engines`` x TP ``policy_tp``, 2 experience-model replicas, a 4-GPU learner."""
    cfg = {
        "policy": {"num_engines": policy_engines,
                   "engine": {"device": "cuda", "tensor_parallel_size": policy_tp, "num_cpus": 1}},
        "experience_model": {"backend": "ray", "replicas": 2, "engine": {"device": "cuda", "num_cpus": 1}},
        "learner": {"device": "cuda", "num_gpus": 4, "num_cpus": 2},
        "train": {"mode": "s2r", "colocate": colocate, "rollout": {"workers": 2, "num_cpus": 1}},
        "replay": {"shards": 1, "num_cpus": 0.5},
    }
    for k, v in over.items():
        cfg.setdefault(k, {}).update(v)  # type: ignore[union-attr]
    return load_config(overrides=cfg)


def assert_each_gpu_reserved_once(plan: PlacementPlan, gpus: float) -> None:
    assert plan.total_gpus == gpus
    for a in plan.actors:
        if a.group is None:
            continue
        g = plan.group(a.group)
        # An actor inside a group asks for no more than its first bundle holds, and its bundles are its own.
        assert a.gpus <= g.bundles[a.bundles[0]].gpus and a.cpus <= g.bundles[a.bundles[0]].cpus + 1e-9
        assert a.gpus_used == sum(g.bundles[i].gpus for i in a.bundles)
    owned = [(a.group, i) for a in plan.actors if a.group for i in a.bundles]
    assert len(owned) == len(set(owned)), "a bundle is used by two actors"
    all_bundles = {(g.name, i) for g in plan.groups for i in range(len(g.bundles))}
    assert set(owned) == all_bundles, "a bundle is reserved but used by no actor"
    assert sum(a.gpus_used for a in plan.actors) == gpus


@pytest.mark.parametrize(("engines", "tp", "colocate"), [(2, 1, True), (1, 2, True), (2, 1, False), (1, 2, False)])
def test_eight_gpu_layouts_reserve_each_gpu_once(engines: int, tp: int, colocate: bool) -> None:
    plan = plan_placement(eight_gpu_config(engines, tp, colocate))
    assert_each_gpu_reserved_once(plan, 8.0)
    assert [a.gpus_used for a in plan.role("learner")] == [4.0]
    assert [a.gpus_used for a in plan.role("experience-replica")] == [1.0, 1.0]
    assert sum(a.gpus_used for a in plan.role("policy-engine")) == 2.0
    if colocate:  # the engines sit in the learner's group, in bundles of their own, not outside it
        colo = plan.group("colocated")
        assert colo.strategy == "STRICT_PACK" and colo.gpus == 6.0
        assert all(a.group == "colocated" for a in plan.role("policy-engine"))
    if tp == 2:
        (eng,) = plan.role("policy-engine")
        assert eng.gpus == 0.0 and len(eng.bundles) == 2  # vLLM's TP workers hold the bundles' GPUs
    assert plan.problems(64, 8, 8) == []
    assert plan.problems(64, 7, 8) == ["the actors ask for 8 GPUs, the cluster has 7"]
    table = plan.table()
    assert "total:" in table and "8 GPUs" in table and "policy-engine" in table


def test_cpu_default_plan_is_unchanged() -> None:
    """The packaged default (CPU engines, no colocate): no placement groups, the same totals as before."""
    from dreamgym.commands.train import default_train_config

    plan = plan_placement(load_config(default_train_config()))
    assert plan.groups == [] and plan.total_gpus == 0.0 and plan.total_cpus <= 2.0


def test_colocate_strict_pack_must_fit_one_node() -> None:
    plan = plan_placement(eight_gpu_config())
    assert any("colocated needs 6 GPUs on one node" in p for p in plan.problems(64, 8, node_gpus=4))


def test_tensor_parallel_needs_cuda_and_whole_gpus() -> None:
    from dreamgym.errors import ConfigError

    with pytest.raises(ConfigError, match="tensor_parallel_size 2 needs device 'cuda'"):
        load_config(overrides={"policy": {"engine": {"tensor_parallel_size": 2}}})
    with pytest.raises(ConfigError, match="num_gpus must be 1"):
        load_config(overrides={"policy": {"engine": {"device": "cuda", "tensor_parallel_size": 2, "num_gpus": 0.5}}})


# -- NCCL ranks ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("engines", "tp"), [(1, 1), (2, 1), (3, 1), (2, 2), (4, 2), (2, 4)])
def test_nccl_ranks_are_distinct_per_engine_and_worker(engines: int, tp: int) -> None:
    r = NcclRanks(engines, tp)
    ranks = [r.rank(i, j) for i in range(engines) for j in range(tp)]
    assert sorted(ranks) == list(range(1, r.world_size)) and r.world_size == 1 + engines * tp
    # vLLM's worker rank is rank_offset + its tensor-parallel rank: the offsets must leave room for every worker.
    assert [r.offset(i) + j for i in range(engines) for j in range(tp)] == ranks
    with pytest.raises(IndexError):
        r.rank(engines, 0)


def test_engine_client_gives_each_engine_its_own_rank_offset() -> None:
    """vLLM's trainer sends every engine ``rank_offset`` 1; the client rewrites it per engine."""
    from actors.weight_sync import _EngineClient

    client = _EngineClient([object(), object(), object()], ["e0", "e1", "e2"], 10.0, NcclRanks(3, 2))
    vllm_payload = {"master_address": "10.0.0.5", "master_port": 40000, "rank_offset": 1, "world_size": 7}
    payloads = client.init_payloads(vllm_payload)
    assert [p["rank_offset"] for p in payloads] == [1, 3, 5]
    assert {p["world_size"] for p in payloads} == {7}
    assert all(p["master_address"] == "10.0.0.5" for p in payloads)


def test_nccl_sync_is_chosen_and_engines_get_the_backend() -> None:
    from actors.weight_sync import engine_transfer_backend, sync_backend

    gpu = eight_gpu_config()
    assert sync_backend(gpu) == "nccl" and engine_transfer_backend(gpu) == "nccl"
    cpu = load_config(overrides={"learner": {"device": "cpu"}})
    assert sync_backend(cpu) == "object_store" and engine_transfer_backend(cpu) is None


def test_start_actors_builds_engines_with_the_transfer_backend_and_their_bundles() -> None:
    """The defect: ``create_policy_engines(cfg.policy)`` without ``weight_transfer_backend``. Read the call."""
    src = (REPO / "actors" / "train_setup.py").read_text()
    call = src[src.index("pool.submit(create_policy_engines"):]
    call = call[:call.index("\n        f_learner")]
    assert "weight_transfer_backend=engine_transfer_backend(cfg)" in call and "placements=" in call


# -- the dry run ------------------------------------------------------------------------------------------
def test_dry_run_prints_the_plan_against_a_stated_shape(tmp_path: Path) -> None:
    cfg = REPO / "configs" / "gpu-cluster.yaml"
    r = subprocess.run([sys.executable, "-m", "dreamgym.cli", "train", str(cfg), "--dry-run", "--cluster-gpus", "8",
                        "--cluster-cpus", "224", "--node-gpus", "8"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "total: 164.25 CPUs, 8 GPUs" in r.stdout and "fits the stated cluster shape" in r.stdout
    assert "colocated[0]; colocated[1]; colocated[2]; colocated[3]" in r.stdout  # 4 data-parallel learner ranks
    assert "colocated[4]; colocated[5]" in r.stdout  # the policy engines, on the learner's node
    r = subprocess.run([sys.executable, "-m", "dreamgym.cli", "train", str(cfg), "--dry-run", "--cluster-gpus", "4",
                        "--cluster-cpus", "224"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "the actors ask for 8 GPUs, the cluster has 4" in r.stdout


def test_gpu_cluster_example_config() -> None:
    """configs/gpu-cluster.yaml loads, its GPUs per role are the ones its header states, and it fits 8 GPUs."""
    cfg = load_config(REPO / "configs" / "gpu-cluster.yaml")
    plan = plan_placement(cfg)
    assert_each_gpu_reserved_once(plan, 8.0)
    header = (REPO / "configs" / "gpu-cluster.yaml").read_text().split("\nrun:")[0]
    assert "GPUs per role (8 in all" in header
    for role, gpus in (("learner", 4), ("policy-engine", 2), ("experience-replica", 2)):
        assert sum(a.gpus_used for a in plan.role(role)) == gpus
    assert cfg.policy.engine.device == cfg.experience_model.engine.device == "cuda"
    assert "/" in cfg.policy.model and "/" in cfg.experience_model.model  # hub ids, resolved through the HF cache
    assert plan.problems(224, 8, 8) == []


# -- on Ray: fake GPUs, bounded waits -------------------------------------------------------------------
RAY_SCRIPT = textwrap.dedent('''
    import json, sys, time
    import ray
    from dreamgym.config import load_config
    from dreamgym.placement import plan_placement
    from dreamgym.errors import ConfigError
    from actors.placement import actor_options, create_groups, remove_groups, wait_for_resources

    layouts = json.loads(sys.argv[1])
    ray.init(address="local", num_cpus=16, num_gpus=8, include_dashboard=False, log_to_driver=False,
             configure_logging=False)

    @ray.remote(num_cpus=0)
    class Probe:
        def gpus(self):
            return [str(g) for g in ray.get_runtime_context().get_accelerator_ids()["GPU"]]

    out = {}
    for name, overrides in layouts.items():
        plan = plan_placement(load_config(overrides=overrides))
        wait_for_resources(plan, 5.0, print)
        groups = create_groups(plan, 30.0, print)
        probes = []
        for a in plan.actors:
            opts, env = actor_options(a, groups)
            if a.gpus_used == 0:
                continue
            if a.tensor_parallel_size == 1:
                probes.append(Probe.options(**opts).remote())
            else:  # what vLLM's Ray executor does: one one-GPU worker per bundle of the engine's group
                from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
                for b in env["VLLM_RAY_BUNDLE_INDICES"].split(","):
                    probes.append(Probe.options(num_gpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(
                        groups[a.group], placement_group_bundle_index=int(b))).remote())
        ready, pending = ray.wait([p.gpus.remote() for p in probes], num_returns=len(probes), timeout=60)
        ids = [g for r in ready for g in ray.get(r)]
        out[name] = {"pending": len(pending), "gpu_ids": ids, "plan_gpus": plan.total_gpus,
                     "available_gpus": ray.available_resources().get("GPU", 0.0)}
        for p in probes:
            ray.kill(p)
        remove_groups(groups)  # the next layout's create_groups waits until its groups are placed

    # Too few CPUs: ask (the autoscaler call is a no-op here), wait within the bound, fail naming what is missing.
    import ray.autoscaler.sdk as sdk
    asked = []
    real_request = sdk.request_resources
    def recording_request(**kw):
        asked.append(kw)
        return real_request(**kw)
    sdk.request_resources = recording_request
    big = plan_placement(load_config(overrides={"train": {"rollout": {"workers": 40, "num_cpus": 1}}}))
    out["big_bundles"] = big.resource_bundles()
    t0 = time.monotonic()
    try:
        wait_for_resources(big, 1.0, print, poll_s=0.25)
        out["short"] = {"raised": False}
    except ConfigError as e:
        out["short"] = {"raised": True, "message": str(e), "seconds": time.monotonic() - t0, "asked": asked}
    # Bounded waits name what is missing: an engine that cannot start, a group that cannot be placed.
    from actors.placement import wait_started
    from dreamgym.placement import Bundle, GroupPlan, PlacementPlan
    stuck = Probe.options(num_gpus=100).remote()
    try:
        wait_started({stuck.gpus.remote(): "policy-engine-7"}, 1.0, "policy.engine.start_timeout_s")
    except RuntimeError as e:
        out["engine_timeout"] = str(e)
    ray.kill(stuck)
    try:
        create_groups(PlacementPlan(groups=[GroupPlan("too-big", (Bundle(1, 9.0),))]), 1.0, print)
    except ConfigError as e:
        out["group_timeout"] = str(e)
    print("RESULT " + json.dumps(out))
''')


def _layout(engines: int, tp: int) -> dict[str, object]:
    return {
        "policy": {"num_engines": engines, "engine": {"device": "cuda", "tensor_parallel_size": tp, "num_cpus": 1}},
        "experience_model": {"backend": "ray", "replicas": 2, "engine": {"device": "cuda", "num_cpus": 1}},
        "learner": {"device": "cuda", "num_gpus": 4, "num_cpus": 2},
        "train": {"mode": "s2r", "colocate": True, "rollout": {"workers": 2, "num_cpus": 1}},
    }


@pytest.mark.ray
@pytest.mark.slow
def test_plan_on_a_ray_node_with_eight_fake_gpus(tmp_path: Path) -> None:
    """A CPU Ray node started with 8 fake GPUs: both 8-GPU layouts are placed with every GPU held exactly once
    (an engine asking for its GPU outside its bundle would stay pending); a run that asks for more CPUs than the
    node has fails after the bound, with the message."""
    layouts = {"2x1": _layout(2, 1), "1x2": _layout(1, 2)}
    r = subprocess.run([sys.executable, "-c", RAY_SCRIPT, json.dumps(layouts)], capture_output=True, text=True,
                       timeout=300, cwd=REPO, env={**__import__("os").environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
                                                   "RAY_ADDRESS": ""})
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(line[len("RESULT "):])
    for name in layouts:
        res = out[name]
        assert res["pending"] == 0, (name, res)
        assert res["plan_gpus"] == 8.0
        assert sorted(res["gpu_ids"]) == [str(i) for i in range(8)], (name, res)  # 8 distinct GPUs, none twice
        assert res["available_gpus"] == 0.0, (name, res)
    short = out["short"]
    assert short["raised"] and short["seconds"] >= 1.0, short
    assert "still missing within ray.resources_timeout_s = 1 s" in short["message"]
    assert "CPUs (the cluster has 16)" in short["message"]
    assert out["engine_timeout"] == "policy-engine-7: not up within policy.engine.start_timeout_s = 1 s"
    assert out["group_timeout"].startswith("placement groups not placed within 1 s: too-big (STRICT_PACK, 1 bundles, "
                                           "9 GPUs")
    # The autoscaler was asked for the plan's bundles, and the request cleared once the wait ended.
    assert short["asked"] == [{"bundles": out["big_bundles"]}, {"bundles": []}]


# ``train.colocate`` on CPU through a whole run (the learner and the engine in the plan's one group, the group
# removed at the end): tests/test_train.py::test_ppo_trains_in_both_phases_colocated.
