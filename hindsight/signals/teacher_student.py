"""Per-token signals from a teacher and a student (spec ``other-methods.md``, wave-2 contract,
``shared/spec/contract-wave2.md``): truncated forward / reverse KLs over the teacher's top-K, the
turn weights of T-DUR and TurnOPD, the SEED and CBSD gates, CriPO's contribution filter, the
β-OPSD mixture target and return-to-go, and counterfactual recoverability's labels.

Conventions (contract): ``mask [B, T]`` bool or 0/1 (1 on policy tokens), ``turn_id [B, T]`` the
turn on policy tokens (-1 elsewhere; ids in ``[0, T)``, non-decreasing, may skip), gathered
log-probs ``[B, T]`` with arbitrary finite garbage where masked (never read), logits
``[B, T, V]``. Outputs are float32 and exactly 0 at masked positions; gates, weights, credits
and keep masks are stop-gradient; the two KLs pass gradient to the student only.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight._validation import check_rank, check_same_shape
from hindsight.signals._common import as_f32, as_valid, valid_logits
from hindsight.signals.turns import to_tokens, turn_table

_sg = jax.lax.stop_gradient


def _pair(teacher_logprobs, student_logprobs, mask):
    check_rank("teacher_logprobs", teacher_logprobs, rank=2)
    check_same_shape(("teacher_logprobs", "student_logprobs"), teacher_logprobs, student_logprobs)
    valid = as_valid(mask, teacher_logprobs, like_name="teacher_logprobs")
    lt = jnp.where(valid, as_f32(teacher_logprobs), 0.0)
    ls = jnp.where(valid, as_f32(student_logprobs), 0.0)
    return lt, ls, valid


def _top_k(name: str, top_k) -> None:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"`{name}` must be a positive Python int, got {top_k!r}")


def _logit_pair(teacher_logits, student_logits, mask):
    check_rank("teacher_logits", teacher_logits, rank=3)
    check_same_shape(("teacher_logits", "student_logits"), teacher_logits, student_logits)
    valid = as_valid(mask, tuple(teacher_logits.shape[:-1]), like_name="teacher_logits[..., 0]")
    return _sg(valid_logits(teacher_logits, valid)), valid_logits(student_logits, valid), valid


def topk_forward_kl(teacher_logits, student_logits, mask, *, top_k: int = 32) -> jax.Array:
    """UCOB / CBSD's truncated forward KL (§3 step 6): over the teacher's top ``K = min(top_k, V)``
    ids (ties: the smaller id first), both sides renormalised there,
    ``sum_k p_T^K (log p_T^K - log p_S^K)``.

    Args: ``teacher_logits``, ``student_logits`` ``[B, T, V]``; ``mask [B, T]``.
    Returns: ``[B, T]`` float32 (gradient to the student logits only).
    """
    _top_k("top_k", top_k)
    zt, zs, valid = _logit_pair(teacher_logits, student_logits, mask)
    k = min(top_k, zt.shape[-1])
    top, ids = jax.lax.top_k(zt, k)  # equal logits: the lower index first
    lp_t = jax.nn.log_softmax(top, axis=-1)
    lp_s = jax.nn.log_softmax(jnp.take_along_axis(zs, ids, axis=-1), axis=-1)
    value = jnp.sum(jnp.exp(lp_t) * (lp_t - lp_s), axis=-1)
    return jnp.where(valid, value, 0.0)


def topk_tail_kl(teacher_logits, student_logits, mask, *, top_k: int = 16,
                 min_residual: float = 1e-6) -> jax.Array:
    """OVCSD's top-K + tail KL (§7 eq 8): ``sum_{k in topK(q)} q (log q - log p)`` with the full
    softmaxes ``q`` (teacher) and ``p`` (student), plus the tail bucket ``q_res (log q_res - log
    p_res)``, ``q_res = max(1 - sum_k q_k, min_residual)`` and ``p_res`` likewise (both clamped, so
    ``K >= V`` stays finite).

    Args: ``teacher_logits``, ``student_logits`` ``[B, T, V]``; ``mask [B, T]``.
    Returns: ``[B, T]`` float32 (gradient to the student logits only).
    """
    _top_k("top_k", top_k)
    if not min_residual > 0:
        raise ValueError(f"`min_residual` must be > 0, got {min_residual!r}")
    zt, zs, valid = _logit_pair(teacher_logits, student_logits, mask)
    k = min(top_k, zt.shape[-1])
    lq_all = jax.nn.log_softmax(zt, axis=-1)
    lp_all = jax.nn.log_softmax(zs, axis=-1)
    lq, ids = jax.lax.top_k(lq_all, k)
    lp = jnp.take_along_axis(lp_all, ids, axis=-1)
    head = jnp.sum(jnp.exp(lq) * (lq - lp), axis=-1)
    q_res = jnp.maximum(1.0 - jnp.sum(jnp.exp(lq), axis=-1), min_residual)
    p_res = jnp.maximum(1.0 - jnp.sum(jnp.exp(lp), axis=-1), min_residual)
    tail = q_res * (jnp.log(q_res) - jnp.log(p_res))
    return jnp.where(valid, head + tail, 0.0)


def cbsd_credit(teacher_logprobs, student_logprobs, mask, action_mask, gaps, *,
                beta_gate: float = 5.0, tau: float = 0.2, w_max: float = 2.0,
                margin: float = 0.05, action_weight: float = 2.0) -> jax.Array:
    """CBSD's per-token credit (§3 steps 5-6): ``sigmoid(beta_gate (l_T - l_S)) * w_b * a_t``
    with ``w_b = clip(gap_b / tau, 0, w_max)`` when ``gap_b > margin`` (else 0: the pair is
    dropped) and ``a_t = action_weight`` on action tokens, 1 elsewhere. Stop-gradient.

    Args:
      teacher_logprobs, student_logprobs: ``[B, T]``; mask, action_mask: ``[B, T]``;
      gaps: ``[B]`` the pair's success-rate gap.
    Returns: ``[B, T]`` float32.
    """
    lt, ls, valid = _pair(teacher_logprobs, student_logprobs, mask)
    action = as_valid(action_mask, lt, name="action_mask", like_name="teacher_logprobs")
    gaps = jnp.where(jnp.isfinite(as_f32(gaps)), as_f32(gaps), 0.0)
    w = jnp.where(gaps > margin, jnp.clip(gaps / tau, 0.0, w_max), 0.0)
    a = jnp.where(action, jnp.float32(action_weight), 1.0)
    credit = jax.nn.sigmoid(beta_gate * (lt - ls)) * w[:, None] * a
    return _sg(jnp.where(valid, credit, 0.0))


def skill_shift_gate(skill_logprobs, ordinary_logprobs, mask, *, beta: float = 5.0) -> jax.Array:
    """SEED's gate (§11): ``sigmoid(beta (l_skill - l_ord))``, stop-gradient; the SEED / SDAR loss
    is ``g (sg(l_skill) - l_ord)``. Returns ``[B, T]`` float32 in (0, 1) on policy tokens."""
    lk, lo, valid = _pair(skill_logprobs, ordinary_logprobs, mask)
    return _sg(jnp.where(valid, jax.nn.sigmoid(beta * (lk - lo)), 0.0))


def _turn_means(x, turn_id, valid):
    """Per-turn means broadcast back to tokens, and the ``[B, T]`` table's presence mask."""
    sums, counts = turn_table(x, turn_id, valid)
    means = jnp.where(counts > 0, sums / jnp.maximum(counts, 1.0), 0.0)
    return means, counts > 0


