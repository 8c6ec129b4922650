"""CRAFT (spec §4): GRPO + SNIS counterfactual token importance + asymmetric controller + polarised KL.

    python -m experiments.run --config=configs/craft.py[:variant]   (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    return base.method_file("craft", variant)
