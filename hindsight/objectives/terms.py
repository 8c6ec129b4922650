"""Named loss terms: what every method loss returns.

A method's objective is a weighted sum of terms, each a mean with its own normaliser::

    L = sum_k  weight_k * sum_k / max(count_k, 1)

e.g. a Dr.GRPO policy term (sequence sums over a constant, ``count`` = rows) plus a token-mean
distillation term (``count`` = tokens). A :class:`Term` carries the *unnormalised* ``sum``, its
``count`` and its ``weight``, so the train step can add ``(sum, count)`` pairs over micro-batches
and devices per term and divide once per term per optimizer step: the result is the full-batch
objective however the batch was split.

Two rules make that exact (the step relies on them, the invariance tests check them):

* ``count`` depends on the batch only (tokens, rows, a constant), never on the parameters: the
  step computes every term's count over the whole batch before the gradient pass (a pass XLA
  reduces to the mask arithmetic) and scales each micro-batch's sums by ``weight / count``, so one
  gradient accumulator serves every term.
* ``weight`` depends on the configuration or the method state only (a constant, a controller's
  ``lambda``), never on the batch or the parameters, so it is the same in every micro-batch.

A :class:`Loss` is ``terms`` plus ``metrics`` (``(sum, count)`` pairs, reported, not optimised),
and optionally its ``objective`` already formed: a loss that is told the step's term counts (the
``counts`` keyword the train step passes to a ``loss_fn`` that accepts it) can build
``sum_k weight_k * sum_k / count_k`` one position at a time inside the LM head
(:func:`hindsight.ops.lm_head_sum`, whose fused backend forms the gradient in the forward pass);
its terms' sums are then reported values, and the step differentiates ``objective``.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from hindsight.objectives.aggregation import aggregate, check_mode


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Term:
    """One named term of an objective: ``weight * sum / max(count, 1)`` once pairs are combined.

    Attributes:
      sum: float32 scalar, the unnormalised sum (carries the gradient).
      count: float32 scalar normaliser (tokens, rows or a constant); must not depend on the
        parameters.
      weight: float32 scalar (or Python float) multiplying the finalized mean; must not depend on
        the batch or the parameters.
      mode: the aggregation that produced ``(sum, count)`` (:data:`hindsight.objectives.MODES`),
        for reports; static.
    """
    sum: jax.Array
    count: jax.Array
    weight: jax.Array | float = 1.0
    mode: str = dataclasses.field(default="token-mean", metadata=dict(static=True))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Loss:
    """What a method's ``loss_fn`` returns.

    Attributes:
      terms: ``{name: Term}``, at least one; names such as ``policy``, ``kl``, ``distill``.
      metrics: ``{name: (sum, count)}`` pairs (no gradient needed), finalized like the terms.
      objective: None, or the float32 scalar ``sum_k weight_k * terms[k].sum / max(count_k, 1)``
        formed by the loss itself (carrying the gradient; the terms' sums then need none), with
        ``count_k`` the counts the loss was given (``counts=``) or, without them, each term's own.
    """
    terms: dict
    metrics: dict = dataclasses.field(default_factory=dict)
    objective: jax.Array | None = None

    def value(self) -> jax.Array:
        """The objective of this batch alone: ``sum_k weight_k * sum_k / max(count_k, 1)``
        (``objective`` when the loss formed it)."""
        return objective(self.terms) if self.objective is None else self.objective


def term(per_token: jax.Array, mask: jax.Array, *, mode: str = "token-mean",
         norm: float | None = None, weight: jax.Array | float = 1.0) -> Term:
    """A :class:`Term` aggregating ``per_token [B, T]`` over ``mask`` with ``mode`` (see
    :func:`hindsight.objectives.aggregate`)."""
    check_mode(mode, norm)
    total, count = aggregate(per_token, mask, mode=mode, norm=norm)
    return Term(sum=total, count=count, weight=weight, mode=mode)


def scale(weight, count) -> jax.Array:
    """``weight / max(count, 1)``: a term's coefficient in the objective, float32."""
    return jnp.asarray(weight, jnp.float32) / jnp.maximum(jnp.asarray(count, jnp.float32), 1.0)


def objective(terms: dict, counts: dict | None = None) -> jax.Array:
    """``sum_k weight_k * terms[k].sum / max(counts[k], 1)``; ``counts`` defaults to each term's
    own count (pass the whole batch's counts to normalise a micro-batch's sums)."""
    if not terms:
        raise ValueError("a loss needs at least one term, got none")
    total = jnp.zeros((), jnp.float32)
    for name, t in terms.items():
        c = t.count if counts is None else counts[name]
        total = total + jnp.asarray(t.weight, jnp.float32) * jnp.asarray(t.sum, jnp.float32) \
            / jnp.maximum(jnp.asarray(c, jnp.float32), 1.0)
    return total


def term_metrics(terms: dict, counts: dict | None = None) -> dict:
    """Finalized per-term values for reports: ``loss/<name>`` (the unweighted mean),
    ``weight/<name>`` and ``count/<name>`` (the normaliser)."""
    out = {}
    for name, t in terms.items():
        c = jnp.asarray(t.count if counts is None else counts[name], jnp.float32)
        out[f"loss/{name}"] = jax.lax.stop_gradient(jnp.asarray(t.sum, jnp.float32)) \
            / jnp.maximum(c, 1.0)
        out[f"weight/{name}"] = jax.lax.stop_gradient(jnp.asarray(t.weight, jnp.float32))
        out[f"count/{name}"] = c
    return out
