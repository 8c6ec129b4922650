"""Dense (materialised-logits) references for the method losses, and batch utilities."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hindsight.batch import context_key
from hindsight.objectives import Loss, Term

SPLIT_ROWS = 4  # one group of the test batches


def dense_logits(model, batch, context=None):
    """Full forward (``return_hidden=False``) -> float32 ``[B, T, V]`` logits at
    ``target_index``."""
    key = lambda k: context_key(context, k)
    logits, _ = model(jnp.asarray(batch[key("tokens")]), jnp.asarray(batch[key("positions")]),
                      attention_mask=jnp.asarray(batch[key("attention_mask")]))
    index = jnp.asarray(batch[key("target_index")])[..., None]
    return jnp.take_along_axis(logits, index, axis=1)


def numpy_surrogate(logp, logp_old, adv, mask, *, eps_low, eps_high, dual_clip, mode="token-mean",
                    norm=None, logp_ref=None, kl_coef=0.0):
    """Float64 NumPy GRPO/DAPO loss ``(sum, count)`` (spec §1.1)."""
    logp, logp_old, mask = (np.asarray(x, np.float64) for x in (logp, logp_old, mask))
    adv = np.asarray(adv, np.float64)
    adv = np.broadcast_to(adv[:, None], logp.shape) if adv.ndim == 1 else adv
    m = mask > 0
    ratio = np.exp(np.clip(np.where(m, logp - logp_old, 0.0), -20, 20))
    loss = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - eps_low, 1 + eps_high))
    if dual_clip is not None:
        loss = np.where(adv < 0, np.minimum(loss, -adv * dual_clip), loss)
    if kl_coef:
        d = np.clip(np.asarray(logp_ref, np.float64) - logp, -20, 20)
        loss = loss + kl_coef * np.clip(np.exp(d) - d - 1, -10, 10)
    loss = np.where(m, loss, 0.0)
    tokens = m.sum(-1)
    rows = float((tokens > 0).sum())
    if mode == "token-mean":
        return loss.sum(), float(m.sum())
    if mode == "seq-mean-token-mean":
        return (loss.sum(-1) / np.maximum(tokens, 1)).sum(), rows
    if mode == "seq-mean-token-sum-norm":
        return loss.sum() / norm, rows
    raise ValueError(mode)


def split(batch, rows=SPLIT_ROWS):
    """The batch cut into pieces of ``rows`` rows (whole groups)."""
    b = np.shape(batch["targets"])[0]
    return [jax.tree.map(lambda x: x[i:i + rows], batch) for i in range(0, b, rows)]


def add(*losses):
    """Combine the :class:`~hindsight.objectives.Loss` of whole-group pieces: term sums and counts
    add, weights are shared (a term's weight does not depend on the batch); metric pairs add."""
    first = losses[0]
    terms = {k: Term(sum=sum(l.terms[k].sum for l in losses),
                     count=sum(l.terms[k].count for l in losses), weight=t.weight, mode=t.mode)
             for k, t in first.terms.items()}
    metrics = jax.tree.map(lambda *xs: sum(xs[1:], xs[0]), *[l.metrics for l in losses])
    return Loss(terms, metrics)
