"""GRPO (DeepSeekMath; verl's implementation, spec §1.1): clipped surrogate, group-std advantages, token-mean.

    python -m experiments.run --config=configs/grpo.py[:variant]   (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    config = base.method_file("grpo", variant)
    return config
