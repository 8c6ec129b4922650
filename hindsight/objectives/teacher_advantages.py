"""GRPO advantages modulated token by token by a teacher (spec ``other-methods.md``, wave-2
contract ``shared/spec/contract-wave2.md``): GRSD's bounded turn modulation (§1), RLSD's
teacher-magnitude / reward-direction weights (§2), ATOD's annealed mix (§4), H²SD's routing by
success (§13) and CriPO's advantage flip (§14).

Conventions (contract): ``advantages [B]`` the row's GRPO advantage; ``mask [B, T]`` bool or 0/1
on policy tokens; gathered log-probs ``[B, T]`` with arbitrary finite garbage where masked
(never read); ``turn_id [B, T]`` -1 off policy tokens. Every output is ``[B, T]`` float32, exactly
0 at masked positions, and stop-gradient (``jax.grad`` of its sum w.r.t. any input is 0).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight._validation import check_rank, check_same_shape, check_static_float
from hindsight.signals._common import as_f32, as_valid, valid_logits
from hindsight.signals.teacher_student import turn_reweighting
from hindsight.signals.turns import to_tokens, turn_table

_sg = jax.lax.stop_gradient


def _inputs(advantages, teacher_logprobs, student_logprobs, mask):
    check_rank("teacher_logprobs", teacher_logprobs, rank=2)
    check_same_shape(("teacher_logprobs", "student_logprobs"), teacher_logprobs, student_logprobs)
    valid = as_valid(mask, teacher_logprobs, like_name="teacher_logprobs")
    b = teacher_logprobs.shape[0]
    if tuple(jnp.shape(advantages)) != (b,):
        raise ValueError(f"`advantages` must be [B] = ({b},), got shape {jnp.shape(advantages)}")
    gap = jnp.where(valid, as_f32(teacher_logprobs) - as_f32(student_logprobs), 0.0)
    return _sg(as_f32(advantages)), _sg(gap), valid


def _clipped_ratio(advantages, gap, eps_w):
    """``clip(exp(sign(A) (l_T - l_S)), 1 - eps_w, 1 + eps_w)`` (the exponent bounded first: the
    clip makes the bound invisible and keeps ``exp`` finite)."""
    x = jnp.clip(jnp.sign(advantages)[:, None] * gap, -30.0, 30.0)
    return jnp.clip(jnp.exp(x), 1.0 - eps_w, 1.0 + eps_w)


def rlsd_advantages(advantages, teacher_logprobs, student_logprobs, mask, *, eps_w: float = 0.2,
                    lam: float = 1.0) -> jax.Array:
    """RLSD (§2 eqs 13-15 and the λ interpolation): the teacher sets the magnitude, the reward the
    direction, ``A ((1 - lam) + lam clip(exp(sign(A) (l_T - l_S)), 1 - eps_w, 1 + eps_w))``;
    ``lam = 1`` is eq 15. The λ schedule (0.5 decaying linearly to 0 over 50 steps, OUR CHOICE)
    is the caller's value of ``lam`` (may be traced)."""
    check_static_float("eps_w", eps_w, low=0.0)
    a, gap, valid = _inputs(advantages, teacher_logprobs, student_logprobs, mask)
    lam = jnp.asarray(lam, jnp.float32)
    value = a[:, None] * ((1.0 - lam) + lam * _clipped_ratio(a, gap, eps_w))
    return _sg(jnp.where(valid, value, 0.0))


