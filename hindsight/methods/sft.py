"""SFT — supervised fine-tuning: cross-entropy on given completions (the ``completions`` rollout,
:mod:`hindsight.rollout.completions`).

Loss: ``-log pi(y_t | x, y_<t)`` per completion token, token mean (the ``sft`` term), at the loss
temperature (which follows ``rollout.temperature``; 1.0, plain cross-entropy, by default).

Where the completions come from (``completions``):
  * ``"dataset"`` (default): each example's own answer after the policy prompt: a dataset task's
    solution field (``task.name="dataset"``) or any task whose examples carry a completion.
  * ``"policy"``: the policy's own filtered samples (rejection-sampling fine-tuning; BIRD's stage
    1, ``configs/bird.py``): ``num_samples`` responses per question sampled after the context of
    the recipe ``sample_context`` (``()``: the plain question; ``("concise",)``: question + the
    concise instruction), verified, and per question the one ``select`` picks among the correct
    ones (reward >= 0.5) that ended before the cap (``finished_only``) kept; with
    ``prompt_switch`` it is trained after the plain question, not the prompt it was sampled
    under. A question with no such sample gives a row with loss mask 0 (the batch keeps one row
    per question).
  * ``"generated"``: a context part the policy writes about its own samples (SEED's stage 1,
    ``configs/seed_stages.py``): ``num_samples`` responses per question sampled after the plain
    question and verified, the part ``generated_part`` (``"skill"``) written from them by
    continuing one row's conversation (:mod:`hindsight.rollout.generated`), and trained after
    that conversation when the rule ``select`` (``"useful"``: conditioning on it raised the mean
    log-prob of the group's successful responses) keeps it and, with ``finished_only``, it
    ended before its cap (``rollout.generated_max_tokens``, at most ``rollout.max_new_tokens``).
"""
from __future__ import annotations

import dataclasses

import jax

from hindsight._validation import check_choice
from hindsight.batch import check_batch
from hindsight.methods.forward import context_hidden, gather, vocab_rows
from hindsight.methods.method import LossConfig, Method, require_no_state, resolve_config
from hindsight.objectives import Loss, aggregate, term
from hindsight.ops import entropy_from_logprobs

NAME = "sft"
CONTEXTS = ()
ROLLOUT = "completions"
FIELDS = ()
COMPLETIONS = ("dataset", "policy", "generated")
"""Where the ``completions`` rollout takes the trained responses from (see the module doc)."""


@dataclasses.dataclass(frozen=True)
class SFTConfig(LossConfig):
    """SFT options.

    Attributes:
      temperature: the loss's (1.0 = cross-entropy); the policy's samples are drawn at it too.
      completions: one of :data:`COMPLETIONS` (``"dataset"``).
      num_samples: ``"policy"``: responses sampled per question (1: BIRD samples one).
      sample_context: ``"policy"``: the recipe of the prompt the samples are drawn after, parts of
        :data:`hindsight.rollout.contexts.EXAMPLE_PARTS` (``()``: the plain question).
      select: ``"policy"``: which correct sample a question keeps, a name of
        :data:`hindsight.rollout.completions.SELECTIONS` (``"shortest"``, OUR CHOICE: the
        concise one; ``"first"``: the first in sampling order).
      prompt_switch: ``"policy"``: train the kept response after the plain question (True,
        BIRD's prompt switch) or after the prompt it was sampled under.
      finished_only: ``"policy"``: keep only samples that ended before the response cap (True,
        OUR CHOICE: a cut sample has no final answer; trained on, it teaches not to end);
        ``"generated"``: only parts that ended before their cap.
      generated_part: ``"generated"``: the part written and trained on, a name of
        :data:`hindsight.rollout.generated.GENERATORS` (``"skill"``); ``select`` then names a
        rule of :data:`hindsight.rollout.completions.PART_SELECTIONS` (``"useful"``).
    """
    completions: str = "dataset"
    num_samples: int = 1
    sample_context: tuple = ()
    select: str = "shortest"
    prompt_switch: bool = True
    finished_only: bool = True
    generated_part: str = "skill"

    def __post_init__(self):
        super().__post_init__()
        check_choice("completions", self.completions, COMPLETIONS)
        if isinstance(self.num_samples, bool) or not isinstance(self.num_samples, int) \
                or self.num_samples < 1:
            raise ValueError(f"`num_samples` must be a positive int, got {self.num_samples!r}")
        recipe = tuple(self.sample_context) if isinstance(self.sample_context, list) \
            else self.sample_context
        if not isinstance(recipe, tuple) or not all(
                isinstance(item, str) and item and all(item.split("|")) for item in recipe):
            raise ValueError(f"`sample_context` must be a tuple of context part names "
                             f"(alternatives joined by '|'; () for the plain question), got "
                             f"{self.sample_context!r}")
        object.__setattr__(self, "sample_context", recipe)
        for name in ("select", "generated_part"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"`{name}` must be a registered name, got "
                                 f"{getattr(self, name)!r}")
        for name in ("prompt_switch", "finished_only"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"`{name}` must be a bool, got {getattr(self, name)!r}")


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
