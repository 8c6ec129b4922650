"""Methods: one module per paper method, composing signals + objectives into a loss, and a registry.

    method = hindsight.methods.get_method("pcsd")
    config = method.make_config(lam=0.02)
    loss = method.loss_fn(model, batch, config=config, reference=ref)
    loss.terms   # {"policy": Term(sum, count, weight), "distill": Term(...)}
    loss.value() # sum_k weight_k * sum_k / count_k

Each :class:`Method` carries its ``loss_fn`` (signature in :mod:`hindsight.methods.method`), its
default config (spec defaults), the batch ``contexts`` and ``fields`` it reads, the ``rollout``
shape it trains on, and, for stateful methods, ``init_state`` / ``update_state``;
:meth:`Method.configure` resolves it for one experiment. The batch layout is in
:mod:`hindsight.batch`.
"""
from hindsight.methods import (beta_opsd, craft, cripo, dapo, demopsd, drgrpo, gkd, grpo, h2sd, hdl,
                               hsd, neuron_opsd, opsd, opsd_pmi, pcsd, recoverability, rlsd,
                               sdpo, seed, sft)
from hindsight.methods.forward import LMHead, Side, context_hidden, vocab_rows
from hindsight.methods.method import ROLLOUTS, TEACHERS, LossConfig, Method, RolloutShape

REGISTRY: dict[str, Method] = {m.METHOD.name: m.METHOD for m in (
    grpo, dapo, drgrpo, hdl, pcsd, craft, opsd, opsd_pmi, demopsd, rlsd, sdpo, hsd, h2sd,
    beta_opsd, cripo, sft, gkd, neuron_opsd, recoverability, seed)}


def get_method(name: str) -> Method:
    """The registered :class:`Method` called ``name``; unknown names raise, listing the registry."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise KeyError(f"unknown method {name!r}; registered methods: {sorted(REGISTRY)}") from None


__all__ = ["REGISTRY", "ROLLOUTS", "TEACHERS", "LMHead", "LossConfig", "Method", "RolloutShape",
           "Side", "context_hidden", "get_method", "vocab_rows"]
