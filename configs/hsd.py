"""HSD (spec §12, OUR CHOICE after SDPO): GRPO + 0.1 x the reverse KL (student top-100 + tail) to
the policy reprompted with a random successful peer of the group and the reference answer.

    python -m experiments.run --config=configs/hsd.py[:variant]   (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    config = base.method_file("hsd", variant)
    return config
