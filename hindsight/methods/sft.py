"""SFT — supervised fine-tuning: cross-entropy on given completions (the ``completions`` rollout:
each example's own answer after the policy prompt, :mod:`hindsight.rollout.completions`).

Loss: ``-log pi(y_t | x, y_<t)`` per completion token, token mean (the ``sft`` term), at the loss
temperature (which follows ``rollout.temperature``; 1.0, plain cross-entropy, by default). The
first stage of BIRD and SEED; here a method of its own, trained from a dataset task's solution
field (``task.name="dataset"``) or any task whose examples carry a completion.
"""
from __future__ import annotations

import dataclasses

import jax

from hindsight.batch import check_batch
from hindsight.methods.forward import context_hidden, gather, vocab_rows
from hindsight.methods.method import LossConfig, Method, require_no_state, resolve_config
from hindsight.objectives import Loss, aggregate, term
from hindsight.ops import entropy_from_logprobs

NAME = "sft"
CONTEXTS = ()
ROLLOUT = "completions"
FIELDS = ()


@dataclasses.dataclass(frozen=True)
class SFTConfig(LossConfig):
    """SFT options: ``temperature`` only (the loss's, 1.0 = cross-entropy)."""


def loss_fn(model, batch, *, config: SFTConfig | None = None, head=None, reference=None,
            method_state=None) -> Loss:
    """SFT loss: the ``sft`` term, token-mean negative log-likelihood of the targets.

    Metrics: ``entropy`` (the policy's, token mean) and ``token_accuracy`` (the argmax is the
    target)."""
    config = resolve_config(NAME, config, SFTConfig())
    require_no_state(NAME, method_state)
    check_batch(batch, method=NAME, contexts=CONTEXTS, fields=FIELDS)
    sides = {"policy": context_hidden(model, batch)}

    def row(logp, tokens):
        lp = logp["policy"]
        sg = jax.lax.stop_gradient
        return {"nll": -gather(lp, tokens), "entropy": sg(entropy_from_logprobs(lp)),
                "token_accuracy": sg((lp.argmax(-1) == tokens).astype(lp.dtype))}

    mask = batch["mask"]
    rows = vocab_rows(row, sides, batch["targets"], mask, head=head,
                      temperature=config.temperature)
    metrics = {name: aggregate(rows[name], mask) for name in ("entropy", "token_accuracy")}
    return Loss({"sft": term(rows["nll"], mask)}, metrics)


METHOD = Method(name=NAME, loss_fn=loss_fn, config=SFTConfig(), contexts=CONTEXTS,
                rollout=ROLLOUT, fields=FIELDS,
                paper="supervised fine-tuning (cross-entropy on given completions)")
