"""SEED (spec other-methods §11): GRPO + 0.01 x SDAR's gated distillation towards the policy
conditioned on a skill it wrote itself from the group's finished trajectories (stage 2 alone;
``configs/seed_stages.py`` runs stage 1's skill-writing SFT first).

    python -m experiments.run --config=configs/seed.py[:variant]   (variants: configs/base.py)
"""
from configs import base

TINY_SKILL_TOKENS = 16
"""``rollout.generated_max_tokens`` of the ``tiny`` variant: its responses are 24 characters
(one token each), and stage 1 trains a skill as a response."""


def get_config(variant: str | None = None):
    config = base.method_file("seed", variant)
    if variant == "tiny":
        config.rollout.generated_max_tokens = TINY_SKILL_TOKENS
    return config
