"""RLSD (spec §2): GRPO whose per-token advantages take their magnitude from the teacher context
(question + reference answer) and their direction from the reward; lam_0 = 0.5 decaying to 0 over
50 steps.

    python -m experiments.run --config=configs/rlsd.py[:variant]   (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    config = base.method_file("rlsd", variant)
    return config
