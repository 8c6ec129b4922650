"""β-OPSD (spec §5): the target mixes the student's logits (sg) with the frozen initial model's
under the teacher context, w 0.5 -> 0.8 over 200 steps, return-to-go (gamma 0.99) on the
log-ratio; the paper's "D+F" with the geometric mix.

    python -m experiments.run --config=configs/beta_opsd.py[:variant]   (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    config = base.method_file("beta_opsd", variant)
    return config
