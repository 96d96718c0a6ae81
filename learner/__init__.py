"""The learner (torch/transformers; GRPO or PPO): buildable and steppable without Ray."""