def _row_minmax(values, present):
    """Each row's present turns rescaled to [0, 1]; a range below 1e-8 gives 0.5."""
    lo = jnp.min(jnp.where(present, values, jnp.inf), axis=-1, keepdims=True)
    hi = jnp.max(jnp.where(present, values, -jnp.inf), axis=-1, keepdims=True)
    spread = jnp.where(present.any(-1, keepdims=True), hi - lo, 0.0)
    lo = jnp.where(present.any(-1, keepdims=True), lo, 0.0)
    scaled = (values - lo) / jnp.where(spread < 1e-8, 1.0, spread)
    return jnp.where(present, jnp.where(spread < 1e-8, 0.5, scaled), 0.0)


def turn_reweighting(teacher_logprobs, student_logprobs, mask, turn_id) -> jax.Array:
    """T-DUR's turn weights (§4 eqs 13-16): per turn ``d = mean |l_S - l_T|`` and ``h =
    mean(-l_S)``, each min-maxed over the row's turns (a range below 1e-8 gives 0.5: a single
    turn gets 0.75), ``w = 1 - (1 - d~)(1 - h~)`` on the turn's tokens. Stop-gradient.

    Returns: ``[B, T]`` float32 in [0, 1].
    """
    lt, ls, valid = _pair(teacher_logprobs, student_logprobs, mask)
    check_same_shape(("teacher_logprobs", "turn_id"), lt, turn_id)
    valid = valid & (turn_id >= 0)
    d, present = _turn_means(jnp.abs(ls - lt), turn_id, valid)
    h, _ = _turn_means(-ls, turn_id, valid)
    w = 1.0 - (1.0 - _row_minmax(d, present)) * (1.0 - _row_minmax(h, present))
    return _sg(jnp.where(valid, to_tokens(w, turn_id), 0.0))


