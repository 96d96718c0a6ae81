"""The curriculum: which tasks the policy practises next, and new tasks at the edge of its ability.

DreamGym keeps a pool of tasks and scores each by the reward variance of its latest GRPO group,
``V_tau = (1/n) sum_i (r_i - mean r)^2``: tasks the policy solves about half the time give GRPO's
group-relative advantages the most signal. Each iteration selects a batch with preference for high
``V_tau`` in which generated tasks are at most a share ``lambda``; the top-scoring tasks get variants
(harder but feasible, meaningfully different, realistic) from the experience model or, where the
environment is parameterised, from real parameter changes checked in the real environment.

Modules (no Ray here; ``actors/curriculum.py`` is the Ray actor):

- ``scoring``: ``V_tau``, stale-score decay, the never-solved treatment, the histogram.
- ``pool``: task records with reward histories; duplicate indexes.
- ``taskfile``: seed tasks from a validated YAML/JSONL file.
- ``selection``: the batch selection with the ``lambda`` cap.
- ``prompts`` / ``generator`` / ``grammar``: text variants: prompts and parsing, the
  ``TextGenerator`` protocol with the adapter to the experience model's client, validation.
- ``param_variants``: parameter variants and the real-environment checker.
- ``curriculum``: ``Curriculum``, tying it together (select, update, generate, metrics, resume).
- ``build``: a curriculum from the run config.
"""

from dreamgym.curriculum.curriculum import REJECT_REASONS, Curriculum, GenerationOutcome
from dreamgym.curriculum.generator import ClientTextGenerator, TextGenerator
from dreamgym.curriculum.scoring import reward_variance

__all__ = ["REJECT_REASONS", "ClientTextGenerator", "Curriculum", "GenerationOutcome", "TextGenerator",
           "reward_variance"]
