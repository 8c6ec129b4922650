"""SDPO (spec §6): the policy reprompted with a successful peer's answer (or the verifier's
feedback) teaches its own samples; top-100 + tail generalized JSD (alpha 0.5) with the importance
weight clipped at 2, replacing the policy-gradient term; the teacher is an EMA of the policy at
rate 0.05 (train.reference="ema", train.ema_decay=0.95).

    python -m experiments.run --config=configs/sdpo.py[:variant]   (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    config = base.method_file("sdpo", variant)
    config.train.update(reference="ema", ema_decay=0.95)
    return config
