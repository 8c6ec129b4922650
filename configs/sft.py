"""SFT: cross-entropy on the examples' own completions (one row per example, nothing sampled).

    python -m experiments.run --config=configs/sft.py[:variant]   (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    config = base.method_file("sft", variant)
    config.rollout.group_size = 1  # one given completion per example
    config.rollout.temperature = 1.0
    return config
