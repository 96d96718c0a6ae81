"""DreamGym: RL for LLM agents inside a reasoning experience model (library; no Ray inside)."""

__version__ = "0.1.0"
