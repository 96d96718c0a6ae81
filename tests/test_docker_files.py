"""What can be checked of the images without a Docker engine: the build context, the CUDA base against the GPU
wheels, ``ray`` on PATH in login shells (the autoscaler runs ``bash --login``), no pip cache, pinned versions."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_dockerignore_keeps_local_state_out() -> None:
    lines = {x.strip() for x in (REPO / ".dockerignore").read_text().splitlines() if x.strip() and x[0] != "#"}
    assert {".git", ".venv", "runs/"} <= lines


def _from(dockerfile: Path) -> str:
    text = dockerfile.read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", text, re.M))
    image = re.search(r"^FROM (\S+)", text, re.M).group(1)  # type: ignore[union-attr]
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)


def test_gpu_base_matches_the_gpu_wheels() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["gpu"] == ["vllm==0.33.0"]  # vLLM 0.33 wheels: torch 2.14 for CUDA 13
    image = _from(REPO / "docker" / "Dockerfile.gpu")
    m = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.(\d+)-[\w-]*runtime-ubuntu\d+\.\d+", image)
    assert m and m.group(1) == "13", image


def test_images_pin_put_ray_on_login_path_and_keep_no_pip_cache() -> None:
    for name in ("Dockerfile.gpu", "Dockerfile.cpu"):
        text = (REPO / "docker" / name).read_text()
        image = _from(REPO / "docker" / name)
        assert ":" in image and not image.endswith(":latest") and re.search(r":\d", image), (name, image)
        assert "/etc/profile.d/dreamgym.sh" in text and "bash --login -c 'command -v ray" in text, name
        assert "PIP_NO_CACHE_DIR=1" in text, name
        assert "HF_HUB_OFFLINE" not in text, name  # offline only where a job sets it
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    ray = [d for d in deps if d.startswith("ray")]
    assert ray and all("==" in d for d in ray)
