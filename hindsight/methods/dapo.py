"""DAPO — decoupled clip and dynamic sampling policy optimisation (spec §1.2).

Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (arXiv 2503.14476);
settings as in verl's DAPO recipe.

Loss: the clipped surrogate with clip-higher (``eps_low = 0.2``, ``eps_high = 0.28``), verl's dual
clip 3, ``token-mean`` over all tokens of the batch, no KL term. The other two DAPO ingredients act
on the data, so the rollout layer applies them with the settings held here:
:func:`keep_groups` (dynamic sampling: drop groups whose rewards are all equal, keep sampling up to
``max_num_gen_batches`` batches) and :func:`shaped_rewards` (overlong shaping, verl's
``overlong_buffer``: ``L_max = 20480``, ``L_buf = 4096``, factor 1). In an experiment ``L_max``
follows the rollout's response cap ``rollout.max_new_tokens`` and ``L_buf`` is a fifth of it (the
spec's ratio 4096 / 20480), unless set (:func:`derive`).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from hindsight._validation import check_group_size, check_rank, check_static_float, shape_of
from hindsight.batch import check_batch
from hindsight.methods.method import Method, require_no_state, resolve_config
from hindsight.methods.policy_gradient import SurrogateConfig, surrogate_loss
from hindsight.objectives import Loss, overlong_penalty

NAME = "dapo"
CONTEXTS = ()
ROLLOUT = "dynamic"
FIELDS = ("logp_old", "advantages")


@dataclasses.dataclass(frozen=True)
class DAPOConfig(SurrogateConfig):
    """DAPO options (spec §1.2 defaults).

    Attributes:
      eps_high: clip-higher, 0.28.
      max_num_gen_batches: dynamic sampling gives up after this many generation batches (<= 0:
        unlimited); verl's example config uses 10.
      overlong: overlong shaping on (verl ``overlong_buffer.enable``).
      max_response_length: ``L_max`` in tokens, the rollout's response cap.
      overlong_buffer: ``L_buf`` in tokens (verl ``overlong_buffer.len``).
      overlong_factor: penalty at ``L_max`` (verl ``overlong_buffer.penalty_factor``).
    """
    eps_high: float = 0.28
    max_num_gen_batches: int = 10
    overlong: bool = True
    max_response_length: int = 20480
    overlong_buffer: int = 4096
    overlong_factor: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.max_num_gen_batches, int):
            raise ValueError(f"`max_num_gen_batches` must be an int, got "
                             f"{self.max_num_gen_batches!r}")
        if not isinstance(self.max_response_length, int) or self.max_response_length < 1:
            raise ValueError(f"`max_response_length` must be a positive int, got "
                             f"{self.max_response_length!r}")
        if not isinstance(self.overlong, bool):
            raise ValueError(f"`overlong` must be a bool, got {self.overlong!r}")
        if isinstance(self.overlong_buffer, bool) or not (
                isinstance(self.overlong_buffer, int)
                and 0 < self.overlong_buffer <= self.max_response_length):
            raise ValueError(f"`overlong_buffer` must be an int in (0, max_response_length="
                             f"{self.max_response_length}], got {self.overlong_buffer!r}")
        check_static_float("overlong_factor", self.overlong_factor, low=0.0)


def shaped_rewards(rewards: jax.Array, lengths: jax.Array, config: DAPOConfig) -> jax.Array:
    """Verifier rewards plus DAPO's overlong penalty (unchanged when ``overlong`` is off).

    Args:
      rewards: ``[B]`` verifier rewards. lengths: ``[B]`` response lengths in tokens.
      config: supplies ``max_response_length``, ``overlong_buffer``, ``overlong_factor``.
    Returns:
      ``[B]`` float32.
    """
    check_rank("rewards", rewards, rank=1)
    if shape_of(lengths) != shape_of(rewards):
        raise ValueError(f"`lengths` has shape {shape_of(lengths)}, expected "
                         f"{shape_of(rewards)} to match `rewards`")
    rewards = jnp.asarray(rewards).astype(jnp.float32)
    if not config.overlong:
        return rewards
    return rewards + overlong_penalty(lengths, max_length=config.max_response_length,
                                      buffer=config.overlong_buffer, factor=config.overlong_factor)


def keep_groups(scores: jax.Array, group_size: int) -> jax.Array:
    """Dynamic-sampling filter: which groups carry a learning signal.

    Args:
      scores: ``[B]`` per-rollout metric (reward or accuracy), groups of ``group_size`` contiguous
        rows.
      group_size: static ``G`` dividing ``B``.
    Returns:
      ``[B / G]`` bool, False where every member of the group has the same score.
    """
    check_rank("scores", scores, rank=1)
    check_group_size(shape_of(scores)[0], group_size)
    s = jnp.asarray(scores).reshape(-1, group_size)
    return jnp.any(s != s[:, :1], axis=1)


def loss_fn(model, batch, *, config: DAPOConfig | None = None, head=None, reference=None,
            method_state=None, counts=None) -> Loss:
    """DAPO loss: the ``policy`` term (token-mean clipped surrogate), no KL term.

    Metrics as :func:`hindsight.methods.grpo.loss_fn` (``kl`` reported when ``reference`` is given).
    """
    config = resolve_config(NAME, config, DAPOConfig())
    require_no_state(NAME, method_state)
    check_batch(batch, method=NAME, contexts=CONTEXTS, fields=FIELDS)
    return surrogate_loss(model, batch, config, head=head, reference=reference, counts=counts)


def derive(rollout) -> dict:
    """``L_max`` = the rollout's response cap, ``L_buf`` = a fifth of it (at least 1 token)."""
    cap = int(rollout.max_new_tokens)
    return {"max_response_length": cap, "overlong_buffer": max(1, cap // 5)}


METHOD = Method(name=NAME, loss_fn=loss_fn, config=DAPOConfig(), contexts=CONTEXTS,
                rollout=ROLLOUT, fields=FIELDS, derive=derive, shape_rewards=shaped_rewards,
                paper="Yu et al. 2025, DAPO (arXiv 2503.14476); verl DAPO recipe")
