"""H²SD (spec §13, OUR CHOICE weighting): the teacher context routed by correctness; successes'
advantages scaled RLSD-style under their own verified answer, failures distilled (reverse KL,
student top-100 + tail) towards the policy given the hint.

    python -m experiments.run --config=configs/h2sd.py[:variant]   (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    config = base.method_file("h2sd", variant)
    return config
