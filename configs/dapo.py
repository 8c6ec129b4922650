"""DAPO (spec §1.2): asymmetric clip (0.2 / 0.28), dynamic sampling of mixed groups, overlong shaping.

    python -m experiments.run --config=configs/dapo.py[:variant]   (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    return base.method_file("dapo", variant)
