"""OPSD (spec §1.3): generalized JSD to the policy under a privileged teacher context.

    python -m experiments.run --config=configs/opsd.py[:variant]   (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    config = base.method_file("opsd", variant)
    return config
