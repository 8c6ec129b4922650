"""DAPO (spec §1.2): asymmetric clip (0.2 / 0.28), dynamic sampling of mixed groups, overlong shaping.

    python -m experiments.run --config=configs/dapo.py[:variant]   (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    config = base.method_file("dapo", variant)
    # Overlong shaping in tokens, scaled to the response cap of the variant.
    config.method_config.update(max_response_length=config.rollout.max_new_tokens,
                                overlong_buffer=config.rollout.max_new_tokens // 4)
    return config
