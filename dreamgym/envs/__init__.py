"""Environment protocol and adapters (real and remote)."""
