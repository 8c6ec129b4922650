"""CriPO (spec §14, OUR CHOICE throughout: no paper was found): a criterion-conditioned teacher's
forward KL injected on the tokens carrying 95% of it (lam_inj 0.1), and failed rows' localised
tokens flipped to +0.1 in GRPO's surrogate.

    python -m experiments.run --config=configs/cripo.py[:variant]   (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    config = base.method_file("cripo", variant)
    return config
