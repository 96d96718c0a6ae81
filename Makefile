# The two commands of the README are `make run` and `make test`; both install first.
SHELL := /bin/bash
VENV := .venv/bin

.PHONY: install install-gpu run test test-fast lint bench

install:
	bash scripts/install.sh

install-gpu:
	bash scripts/install.sh --gpu

# The main job on the embedded default (local Ray, twx:coin).
run: install
	$(VENV)/dreamgym collect --env twx:coin --policy mixed --episodes 500

test: install
	$(VENV)/ruff check .
	$(VENV)/python -m pytest -q

test-fast: install
	$(VENV)/python -m pytest -q -m "not slow"

lint:
	$(VENV)/ruff check .

bench: install
	$(VENV)/python bench/bench_collect.py
