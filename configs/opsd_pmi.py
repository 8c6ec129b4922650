"""OPSD-PMI (spec §5): the teacher target purified by the reference-only probe (PMI).

    python -m experiments.run --config=configs/opsd_pmi.py[:variant]   (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    config = base.method_file("opsd_pmi", variant)
    return config
