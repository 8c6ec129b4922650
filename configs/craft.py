"""CRAFT (spec §4): GRPO + SNIS counterfactual token importance + asymmetric controller + polarised KL.

    python -m experiments.run --config=configs/craft.py[:variant]   (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    config = base.method_file("craft", variant)
    # CRAFT compares siblings of one group: its loss group size is the rollout's.
    config.method_config.group_size = config.rollout.group_size
    return config
