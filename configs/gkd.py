"""GKD (TRL's): generalized JSD (beta 0.5, temperature 0.9) to a teacher model on the student's own
samples with probability lmbda = 0.5, else on the examples' completions (seq_kd: the teacher's
samples). The teacher is external (teacher.model.name, sharing the student's tokenizer); these
files default it to the policy's own initial checkpoint loaded separately (the tiny variant: a
second random tiny decoder) -- set a larger model of the same tokenizer for real distillation.

    python -m experiments.run --config=configs/gkd.py[:variant]   (variants: configs/base.py)
"""
from configs import base


def get_config(variant: str | None = None):
    config = base.method_file("gkd", variant)
    config.rollout.group_size = 1  # one row per prompt
    config.teacher.model.name = config.model.name
    return config
