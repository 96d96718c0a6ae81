"""Shared fixtures. Real components only: a real local Ray cluster, real engines, real files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_cuda():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def ray_cluster():
    """A real single-node Ray cluster started for the test session (2 CPUs, no dashboard)."""
    import ray

    if ray.is_initialized():
        yield ray
        return
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    # address="local": always a fresh cluster of our own, even when RAY_ADDRESS or another Ray is around.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             namespace="dreamgym-tests")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def alfworld_debug_dir() -> Path:
    d = SHARED_DATA / "alfworld-debug"
    if not (d / "game.tw-pddl").is_file():
        pytest.fail(f"the ALFWorld debug game is missing at {d}; it ships in ../shared/data")
    return d


@pytest.fixture
def java_available() -> bool:
    return shutil.which("java") is not None
