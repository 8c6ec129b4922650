"""PCSD (spec §3): GRPO + lam x persistence-consistency-gated self-distillation.

    python -m experiments.run --config=configs/pcsd.py[:variant]   (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    config = base.method_file("pcsd", variant)
    return config
