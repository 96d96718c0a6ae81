"""The reasoning experience model: an LLM that plays the environment.

Given the task instruction, the last ``H`` steps of history, the current abstract state ``s_t``, the
agent's action ``a_t`` and the top-k demonstrations (similar real transitions retrieved from the
replay buffer), it first writes its reasoning, then predicts the next abstract state ``s_{t+1}``, the
reward ``r_{t+1}`` and whether the episode ended (and succeeded).

Modules (no Ray in here; the Ray replicas and their router live in ``actors/experience_model.py``):

- ``schema``: the records (query, demonstration, completion request/reply, prediction).
- ``templates`` / ``prompts``: one prompt builder, templates per environment family in one place.
- ``parser`` / ``retry`` / ``accounting``: the strict reply parser, the retry policy (a documented
  change of sampling per attempt) and the invalid-transition accounting.
- ``client``: the ``ExperienceClient`` seam (text in, text out) with a function-backed client;
  ``engine`` (in-process async vLLM) and ``http_client`` (any OpenAI-compatible server) implement it.
- ``model``: ``ExperienceModel``, prompt -> client -> parse -> retry -> ``Prediction``.
- ``retrieval``: the ``retrieve(state, action, k)`` seam and an in-memory token-overlap index over a
  transitions file (tests, the copy baseline, small runs).
- ``synthetic_env`` / ``gym_env``: ``SyntheticEnv`` (the ``Environment`` protocol on top of the model;
  ``step_batch`` steps many at once) and a ``gymnasium.Env`` wrapper with text spaces.
- ``annotate``: reasoning traces for offline transitions (template rationale or a teacher LLM).
- ``evaluate``: metrics on held-out real transitions beside the retrieval-only copy baseline.
- ``setup``: the pieces built from the ``experience_model`` config section; ``backends``: the client of
  the ``http`` and ``local`` backends (``ray``: ``actors/experience_model.py``).

The bodies of ``dreamgym annotate`` / ``train-experience-model`` / ``eval-experience-model`` are in
``dreamgym/commands/experience.py``.

SFT lives in ``learner/sft_experience.py``; the benchmark in ``bench/bench_experience_model.py``.

A minimal use, without Ray::

    index = TransitionIndex.from_parquet("coin_train.parquet")
    client = InProcessClient(EngineOptions(model=str(resolve_model("smollm2-135m"))))
    env = synthetic_env_from_index(ExperienceModel(client), index, "twx:coin")
    obs = env.reset(env.tasks(1)[0]); result = env.step("move north")
"""
