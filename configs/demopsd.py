"""DemoPSD (spec §6): geometric barycenter target with disagreement-driven alpha; the teacher is
SDPO's EMA of the policy at rate 0.05 (train.reference="ema", train.ema_decay=0.95).

    python -m experiments.run --config=configs/demopsd.py[:variant]   (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    config = base.method_file("demopsd", variant)
    config.train.update(reference="ema", ema_decay=0.95)
    return config
