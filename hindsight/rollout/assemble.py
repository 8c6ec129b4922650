"""Host-side rows -> the methods' training batch (:mod:`hindsight.batch`).

The rollout shapes (`group`, `dynamic`, `hdl`) each produce :class:`GroupRows`, one per prompt;
:func:`assemble` lays them out as contiguous groups, builds the policy context and the extra
contexts a method reads (the same response after another prompt), and validates the result with
:func:`hindsight.methods.build_batch`. Widths are bucketed (``T`` = the generation cap, ``L`` =
prompt bucket + ``T`` rounded to 64), so successive batches of one run share their compiled shapes.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

from hindsight.batch import build_batch, context_key
from hindsight.ops import token_logprobs
from hindsight.sampling.buckets import cache_len_bucket
from hindsight.tasks import Example


@dataclasses.dataclass
class GroupRows:
    """The ``G`` rows sampled for one prompt (host numpy), in group order.

    Attributes:
      example: the example the group answers; example_index: its index in the call's examples.
      prompt: ``[n]`` int32 policy prompt ids.
      tokens: ``[G, T]`` int32 responses (0 after each length).
      lengths: ``[G]`` int32 response lengths.
      logprobs: ``[G, T]`` float32 log-probs of the sampled (truncated) distribution.
      policy_logprobs: ``[G, T]`` float32 untruncated log-probs at the sampling temperature: the
        batch's ``logp_old`` (see :mod:`hindsight.sampling.truncation`).
      loss_mask: ``[G, T]`` bool (HDL continuations: only ``t >= branch position``).
      rewards: ``[G]`` float32 verifier rewards.
      branch_positions: ``[G]`` int32 (0 for fresh rows).
      texts: decoded responses; feedback: the verifier's feedback per row.
      generated_tokens: tokens sampled for this group (reflections included).
      hindsight: per-row hindsight context ids (HDL trees only).
      row_prompts: per-row policy prompts where they differ within the group (episodes: the first
        observation is part of the prompt), else None (every row's is ``prompt``).
      turn_ids: episodes, ``[G, T]`` int32 turn index on action tokens, -1 elsewhere.
      turn_rewards: episodes, ``[G, K]`` float32 step reward of each turn (0 past the last).
      search_mask: search episodes, ``[G, T]`` bool on the tokens of search queries.
      num_turns: episodes, ``[G]`` int32 actions taken. statuses: episodes, how each ended
        (:data:`hindsight.rollout.episodes.STATUSES`).
      row_roles: ``[G]`` int32 each row's role (the batch's ``row_role``: counterfactual
        recoverability's supervision rows), or None (every row is the policy's sample).
      generated: the context parts the policy wrote about the group after its verdicts, by part
        name (:class:`hindsight.rollout.generated.Generated`: SEED's ``skill``); a part its
        generator declined is absent.
    """
    example: Example
    example_index: int
    prompt: np.ndarray
    tokens: np.ndarray
    lengths: np.ndarray
    logprobs: np.ndarray
    policy_logprobs: np.ndarray
    loss_mask: np.ndarray
    rewards: np.ndarray
    branch_positions: np.ndarray
    texts: list[str]
    generated_tokens: int
    feedback: list[str] = dataclasses.field(default_factory=list)
    hindsight: list[np.ndarray] | None = None
    row_prompts: list[np.ndarray] | None = None
    turn_ids: np.ndarray | None = None
    turn_rewards: np.ndarray | None = None
    search_mask: np.ndarray | None = None
    num_turns: np.ndarray | None = None
    statuses: list[str] | None = None
    row_roles: np.ndarray | None = None
    generated: dict = dataclasses.field(default_factory=dict)

    @property
    def size(self) -> int:
        return int(self.lengths.shape[0])


def finished(group: GroupRows, stop_tokens: Sequence[int]) -> np.ndarray:
    """``[n]`` bool: the rows that ended on a stop token, not at the response width."""
    width = group.tokens.shape[1]
    last = group.tokens[np.arange(group.size), np.maximum(group.lengths - 1, 0)]
    return (group.lengths < width) | ((group.lengths > 0) & np.isin(last, list(stop_tokens)))


def context_arrays(contexts: Sequence, responses: np.ndarray, lengths: np.ndarray) -> dict:
    """One batch context: each row's ``context + response`` right-padded.

    Args:
      contexts: ``B`` token-id sequences (each non-empty).
      responses: ``[B, T]`` int response tokens; lengths: ``[B]``.
    Returns:
      ``{"tokens", "positions", "attention_mask": [B, L], "target_index": [B, T]}`` int32, with
      ``L = cache_len_bucket(longest context, T)``; ``target_index[b, t] = len(context_b) - 1 + t``
      on real tokens (the position whose hidden state predicts ``responses[b, t]``), 0 on padding.
    """
    b, t = responses.shape
    clen = np.array([len(c) for c in contexts], np.int32)
    if clen.shape != (b,) or clen.min() < 1:
        raise ValueError(f"need one non-empty context per row ({b} rows), got lengths {clen}")
    width = cache_len_bucket(int(clen.max()), t)
    tokens = np.zeros((b, width), np.int32)
    attention = np.zeros((b, width), np.int32)
    index = np.zeros((b, t), np.int32)
    for i, (ctx, n, m) in enumerate(zip(contexts, clen, lengths)):
        tokens[i, :n] = np.asarray(ctx, np.int32)
        tokens[i, n:n + m] = responses[i, :m]
        attention[i, :n + m] = 1
        index[i, :m] = n - 1 + np.arange(m)
    positions = np.broadcast_to(np.arange(width, dtype=np.int32), (b, width)).copy()
    return dict(tokens=tokens, positions=positions, attention_mask=attention, target_index=index)


def assemble(groups: Sequence[GroupRows], advantages: np.ndarray, rewards: np.ndarray, *,
             contexts: Mapping[str, Sequence] | None = None) -> dict:
    """The training batch of ``groups`` (rows of a group contiguous).

    Args:
      groups: equally sized groups with a common response width ``T``.
      advantages: ``[B]`` float32; rewards: ``[B]`` float32 (shaped, if the method shapes them).
      contexts: ``{name: B context-id sequences}`` for each extra context the method reads, or
        ``{name: (ids, row_mask [B])}`` for one some rows lack (``{name}_row_mask`` 0 on them).
    Returns:
      The validated batch dict (numpy arrays): policy context, ``targets``, ``target_index``,
      ``mask``, ``logp_old``, ``advantages``, ``rewards`` and ``{name}_*`` per extra context.
    """
    tokens = np.concatenate([g.tokens for g in groups])
    lengths = np.concatenate([g.lengths for g in groups])
    prompts = [p for g in groups for p in (g.row_prompts or [g.prompt] * g.size)]
    policy = context_arrays(prompts, tokens, lengths)
    extra = {}
    for name, ctx in (contexts or {}).items():
        ids, row_mask = ctx if isinstance(ctx, tuple) else (ctx, None)
        extra[name] = context_arrays(ids, tokens, lengths)
        if row_mask is not None:
            extra[name]["row_mask"] = np.asarray(row_mask, np.float32)
    index = policy.pop("target_index")
    episodes = [g.turn_ids is not None for g in groups]
    if any(episodes) and not all(episodes):
        raise ValueError("a batch mixes episode groups and single-turn groups")
    batch = build_batch(
        **policy, targets=tokens, target_index=index,
        mask=np.concatenate([g.loss_mask for g in groups]).astype(np.float32),
        logp_old=np.concatenate([g.policy_logprobs for g in groups]).astype(np.float32),
        advantages=np.asarray(advantages, np.float32), rewards=np.asarray(rewards, np.float32),
        contexts=extra)
    roles = [g.row_roles is not None for g in groups]
    if any(roles):
        if not all(roles):
            raise ValueError("a batch mixes groups with row roles and groups without")
        batch["row_role"] = np.concatenate([g.row_roles for g in groups]).astype(np.int32)
    if all(episodes):
        batch["turn_id"] = np.concatenate([g.turn_ids for g in groups]).astype(np.int32)
        batch["turn_rewards"] = np.concatenate([g.turn_rewards for g in groups]).astype(np.float32)
        if all(g.search_mask is not None for g in groups):
            batch["search_mask"] = np.concatenate([g.search_mask for g in groups]).astype(np.float32)
    return batch


@nnx.jit(static_argnames=("context", "temperature"))
def _gathered_logprobs(model, batch, context, temperature):
    key = lambda k: context_key(context, k)
    logits, _ = model(batch[key("tokens")], batch[key("positions")],
                      attention_mask=batch[key("attention_mask")])
    index = batch[key("target_index")]
    picked = jnp.take_along_axis(logits, index[..., None], axis=1).astype(jnp.float32)
    return token_logprobs(picked / temperature, batch["targets"])


def context_logprobs(model, batch: Mapping, context: str | None = None, *,
                     temperature: float = 1.0) -> np.ndarray:
    """Log-probs ``[B, T]`` float32 of ``batch["targets"]`` teacher-forced after one of the batch's
    contexts (None: the policy context; else ``"teacher"``, ``"probe"`` or ``"hindsight"``), from
    ``logits / temperature``.

    Positions past a row's response length hold meaningless values: mask them. Materialises
    ``[B, T, V]`` logits, so it is for tests, notebooks and small models (the losses go through
    :mod:`hindsight.methods.forward`)."""
    keys = ("tokens", "positions", "attention_mask", "target_index")
    sub = {context_key(context, k): jnp.asarray(batch[context_key(context, k)]) for k in keys}
    sub["targets"] = jnp.asarray(batch["targets"])
    return np.asarray(_gathered_logprobs(model, sub, context, float(temperature)))
