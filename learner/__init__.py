"""The GRPO learner (torch/transformers): buildable and steppable without Ray."""
