"""DemoPSD (spec §6): geometric barycenter target with disagreement-driven alpha.

    python -m experiments.run --config=configs/demopsd.py[:variant]   (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    config = base.method_file("demopsd", variant)
    return config
