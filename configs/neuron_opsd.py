"""Neuron-OPSD (spec §8): before training, the frozen policy's zero-shot answers select the 20% of
the pool whose answers' neuron sets are smallest (highest consensus) and give each a few-shot
teacher context (its 10 nearest pool items in Jaccard distance); then the full-vocabulary reverse
KL to an EMA teacher at rate tau = 0.01 (train.reference="ema", train.ema_decay=0.99) reading the
demonstrations.

    python -m experiments.run --config=configs/neuron_opsd.py[:variant]   (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    config = base.method_file("neuron_opsd", variant)
    config.train.update(reference="ema", ema_decay=0.99)
    if variant == "tiny":
        # the 2-layer random model has 2 x 64 neurons: small sets, so consensus varies; a pool of
        # 12 keeps 3 examples (2 prompts per step), each with 2 demonstrations
        config.method_config.update(pool_size=12, num_shots=2, neurons_per_layer=16,
                                    num_neurons=32)
    return config
