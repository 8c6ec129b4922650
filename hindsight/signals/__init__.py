"""Credit signals (spec ``core-signals.md`` §2-§6): pure, jit/vmap/grad-safe functions.

Two stages: per-position vocabulary reductions (on logits ``[B, T, V]`` or log-probs ``[..., V]``,
chunkable) feed ``[B, T]`` sequence/group transforms (``*_from_gap`` / ``*_from_logprobs``). Every
target, gate and credit is stop-gradient'ed; masked positions give 0; losses return ``(sum, count)``.

* :mod:`~hindsight.signals.hindsight_divergence` — HDL score and branch-point selection (§2).
* :mod:`~hindsight.signals.persistence` — PCSD persistence-consistency gate and loss (§3).
* :mod:`~hindsight.signals.counterfactual` — CRAFT credit, CTI loss, controller, polarised KL (§4).
* :mod:`~hindsight.signals.pmi` — OPSD-PMI purified target and JSD loss (§5).
* :mod:`~hindsight.signals.barycenter` — DemoPSD geometric target, disagreement alpha, loss (§6).
* :mod:`~hindsight.signals.neurons` — Neuron-OPSD's neuron scores, the neuron set of a response,
  consensus, Jaccard distances, the bottom-fraction selection and K-nearest retrieval
  (other-methods §8).
* :mod:`~hindsight.signals.turns` — segment reductions over the turns of multi-turn rows
  (``turn_id``, other-methods §0): turn sums / means, broadcast back to tokens, min-max.
* :mod:`~hindsight.signals.teacher_student` — the other methods' per-token teacher / student
  signals (other-methods §3-§14, wave-2 contract): top-K forward and top-K + tail KLs, T-DUR and
  TurnOPD turn weights, CBSD and SEED gates, CriPO's contribution filter, β-OPSD's mixture target
  and return-to-go, recoverability labels.
"""
from hindsight.signals._common import LOGP_TARGET_FLOOR
from hindsight.signals.barycenter import (barycenter_kl_from_logprobs, barycenter_loss,
                                          barycenter_target, barycenter_target_from_logprobs,
                                          disagreement_alpha, geometric_target_from_logprobs)
from hindsight.signals.counterfactual import (ControllerState, controller_init, controller_update,
                                              counterfactual_credit, counterfactual_credit_from_gap,
                                              craft_loss_terms, credit_activity, cti_loss,
                                              polarised_kl, reverse_k3)
from hindsight.signals.hindsight_divergence import (BRANCH_COUNTS, branch_counts,
                                                    hindsight_divergence,
                                                    hindsight_divergence_from_logprobs,
                                                    select_branch_points)
from hindsight.signals.neurons import (bottom_fraction, chunk_candidates, consensus, init_top,
                                       jaccard_distances, merge_top, nearest, neuron_scores,
                                       union_mask)
from hindsight.signals.persistence import (PersistenceStats, pcsd_loss, persistence_gate,
                                           persistence_gate_from_gap, persistence_loss,
                                           persistence_stats_from_gap)
from hindsight.signals.pmi import (pmi_jsd_from_logprobs, pmi_loss, pmi_target,
                                   pmi_target_from_logprobs)
from hindsight.signals.teacher_student import (cbsd_credit, contribution_filter, mixture_target,
                                              recoverability_labels, return_to_go,
                                              skill_shift_gate, topk_forward_kl, topk_tail_kl,
                                              turn_loss_weights, turn_reweighting)
from hindsight.signals.turns import (to_tokens, trajectory_minmax, turn_mean, turn_sums,
                                     turn_table, turn_valid)

__all__ = [
    "BRANCH_COUNTS", "LOGP_TARGET_FLOOR", "ControllerState", "PersistenceStats",
    "barycenter_kl_from_logprobs", "barycenter_loss", "barycenter_target",
    "barycenter_target_from_logprobs", "branch_counts", "controller_init", "controller_update",
    "counterfactual_credit", "counterfactual_credit_from_gap", "craft_loss_terms", "credit_activity",
    "cti_loss", "disagreement_alpha", "geometric_target_from_logprobs", "hindsight_divergence",
    "hindsight_divergence_from_logprobs", "pcsd_loss", "persistence_gate",
    "persistence_gate_from_gap", "persistence_loss", "persistence_stats_from_gap",
    "pmi_jsd_from_logprobs", "pmi_loss", "pmi_target", "pmi_target_from_logprobs", "polarised_kl",
    "reverse_k3", "select_branch_points", "to_tokens", "trajectory_minmax", "turn_mean",
    "turn_sums", "turn_valid", "turn_table", "cbsd_credit", "contribution_filter",
    "mixture_target", "recoverability_labels", "return_to_go", "skill_shift_gate",
    "topk_forward_kl", "topk_tail_kl", "turn_loss_weights", "turn_reweighting",
    "bottom_fraction", "chunk_candidates", "consensus", "init_top", "jaccard_distances",
    "merge_top", "nearest", "neuron_scores", "union_mask",
]
