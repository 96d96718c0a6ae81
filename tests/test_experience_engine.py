"""The experience model on real vLLM engines (CPU): SFT, Ray replicas, the router, the HTTP path.

The model is a tiny random Llama fine-tuned here, by the project's own SFT, on one transition of a toy
world, so the tests control what it says: for ``go north`` in the hall it writes a valid winning step;
for any other prompt (``look``) it writes malformed text; with a small token limit its valid reply is
cut. Nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from experience_data import HALL, KITCHEN, TOY_ENV, controlled_rows, toy_row, write_toy

from dreamgym.config import EngineConfig, ExperienceModelConfig, load_config
from dreamgym.experience.http_client import ExperienceBackendError
from dreamgym.experience.model import ExperienceModel
from dreamgym.experience.retrieval import TransitionIndex
from dreamgym.experience.retry import RetryPolicy
from dreamgym.experience.schema import Sampling
from dreamgym.experience.setup import build_model, prompt_options
from dreamgym.experience.synthetic_env import synthetic_env_from_index

pytestmark = [pytest.mark.slow, pytest.mark.engine]

PROMPT = {"top_k": 1, "history_steps": 2}


@dataclass
class Controlled:
    model: Path
    data: Path
    summary: dict


@pytest.fixture(scope="module")
def controlled(tmp_path_factory: pytest.TempPathFactory) -> Controlled:
    """SFT of a tiny random Llama on the ``go north`` transition (the loss must fall); ``data`` is the
    whole toy world (the retrieval store). 200 steps: with today's package versions 100 steps leave the
    reasoning NLL at 0.43 (not yet memorised), 200 bring every NLL below 1e-3."""
    from dreamgym.models import build_tiny_model
    from learner.sft_experience import train_experience_model

    d = tmp_path_factory.mktemp("controlled")
    world = write_toy(d / "world.parquet", controlled_rows())
    train = write_toy(d / "train.parquet", controlled_rows()[:1])
    base = build_tiny_model(d / "base")
    cfg = load_config(None, {"run": {"seed": 0}, "experience_model": {
        **PROMPT, "train": {"data": str(train), "store": str(world), "base": str(base), "lr": 1e-2,
                            "retrieval": "overlap",  # the replicas below are served TransitionIndex demonstrations
                            "batch_size": 1, "epochs": 200, "log_every": 1000,
                            "threads": 1}}})  # a 70k-parameter model: one thread is faster than two
    summary = train_experience_model(cfg, d / "model")
    return Controlled(d / "model", world, summary)


def test_sft_loss_falls_and_writes_an_hf_folder(controlled: Controlled) -> None:
    s = controlled.summary
    assert s["examples"] == 1 and s["steps"] == 200
    assert s["loss_last"] < 0.05 * s["loss_first"], s
    assert s["reasoning_nll_last"] < 0.1 and s["state_nll_last"] < 0.1
    files = {p.name for p in controlled.model.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= files
    history = json.loads((controlled.model / "dreamgym_sft.json").read_text())["history"]
    assert len(history) == 200 and history[-1]["loss"] < history[0]["loss"]


def _engine_cfg(model: Path, **kw: object) -> ExperienceModelConfig:
    engine = EngineConfig(dtype="float32", max_model_len=1024, num_cpus=0.5, omp_threads=1)
    return ExperienceModelConfig(model=str(model), engine=engine, max_tokens=96, **PROMPT, **kw)  # type: ignore[arg-type]


def test_replicas_serve_synthetic_episodes_and_route_around_a_dead_replica(ray_cluster, controlled: Controlled) -> None:
    import psutil
    import ray

    from actors.experience_model import RayExperienceClient, start_replicas

    cfg = _engine_cfg(controlled.model, replicas=2)
    replicas = start_replicas(cfg)  # the saved SFT folder loads in vLLM
    client = RayExperienceClient(replicas, refresh_s=0.0, owns=True)
    try:
        index = TransitionIndex.from_parquet(controlled.data)
        model = build_model(cfg, client)
        env = synthetic_env_from_index(model, index, TOY_ENV, max_steps=3)
        task = env.tasks(1)[0]

        # A whole episode end to end: retrieval -> prompt -> vLLM -> strict parse -> StepResult.
        obs = env.reset(task)
        assert obs.state == HALL and obs.admissible_actions == ["go north", "look"]
        res = env.step("go north")
        assert res.info["valid"] and res.info["attempts"] == 1 and res.info["demonstrations"] == 1
        assert (res.observation.state, res.reward, res.done, res.success) == (KITCHEN, 1.0, True, True)
        assert res.info["reasoning"] == "The agent goes north."

        # The model misbehaves on 'look': retried with the documented sampling change (greedy, then
        # the escape temperature, then half of it), then an invalid transition that ends the episode
        # and is counted.
        env.reset(task)
        res = env.step("look")
        assert not res.info["valid"] and res.info["attempts"] == cfg.max_attempts and res.done and not res.success
        assert res.info["truncated"] and res.observation.state == HALL and res.reward == 0.0
        assert model.stats.invalid == 1 and model.stats.retries == cfg.max_attempts - 1
        assert sum(model.stats.reasons.values()) == cfg.max_attempts

        # An inadmissible action is settled by the admissible list: no model call.
        env.reset(task)
        calls = model.stats.model_calls
        res = env.step("dance")
        assert res.info["settled"] and res.reward == 0.0 and not res.done and model.stats.model_calls == calls

        # A reply cut by the token limit is retried with more tokens on the real engine.
        short = ExperienceModel(client, prompt_options(cfg), Sampling(max_tokens=16), RetryPolicy(max_attempts=4))
        env2 = synthetic_env_from_index(short, index, TOY_ENV)
        env2.reset(task)
        res = env2.step("go north")
        assert res.info["valid"] and res.info["attempts"] > 1 and short.stats.reasons["truncated"] >= 1

        # Least-loaded routing spreads a batch over both replicas ...
        router = client.router
        sent_before = list(router.sent)
        queries = [_query(index, "go north") for _ in range(8)]
        tally = model.stats.copy()
        assert all(p.valid and p.success for p in model.predict(queries))
        assert all(after - before >= 2 for after, before in zip(router.sent, sent_before, strict=True))
        # What the replicas' engines ran, counted per reply: the 8 identical prompts (4 per replica, all in flight at
        # once) ran in batches of more than one, and the prefix cache served part of their prompts (the replicas
        # answered this prompt before). Each step is booked once: its time is real and its batch within 1..8.
        spent = model.stats - tally
        fig = spent.token_figures(len(queries))
        assert spent.model_calls == 8 and spent.engine_steps > 0 and spent.engine_us > 0, spent.counts()
        assert 1 < fig["mean_running_per_step"] <= 8 and fig["calls_per_transition"] == 1.0, fig  # type: ignore[operator]
        assert 0 < spent.cached_tokens < spent.prompt_tokens and spent.completion_tokens > 0, spent.counts()
        # ... and routes around a replica that died.
        ray.kill(replicas[0])
        time.sleep(1.0)
        assert all(p.valid for p in model.predict(queries[:4]))
        assert router.alive == [False, True]
        # The last replica freezes (``kill -STOP``: alive, never answering): the batch waiting on it ends at
        # ``experience_model.request_timeout_s``, the router reports it by name and has Ray restart it (the stopped
        # process is killed); with none live, the request waits for it to come back (its engine loads again on
        # the probe) and is answered by the restarted replica.
        router.timeout_s = 5.0  # experience_model.request_timeout_s
        pid = ray.get(replicas[1].info.remote())["pid"]
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            assert all(p.valid and p.success for p in model.predict(queries[:2]))
        finally:
            with contextlib.suppress(ProcessLookupError):  # never leave a stopped process behind
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        notes = router.take_notices()
        assert len(notes) == 1 and re.match(r"experience-model replica 1 \(\d+ request\(s\)\) made no progress within "
                                            r"5 s \(experience_model\.request_timeout_s\)", notes[0]), notes
        assert notes[0].endswith("restarting it") and time.monotonic() - t0 >= 5.0
        assert router.alive == [False, True] and router.hung == 1 and router.revived == 1
        assert ray.get(replicas[1].info.remote())["pid"] != pid
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        # Down for good: past ``revive_timeout_s`` the request fails with a message that names the bound.
        ray.kill(replicas[1])
        time.sleep(1.0)
        router.revive_timeout_s = 3.0
        with pytest.raises(ExperienceBackendError, match=r"experience_model\.revive_timeout_s"):
            model.predict(queries[:1])
    finally:
        client.close()


def _query(index: TransitionIndex, action: str):  # type: ignore[no-untyped-def]
    from dreamgym.experience.schema import ExperienceQuery

    return ExperienceQuery(env=TOY_ENV, instruction="Go to the kitchen.", state=HALL, action=action,
                           demonstrations=index(HALL, action, 1), admissible_actions=index.admissible(HALL))


def test_speculative_decoding_writes_the_same_reply_in_fewer_engine_steps(controlled: Controlled) -> None:
    """``experience_model.speculative_tokens``: prompt-lookup drafts copied from the prompt (the demonstration's
    next state is the reply's) are verified by the model, so the greedy reply is the one it writes alone, token for
    token, and the engine takes fewer steps than it writes tokens."""
    from dreamgym.experience.engine import InProcessClient
    from dreamgym.experience.setup import engine_options

    cfg = _engine_cfg(controlled.model, speculative_tokens=4)
    client = InProcessClient(engine_options(cfg, str(controlled.model)))
    try:
        model = build_model(cfg, client)
        index = TransitionIndex.from_parquet(controlled.data)
        pred = model.predict_one(_query(index, "go north"))
    finally:
        client.close()
    # what the replicas write without drafts (test_replicas_serve_synthetic_episodes_...), the same fields
    assert pred.valid and (pred.next_state, pred.reward, pred.done, pred.success, pred.reasoning) == (
        KITCHEN, 1.0, True, True, "The agent goes north.")
    st = model.stats
    assert st.model_calls == 1 and 0 < st.engine_steps < st.completion_tokens, st.counts()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_http_path_against_a_real_vllm_server(controlled: Controlled, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from dreamgym.cli import main
    from dreamgym.experience.http_client import OpenAIClient

    port = _free_port()
    url = f"http://127.0.0.1:{port}/v1"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(controlled.model),
         "--served-model-name", "toy-em", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
         "--max-model-len", "1024", "--enforce-eager", "--seed", "0"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                tail = (tmp_path / "server.log").read_text()[-3000:]
                pytest.fail(f"vLLM server exited with {proc.returncode}:\n{tail}")
            try:
                urllib.request.urlopen(f"{url}/models", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("vLLM server did not come up in 300 s")
                time.sleep(1.0)

        cfg = _engine_cfg(controlled.model)
        client = OpenAIClient(url)
        assert client.model == "toy-em"
        index = TransitionIndex.from_parquet(controlled.data)
        model = build_model(cfg, client)
        env_ = synthetic_env_from_index(model, index, TOY_ENV)
        env_.reset(env_.tasks(1)[0])
        res = env_.step("go north")
        assert res.info["valid"] and res.success and res.observation.state == KITCHEN
        client.close()

        # The eval command through the same server, beside the copy baseline.
        out = tmp_path / "eval.json"
        assert main(["eval-experience-model", "--data", str(controlled.data), "--store", str(controlled.data),
                     "--backend", "http", "--url", url, "--model", "toy-em", "--out", str(out),
                     "--experience_model.top_k", "1", "--experience_model.history_steps", "2",
                     "--run.out_dir", str(tmp_path)]) == 0
        assert "copy_baseline" in capsys.readouterr().out
        r = json.loads(out.read_text())
        assert r["model"]["n"] == 2 and r["model"]["invalid_rate"] == 0.5  # 'go north' valid, 'look' not
        assert r["model"]["exact"] == 0.5 and r["model_stats"]["invalid"] == 1

        # Fidelity before the rules: an inadmissible 'dance' goes to the model too (its first reply is scored);
        # after the rules it is the failure state, which the rules alone get right as well.
        heldout = write_toy(tmp_path / "heldout.parquet", [*controlled_rows(),
                            toy_row("e2", 0, HALL, "dance", "Invalid action.", 0.0, False, False)])
        assert main(["eval-experience-model", "--data", str(heldout), "--store", str(controlled.data),
                     "--backend", "http", "--url", url, "--model", "toy-em", "--out", str(out),
                     "--experience_model.eval.fidelity", "true", "--experience_model.top_k", "1",
                     "--experience_model.history_steps", "2", "--run.out_dir", str(tmp_path)]) == 0
        assert "model_first_reply" in capsys.readouterr().out
        r = json.loads(out.read_text())
        f = r["fidelity"]["all"]
        assert f["model_first_reply"]["next_state_exact"] == 0.3333  # 'go north' only
        assert f["model_after_rules"]["next_state_exact"] == f["rules_only"]["next_state_exact"] == 0.6667
        assert r["fidelity"]["unseen"]["copy_top1"]["n"] == 1 and r["model_stats"]["unsettled"] == 1
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server's own process group, started above
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