def turn_loss_weights(mask, turn_id, alpha) -> jax.Array:
    """TurnOPD's controller B weights (§9, per trajectory): ``q_k = (1 - alpha) n_k / N + alpha /
    T_b`` (``n_k`` the turn's tokens, ``N`` the row's, ``T_b`` its turns present), each token of
    turn ``k`` gets ``q_k / n_k``, so a non-empty row sums to 1 (``alpha = 0``: the row's token
    mean). ``alpha`` may be traced. Stop-gradient.

    Returns: ``[B, T]`` float32.
    """
    check_rank("turn_id", turn_id, rank=2)
    valid = as_valid(mask, turn_id, like_name="turn_id") & (turn_id >= 0)
    _, counts = turn_table(jnp.zeros(turn_id.shape, jnp.float32), turn_id, valid)
    total = counts.sum(-1, keepdims=True)
    turns = (counts > 0).sum(-1, keepdims=True).astype(jnp.float32)
    alpha = jnp.asarray(alpha, jnp.float32)
    q = (1.0 - alpha) * counts / jnp.maximum(total, 1.0) + alpha / jnp.maximum(turns, 1.0)
    per_token = jnp.where(counts > 0, q / jnp.maximum(counts, 1.0), 0.0)
    return _sg(jnp.where(valid, to_tokens(per_token, turn_id), 0.0))


def contribution_filter(fkl, mask, *, share: float = 0.95) -> jax.Array:
    """CriPO's contribution filter (§14 step 2): within each row the policy tokens ranked by
    ``fkl`` descending (ties: the smaller ``t`` first); ``t`` is kept iff the ``fkl`` ranked
    strictly before it sums to less than ``share * sum_row fkl`` (the smallest prefix reaching the
    share; a row summing to 0 keeps nothing). ``L_inj = sum keep fkl / sum keep`` is the caller's.

    Returns: ``[B, T]`` float32 0/1, stop-gradient.
    """
    check_rank("fkl", fkl, rank=2)
    valid = as_valid(mask, fkl, like_name="fkl")
    x = _sg(jnp.where(valid, as_f32(fkl), 0.0))
    order = jnp.argsort(jnp.where(valid, -x, jnp.inf), axis=-1, stable=True)
    ranked = jnp.take_along_axis(x, order, axis=-1)
    before = jnp.cumsum(ranked, axis=-1) - ranked
    keep_ranked = (before < share * x.sum(-1, keepdims=True)) & jnp.take_along_axis(
        valid, order, axis=-1)
    keep = jnp.zeros_like(keep_ranked).at[jnp.arange(x.shape[0])[:, None], order].set(keep_ranked)
    return keep.astype(jnp.float32)


