"""HDL (spec §2): 2 roots -> feedback -> reflection -> hindsight scores -> 2 branch points per root
-> 4 + 3 continuations from the cached prefix; suffix-only loss.

    python -m experiments.run --config=configs/hdl.py[:variant]   (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    config = base.method_file("hdl", variant)
    return config
