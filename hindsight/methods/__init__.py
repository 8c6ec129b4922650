"""Methods: one module per paper method, composing signals + objectives into a loss, and a registry.

    method = hindsight.methods.get_method("pcsd")
    config = method.make_config(lam=0.02)
    total, count, metrics = method.loss_fn(model, batch, config=config, reference=ref)

Each :class:`Method` carries its ``loss_fn`` (signature in :mod:`hindsight.methods.method`), its
default config (spec defaults), the batch ``contexts`` and ``fields`` it reads, the ``rollout``
shape it trains on, and, for stateful methods, ``init_state`` / ``update_state``. The batch layout
is in :mod:`hindsight.methods.batch`.
"""
from hindsight.methods import craft, dapo, demopsd, drgrpo, grpo, hdl, opsd, opsd_pmi, pcsd
from hindsight.methods.batch import CONTEXT_NAMES, build_batch, check_batch, context_key
from hindsight.methods.forward import context_hidden, vocab_rows
from hindsight.methods.method import ROLLOUTS, TEACHERS, LossConfig, Method

REGISTRY: dict[str, Method] = {m.METHOD.name: m.METHOD for m in (
    grpo, dapo, drgrpo, hdl, pcsd, craft, opsd, opsd_pmi, demopsd)}


def get_method(name: str) -> Method:
    """The registered :class:`Method` called ``name``; unknown names raise, listing the registry."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise KeyError(f"unknown method {name!r}; registered methods: {sorted(REGISTRY)}") from None


__all__ = ["CONTEXT_NAMES", "REGISTRY", "ROLLOUTS", "TEACHERS", "LossConfig", "Method",
           "build_batch", "check_batch", "context_hidden", "context_key", "get_method",
           "vocab_rows"]
