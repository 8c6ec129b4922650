"""Objectives: advantages (GRPO's, and the teacher-modulated ones of GRSD, RLSD, ATOD, H²SD, CriPO),
policy surrogates, KL penalties, reward shaping and distillation losses.

Every loss returns ``(sum, count)`` plus a metrics dict of ``(sum, count)`` pairs, so that token means
are exact across micro-batches and devices: add the pairs up, then divide once per optimizer step with
:func:`finalize` / :func:`finalize_metrics`. A method's objective is a weighted sum of such pairs,
named :class:`Term`\ s (:mod:`hindsight.objectives.terms`), each divided by its own count.
"""
from hindsight.objectives.advantages import SCALES, group_advantages
from hindsight.objectives.aggregation import (MODES, aggregate, finalize, finalize_metrics,
                                              token_weights)
from hindsight.objectives.distillation import DIVERGENCES, distillation_loss, sampled_distillation_loss
from hindsight.objectives.kl_estimators import ESTIMATORS, kl_penalty
from hindsight.objectives.policy import (RATIO_LEVELS, clipped_surrogate, policy_loss,
                                         token_surrogate)
from hindsight.objectives.shaping import overlong_penalty
from hindsight.objectives.teacher_advantages import (atod_advantages, flip_advantages, flip_at,
                                                     grsd_advantages, h2sd_advantages, localise,
                                                     rlsd_advantages)
from hindsight.objectives.terms import Loss, Term, objective, scale, term, term_metrics

__all__ = [
    "DIVERGENCES", "ESTIMATORS", "Loss", "MODES", "Term", "aggregate", "clipped_surrogate", "distillation_loss",
    "finalize", "finalize_metrics", "group_advantages", "kl_penalty", "overlong_penalty",
    "objective", "policy_loss", "sampled_distillation_loss", "scale", "term", "term_metrics",
    "RATIO_LEVELS", "SCALES", "token_surrogate", "token_weights",
    "atod_advantages", "flip_advantages", "flip_at", "grsd_advantages", "h2sd_advantages",
    "localise", "rlsd_advantages",
]
