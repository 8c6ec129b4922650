"""Dr. GRPO: no std scaling of advantages, sequence-sum normalised by a constant.

    python -m experiments.run --config=configs/drgrpo.py[:variant]   (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    return base.method_file("drgrpo", variant)
