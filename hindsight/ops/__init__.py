"""Vocabulary-axis primitives on logits ``[..., V]`` (float32 accumulation whatever the input dtype).

Dense functions take logits; the :mod:`hindsight.ops.chunked` functions compute the same reductions
from hidden states ``[B, T, D]`` and an unembedding ``[D, V]`` chunk by chunk, so that a training loss
never materialises float32 ``[B, T, V]`` logits; :func:`lm_head_map` is the
training path's LM head, with backends :data:`LM_HEAD_BACKENDS` (``"scan"``, ``"fused"``, ``"dense"``).
"""
from hindsight.ops.logprobs import (LOGP_FLOOR, PAD_LOGIT, carry_nonfinite, entropy,
                                    entropy_from_logprobs, log_softmax, masked_logits,
                                    token_logprobs)
from hindsight.ops.divergences import (generalized_jsd, generalized_jsd_from_logprobs, kl,
                                       kl_from_logprobs)
from hindsight.ops.topk import (TAIL_CAP, renormalized_topk_logprobs, topk_divergence,
                                topk_divergence_from_logprobs, topk_tail_logprobs)
from hindsight.ops._chunking import default_chunk_size
from hindsight.ops.chunked import (chunked_entropy, chunked_generalized_jsd,
                                   chunked_kl, chunked_token_logprobs,
                                   chunked_topk_divergence)
from hindsight.ops.fused import DISTILLATION_LOSSES, fused_distillation_loss
from hindsight.ops.lm_head import BACKENDS as LM_HEAD_BACKENDS, DEFAULT_BACKEND as LM_HEAD_DEFAULT
from hindsight.ops.lm_head import lm_head_map, lm_head_sum

__all__ = [
    "LOGP_FLOOR", "PAD_LOGIT", "TAIL_CAP", "carry_nonfinite", "entropy", "entropy_from_logprobs", "generalized_jsd",
    "generalized_jsd_from_logprobs", "kl", "kl_from_logprobs", "log_softmax", "masked_logits",
    "renormalized_topk_logprobs", "token_logprobs", "topk_divergence",
    "topk_divergence_from_logprobs", "topk_tail_logprobs",
    "DISTILLATION_LOSSES", "chunked_entropy", "chunked_generalized_jsd", "chunked_kl",
    "chunked_token_logprobs", "chunked_topk_divergence", "default_chunk_size",
    "fused_distillation_loss", "LM_HEAD_BACKENDS", "LM_HEAD_DEFAULT", "lm_head_map", "lm_head_sum",
]