def h2sd_advantages(advantages, teacher_logprobs, student_logprobs, mask, success, *,
                    eps_w: float = 0.2, gamma: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """H²SD's routing (§13, OUR CHOICE): on success rows the RLSD-weighted advantage ``A clip(exp(
    sign(A) (l_T - l_S)), 1 - eps_w, 1 + eps_w)`` and reverse-KL weight 0; on failure rows ``A``
    and reverse-KL weight ``gamma`` (the student top-100 + tail reverse KL,
    :func:`hindsight.ops.topk_divergence`).

    Args: ``success [B]`` bool or 0/1. Returns: ``(advantages [B, T], rkl_weight [B, T])``.
    """
    check_static_float("eps_w", eps_w, low=0.0)
    a, gap, valid = _inputs(advantages, teacher_logprobs, student_logprobs, mask)
    ok = (jnp.asarray(success) > 0)[:, None]
    adv = jnp.where(ok, a[:, None] * _clipped_ratio(a, gap, eps_w), a[:, None])
    rkl = jnp.where(ok, 0.0, jnp.asarray(gamma, jnp.float32))
    return (_sg(jnp.where(valid, adv, 0.0)),
            _sg(jnp.where(valid, jnp.broadcast_to(rkl, valid.shape), 0.0)))


def grsd_advantages(advantages, teacher_logprobs, student_logprobs, mask, turn_id, group_size,
                    valid, *, lam: float = 0.5, eta: float = 0.0, clip: float = 3.0,
                    floor: float = 0.1) -> jax.Array:
    """GRSD's turn-level bounded modulation (§1). Per turn ``k`` of row ``b``: ``delta = mean_turn
    l_T - mean_turn l_S``, ``e = expm1(clip(sign(A_b) delta, -20, 20))``; per group the mean
    ``e_bar`` of ``|e|`` over the turns of its rows with ``valid = 1`` (0 if none; a row without
    policy tokens has no turn); ``q = e / (e_bar + 1e-6)``, ``g = q`` where ``|q| > eta`` else 0,
    ``g_hat = clip(g valid_b, -clip, clip)``; the turn's tokens get ``A_b max(1 + lam g_hat
    valid_b, floor)``; a row with ``valid = 0`` gets exactly ``A_b``. (The official launcher uses
    ``clip=0.2``.)

    Args:
      turn_id: ``[B, T]``; group_size: static int, ``B % group_size == 0``; valid: ``[B]`` 0/1.
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"`group_size` must be a positive Python int, got {group_size!r}")
    a, gap, live = _inputs(advantages, teacher_logprobs, student_logprobs, mask)
    check_same_shape(("teacher_logprobs", "turn_id"), gap, turn_id)
    b = gap.shape[0]
    if b % group_size:
        raise ValueError(f"B={b} rows is not a whole number of groups of {group_size}")
    live = live & (turn_id >= 0)
    ok = jnp.asarray(valid) > 0
    sums, counts = turn_table(gap, turn_id, live)
    present = counts > 0
    delta = jnp.where(present, sums / jnp.maximum(counts, 1.0), 0.0)
    e = jnp.where(present, jnp.expm1(jnp.clip(jnp.sign(a)[:, None] * delta, -20.0, 20.0)), 0.0)
    used = present & ok[:, None]
    per_group = lambda x: x.reshape(b // group_size, -1).sum(-1)
    num, den = per_group(jnp.where(used, jnp.abs(e), 0.0)), per_group(used.astype(jnp.float32))
    e_bar = jnp.repeat(jnp.where(den > 0, num / jnp.maximum(den, 1.0), 0.0), group_size)
    q = e / (e_bar[:, None] + 1e-6)
    g = jnp.where(jnp.abs(q) > eta, q, 0.0)
    okf = ok.astype(jnp.float32)[:, None]
    g_hat = jnp.clip(g * okf, -clip, clip)
    scale = jnp.maximum(1.0 + lam * g_hat * okf, floor)
    value = jnp.where(ok[:, None], a[:, None] * to_tokens(scale, turn_id), a[:, None])
    return _sg(jnp.where(live, value, 0.0))


def atod_advantages(advantages, teacher_logprobs, student_logprobs, mask, turn_id, step, *,
                    anneal_steps: int = 80, kappa0: float = 1.0, kappa_min: float = 0.1,
                    rho0: float = 1.0, rho_max: float = 2.0) -> jax.Array:
    """ATOD (§4 eqs 8, 10-12): ``kappa (l_T - l_S) w_turn + rho A_b`` with ``p = min(step /
    anneal_steps, 1)``, ``kappa = max(kappa_min, kappa0 - (kappa0 - kappa_min) p)``, ``rho = rho0
    + (rho_max - rho0) p`` and ``w`` from :func:`hindsight.signals.turn_reweighting`. ``step`` may
    be traced."""
    if not anneal_steps > 0:
        raise ValueError(f"`anneal_steps` must be > 0, got {anneal_steps!r}")
    a, gap, valid = _inputs(advantages, teacher_logprobs, student_logprobs, mask)
    w = turn_reweighting(teacher_logprobs, student_logprobs, mask, turn_id)
    p = jnp.minimum(jnp.asarray(step, jnp.float32) / anneal_steps, 1.0)
    kappa = jnp.maximum(kappa_min, kappa0 - (kappa0 - kappa_min) * p)
    rho = rho0 + (rho_max - rho0) * p
    valid = valid & (turn_id >= 0)
    return _sg(jnp.where(valid, kappa * gap * w + rho * a[:, None], 0.0))


def flip_advantages(advantages, criterion_logits, plain_logits, tokens, mask, *,
                    tau_flip: float = 0.1) -> jax.Array:
    """CriPO's flip (§14 steps 4-5): ``loc_t = [l_T(c) - l_T(no c) > 0] and [argmax plain_t !=
    y_t]`` (both log-probs from the full log-softmax); on rows with ``A < 0`` the loc tokens get
    ``+tau_flip``, every other token keeps ``A``.

    Args: ``criterion_logits``, ``plain_logits`` ``[B, T, V]``; ``tokens [B, T]`` the sampled ids.
    """
    check_rank("criterion_logits", criterion_logits, rank=3)
    check_same_shape(("criterion_logits", "plain_logits"), criterion_logits, plain_logits)
    valid = as_valid(mask, tuple(criterion_logits.shape[:-1]),
                     like_name="criterion_logits[..., 0]")
    check_same_shape(("mask", "tokens"), valid, tokens)
    a = _sg(as_f32(advantages))
    zc = _sg(valid_logits(criterion_logits, valid))
    zp = _sg(valid_logits(plain_logits, valid))
    y = jnp.where(valid, jnp.asarray(tokens, jnp.int32), 0)[..., None]
    lc = jnp.take_along_axis(jax.nn.log_softmax(zc, axis=-1), y, axis=-1)[..., 0]
    lp = jnp.take_along_axis(jax.nn.log_softmax(zp, axis=-1), y, axis=-1)[..., 0]
    return flip_at(a, localise(lc, lp, jnp.argmax(zp, axis=-1) != y[..., 0]), valid,
                   tau_flip=tau_flip)


def localise(criterion_logp, plain_logp, plain_disagrees) -> jax.Array:
    """CriPO's localisation (§14 step 4) ``[B, T]`` bool from per-token quantities: the criterion
    raises the sampled token's log-prob (``criterion_logp - plain_logp > 0``, both at the sampled
    token) and the plain teacher's argmax is another token (``plain_disagrees``)."""
    return (_sg(as_f32(criterion_logp)) - _sg(as_f32(plain_logp)) > 0) & jnp.asarray(
        plain_disagrees, bool)


def flip_at(advantages, loc, mask, *, tau_flip: float = 0.1) -> jax.Array:
    """CriPO's flip (§14 step 5) ``[B, T]``: on rows with ``A < 0`` the ``loc`` tokens get
    ``+tau_flip``, every other token keeps ``A`` (0 where masked)."""
    a = _sg(as_f32(advantages))
    valid = jnp.asarray(mask) > 0
    value = jnp.where((a < 0)[:, None] & loc, jnp.float32(tau_flip), a[:, None])
    return _sg(jnp.where(valid, value, 0.0))