def mixture_target(ref_logits, teacher_logits, *, w: float = 0.5, mix: str = "geometric"):
    """β-OPSD's reference-anchored target (§5 step 1) as log-probs over any leading dims:
    ``"geometric"`` (the paper's, default) ``log_softmax((1 - w) z_ref + w z_T)``; ``"arithmetic"``
    (the released code's) ``log((1 - w) pi_ref + w p_T)`` in log space. ``w = 1`` is
    ``log_softmax(z_T)`` (vanilla OPSD). Differentiable (the method applies ``sg`` itself)."""
    if mix not in ("geometric", "arithmetic"):
        raise ValueError(f"`mix` must be 'geometric' or 'arithmetic', got {mix!r}")
    check_same_shape(("ref_logits", "teacher_logits"), ref_logits, teacher_logits)
    zr, zt = as_f32(ref_logits), as_f32(teacher_logits)
    w = jnp.asarray(w, jnp.float32)
    if mix == "geometric":
        return jax.nn.log_softmax((1.0 - w) * zr + w * zt, axis=-1)
    lr, lt = jax.nn.log_softmax(zr, axis=-1), jax.nn.log_softmax(zt, axis=-1)
    # weights of 0 drop their side exactly (no log(0) in the values or the gradient)
    a = jnp.where(w < 1.0, jnp.log(jnp.where(w < 1.0, 1.0 - w, 1.0)) + lr, -jnp.inf)
    b = jnp.where(w > 0.0, jnp.log(jnp.where(w > 0.0, w, 1.0)) + lt, -jnp.inf)
    hi = jnp.maximum(a, b)
    return hi + jnp.log(jnp.exp(a - hi) + jnp.exp(b - hi))


def return_to_go(rewards, mask, *, gamma: float = 0.99, turn_id=None) -> jax.Array:
    """β-OPSD's discounted return-to-go (§5 step 3): ``G_t = sum_{s >= t} gamma^(s - t) m_s r_s``
    within the row (``s - t`` counts positions: observation tokens discount but add nothing);
    with ``turn_id`` only the ``s`` of t's turn count. Linear in ``rewards`` (differentiable as
    written; the method applies ``sg(G)``).

    Args: ``rewards [B, T]`` per-token rewards; ``mask [B, T]``; optional ``turn_id [B, T]``.
    Returns: ``[B, T]`` float32, 0 at masked positions.
    """
    check_rank("rewards", rewards, rank=2)
    valid = as_valid(mask, rewards, like_name="rewards")
    r = jnp.where(valid, as_f32(rewards), 0.0)
    ids = (jnp.zeros(r.shape, jnp.int32) if turn_id is None
           else jnp.where(valid, jnp.asarray(turn_id, jnp.int32), -1))
    gamma = jnp.asarray(gamma, jnp.float32)

    def back(carry, xs):
        acc, turn = carry
        r_t, v_t, id_t = xs
        same = turn == id_t
        acc_v = r_t + gamma * jnp.where(same, acc, 0.0)
        acc = jnp.where(v_t, acc_v, gamma * acc)
        turn = jnp.where(v_t, id_t, turn)
        return (acc, turn), jnp.where(v_t, acc_v, 0.0)

    init = (jnp.zeros(r.shape[0], jnp.float32), jnp.full(r.shape[0], -2, jnp.int32))
    _, out = jax.lax.scan(back, init, (r.T, valid.T, ids.T), reverse=True)
    return out.T


def recoverability_labels(p_cont, p_roll, *, recoverable_min: float = 0.5,
                          irreversible_max: float = 0.25, rollback_min: float = 0.5) -> jax.Array:
    """Counterfactual recoverability's labels (§10 step 3), any shape: 1 recoverable (``p_cont >=
    recoverable_min``, tested first), 2 irreversible-but-avoidable (``p_cont <= irreversible_max``
    and ``p_roll >= rollback_min``), 0 ambiguous (the fallback to ordinary supervision);
    comparisons inclusive. Returns int32."""
    check_same_shape(("p_cont", "p_roll"), p_cont, p_roll)
    pc, pr = as_f32(p_cont), as_f32(p_roll)
    return jnp.where(pc >= recoverable_min, 1,
                     jnp.where((pc <= irreversible_max) & (pr >= rollback_min), 2, 0)
                     ).astype(jnp.int32)
