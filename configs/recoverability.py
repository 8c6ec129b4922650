"""Counterfactual recoverability (spec other-methods §10): failing rows' error states replayed by
budget-matched teacher branches (continue vs rollback, 4 each); recoverable states keep the prefix
and add a corrective continuation (cross-entropy to the teacher's argmax), irreversible ones roll
back (the doomed suffix untrained, the rollback branch supervised), ambiguous ones get SOD.

    python -m experiments.run --config=configs/recoverability.py[:variant]
    (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    config = base.method_file("recoverability", variant)
    return config
