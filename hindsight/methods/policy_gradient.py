"""The clipped-surrogate core shared by the GRPO family (grpo, dapo, drgrpo, hdl, pcsd, craft).

Two ways through the LM head, for two kinds of objective:

* :func:`surrogate_loss` (grpo, dapo, drgrpo, hdl): the objective is a sum of per-position terms
  whose coefficients (aggregation weight / the step's count) are known before the head runs, so
  the whole objective (``policy`` plus the optional ``kl`` term) is formed inside one
  :func:`~hindsight.methods.forward.vocab_sum`, whose fused backend forms the gradient in the
  forward pass: three matmuls per side, as dense logits. Token-level ratios only: GSPO's sequence
  ratio couples the positions of a row, and takes the second way.
* :func:`policy_rows` + :func:`surrogate_terms` (pcsd, craft, and ``ratio_level="sequence"``): one
  LM-head pass gives, per response position, the policy's log-prob of the sampled token (with
  gradient), its entropy, and the stop-gradient log-probs under the reference model and a teacher
  context; the caller combines them across positions (PCSD's windowed gate, CRAFT's sibling
  credit) before :func:`surrogate_terms` forms the ``policy`` term
  (:func:`hindsight.objectives.policy_loss`) and, with a KL coefficient, a ``kl`` term aggregated
  the same way. The backward pass recomputes the logits (four matmuls per trained side).

Both give the same terms, metrics and gradients (tests/methods/test_surrogate_paths.py).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import jax

from hindsight._validation import check_choice, check_static_float
import jax.numpy as jnp

from hindsight.methods.forward import LMHead, Side, context_hidden, gather, vocab_rows, vocab_sum
from hindsight.methods.method import LossConfig
from hindsight.objectives import (RATIO_LEVELS, SCALES, Loss, Term, aggregate, kl_penalty,
                                  policy_loss, scale, term, token_surrogate, token_weights)
from hindsight.objectives.aggregation import as_mask
from hindsight.objectives.kl_estimators import LOG_RATIO_CLIP
from hindsight.objectives.policy import broadcast_advantages
from hindsight.ops import entropy_from_logprobs, kl_from_logprobs


@dataclasses.dataclass(frozen=True)
class SurrogateConfig(LossConfig):
    """Clipped-surrogate options (verl defaults, spec §1.1).

    Attributes:
      eps_low: ``rho >= 1 - eps_low``. eps_high: ``rho <= 1 + eps_high``.
      dual_clip: bound ``-A c`` on the loss of ``A < 0`` tokens (verl ``clip_ratio_c = 3``); None =
        off.
      advantage_scale: read by the rollout layer, which computes the advantages
        (:func:`hindsight.objectives.group_advantages` ``scale``): ``"std"`` (GRPO), ``"none"``
        (Dr.GRPO) or ``"batch"`` (TRL ``scale_rewards="batch"``: the group mean subtracted, the
        batch's reward std divided).
      ratio_level: ``"token"`` (PPO/GRPO ratios) or ``"sequence"`` (GSPO's length-normalised
        sequence ratio, verl ``gspo``; pair it with GSPO's clip ranges, e.g. ``eps_low=3e-4,
        eps_high=4e-4``), see :func:`hindsight.objectives.clipped_surrogate`.
    """
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = 3.0
    advantage_scale: str = "std"
    ratio_level: str = "token"

    def __post_init__(self):
        super().__post_init__()
        check_static_float("eps_low", self.eps_low, low=0.0, high=1.0)
        check_static_float("eps_high", self.eps_high, low=0.0)
        if self.dual_clip is not None and not check_static_float("dual_clip", self.dual_clip) > 1:
            raise ValueError(f"`dual_clip` must be > 1 (or None), got {self.dual_clip}")
        check_choice("advantage_scale", self.advantage_scale, SCALES)
        check_choice("ratio_level", self.ratio_level, RATIO_LEVELS)


def policy_mask(batch: Mapping) -> jax.Array:
    """``[B, T]`` the loss mask of the policy-gradient term: ``batch["mask"]`` with the rows
    whose ``policy_row_mask`` is 0 cleared (:mod:`hindsight.batch`); the mask itself when the
    batch has none. The term's count (its normaliser) follows, so such rows neither add to the
    term nor dilute it."""
    mask = batch["mask"]
    if "policy_row_mask" not in batch:
        return mask
    keep = as_mask(batch["policy_row_mask"])[:, None]
    return jnp.where(keep, mask, jnp.zeros((), jnp.asarray(mask).dtype))


def policy_rows(model, batch: Mapping, config: LossConfig, *, head: LMHead | None = None,
                reference=None, teacher: Side | None = None, teacher_kl: bool = False,
                extra: Callable | None = None) -> dict[str, jax.Array]:
    """Per-position policy quantities from one chunked pass, each ``[B, T]`` float32.

    Args:
      model: the trained policy (gradient flows through ``logp`` and ``teacher_kl``).
      batch: the batch dict.
      config: supplies ``temperature``.
      head: the LM head (backend, blocks, vocabulary mask).
      reference: optional reference model, run on the policy context (no gradient).
      teacher: optional frozen teacher side (e.g. ``context_hidden(model, batch, "teacher",
        frozen=True)``).
      teacher_kl: also return the full-vocabulary ``KL(policy || teacher)`` (with gradient).
      extra: ``extra(logp, tokens) -> {name: [C]}``, further per-position reductions of the same
        log-softmaxes (``logp["policy"]``, ``logp["teacher"]``, ...; e.g. a top-k divergence),
        computed in the same pass.
    Returns:
      ``logp`` (grad), ``entropy`` (no grad); ``ref_logp`` with ``reference``; ``teacher_logp``
      with ``teacher``; ``teacher_kl`` when asked; ``extra``'s outputs.
    """
    if teacher_kl and teacher is None:
        raise ValueError("`teacher_kl` needs a `teacher` side")
    sides = {"policy": context_hidden(model, batch)}
    if reference is not None:
        sides["reference"] = context_hidden(reference, batch, frozen=True)
    if teacher is not None:
        sides["teacher"] = teacher

    def row(logp, tokens):
        out = {"logp": gather(logp["policy"], tokens),
               "entropy": jax.lax.stop_gradient(entropy_from_logprobs(logp["policy"]))}
        if "reference" in logp:
            out["ref_logp"] = gather(logp["reference"], tokens)
        if "teacher" in logp:
            out["teacher_logp"] = gather(logp["teacher"], tokens)
        if teacher_kl:
            out["teacher_kl"] = kl_from_logprobs(logp["policy"], logp["teacher"])
        if extra is not None:
            out.update(extra(logp, tokens))
        return out

    return vocab_rows(row, sides, batch["targets"], batch["mask"], head=head,
                      temperature=config.temperature)


def surrogate_terms(rows: Mapping[str, jax.Array], batch: Mapping, config: SurrogateConfig, *,
                    mode: str = "token-mean", norm: float | None = None, kl_coef: float = 0.0,
                    kl_estimator: str = "k3") -> tuple[dict[str, Term], dict]:
    """The clipped surrogate as the ``policy`` term (aggregated with ``mode``) and, when
    ``kl_coef > 0``, ``kl_coef`` x the estimated KL to the reference as the ``kl`` term (same
    aggregation, so verl's ``pg + kl_coef * kl`` exactly).

    Returns:
      ``(terms, metrics)``: ``metrics`` are those of :func:`hindsight.objectives.policy_loss` (clip
      fractions, ratio, approx_kl; ``kl`` when ``rows`` has ``ref_logp`` and the KL is not a term)
      plus the policy ``entropy`` (token-mean over the loss mask).
    """
    mask = policy_mask(batch)
    total, count, metrics = policy_loss(
        rows["logp"], batch["logp_old"], batch["advantages"], mask, eps_low=config.eps_low,
        eps_high=config.eps_high, dual_clip=config.dual_clip, mode=mode, norm=norm,
        ratio_level=config.ratio_level)
    del metrics["pg_loss"]  # the policy term itself
    terms = {"policy": Term(sum=total, count=count, mode=mode)}
    if "ref_logp" in rows:
        kl = term(kl_penalty(rows["logp"], rows["ref_logp"], mask, estimator=kl_estimator), mask,
                  mode=mode, norm=norm, weight=kl_coef)
        if kl_coef > 0.0:
            terms["kl"] = kl
        else:
            metrics["kl"] = (jax.lax.stop_gradient(kl.sum), kl.count)
    metrics["entropy"] = aggregate(rows["entropy"], mask)
    return terms, metrics


_CLIP_METRICS = ("clip_low_frac", "clip_high_frac", "dual_clip_frac", "ratio", "approx_kl")


def surrogate_loss(model, batch: Mapping, config: SurrogateConfig, *, head: LMHead | None = None,
                   reference=None, counts: Mapping | None = None, mode: str = "token-mean",
                   norm: float | None = None, kl_coef: float = 0.0,
                   kl_estimator: str = "k3") -> Loss:
    """The ``policy`` term (and, with ``kl_coef > 0``, the ``kl`` term) and their objective, formed
    position by position in one :func:`~hindsight.methods.forward.vocab_sum`.

    Each position's contribution is ``scale_policy * w_t * l_t + scale_kl * w_t * kl_t``, with
    ``w_t`` the aggregation weight of ``mode`` (:func:`hindsight.objectives.token_weights`) and
    ``scale_k = weight_k / count_k``, ``count_k`` from ``counts`` (the step's whole-batch counts)
    or, without it, this batch's own. The same terms, metrics and objective as
    ``surrogate_terms(policy_rows(...))`` (to float reassociation), which this falls back to for
    ``ratio_level="sequence"``.

    Returns:
      A :class:`~hindsight.objectives.Loss` with ``objective`` set (token level): terms and
      metrics as :func:`surrogate_terms`.
    """
    if config.ratio_level != "token":
        rows = policy_rows(model, batch, config, head=head, reference=reference)
        return Loss(*surrogate_terms(rows, batch, config, mode=mode, norm=norm, kl_coef=kl_coef,
                                     kl_estimator=kl_estimator))
    mask = policy_mask(batch)
    m = as_mask(mask)
    weights = token_weights(mask, mode=mode, norm=norm)
    _, count = aggregate(jnp.zeros(weights.shape, jnp.float32), mask, mode=mode, norm=norm)
    with_kl = kl_coef > 0.0
    counts = counts or {}
    extras = {"live": m.astype(jnp.float32), "logp_old": batch["logp_old"],
              "adv": broadcast_advantages(batch["advantages"], weights.shape),
              "coef": scale(1.0, counts.get("policy", count)) * weights}
    if with_kl:
        extras["coef_kl"] = scale(kl_coef, counts.get("kl", count)) * weights
    sides = {"policy": context_hidden(model, batch)}
    if reference is not None:
        sides["reference"] = context_hidden(reference, batch, frozen=True)

    def row(logp, tokens, ex):
        lp = gather(logp["policy"], tokens)
        live = ex["live"] > 0
        log_ratio = jnp.where(live, lp - ex["logp_old"].astype(jnp.float32), 0.0)
        token_log_ratio = jnp.clip(log_ratio, -LOG_RATIO_CLIP, LOG_RATIO_CLIP)
        pg, low, high, dual, ratio = token_surrogate(
            token_log_ratio, log_ratio, jnp.where(live, ex["adv"], 0.0), live,
            eps_low=config.eps_low, eps_high=config.eps_high, dual_clip=config.dual_clip)
        loss = ex["coef"] * pg
        f32 = lambda b: b.astype(jnp.float32)
        aux = {"pg": pg, "entropy": entropy_from_logprobs(logp["policy"]),
               "clip_low_frac": f32(low), "clip_high_frac": f32(high),
               "dual_clip_frac": f32(dual), "ratio": ratio, "approx_kl": -token_log_ratio}
        if "reference" in logp:
            kl = kl_penalty(lp, gather(logp["reference"], tokens), live, estimator=kl_estimator)
            aux["kl"] = kl
            if with_kl:
                loss = loss + ex["coef_kl"] * kl
        return loss, aux

    total, aux = vocab_sum(row, sides, batch["targets"], mask, extras, head=head,
                           temperature=config.temperature)
    weighted = lambda x: jnp.sum(jnp.where(m, weights * x, 0.0))
    terms = {"policy": Term(sum=weighted(aux["pg"]), count=count, mode=mode)}
    metrics = {name: aggregate(aux[name], mask) for name in _CLIP_METRICS}
    if "kl" in aux:
        if with_kl:
            terms["kl"] = Term(sum=weighted(aux["kl"]), count=count, weight=kl_coef, mode=mode)
        else:
            metrics["kl"] = (weighted(aux["kl"]), count)
    metrics["entropy"] = aggregate(aux["entropy"], mask)
    return Loss(terms, metrics, objective=total)
