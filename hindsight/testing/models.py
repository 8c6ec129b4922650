"""A tiny random decoder, a character tokenizer for it, and a random batch in the
:mod:`hindsight.batch` layout, for tests and quick experiments with any method (every
context present, groups contiguous, right padding, an all-masked row and suffix-only continuation
rows). ``char_model()`` + ``CharTokenizer()`` are what the launcher's ``model.name="tiny-random"``
loads."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hindsight.batch import CONTEXT_NAMES, build_batch
from hindsight.models import Decoder, ModelConfig
from hindsight.objectives import group_advantages
from hindsight.ops import token_logprobs

TINY = ModelConfig(family="llama", vocab_size=64, hidden_size=32, intermediate_size=64,
                   num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)


@nnx.jit(static_argnums=(1, 2))
def _build(key, config, attention):
    return Decoder(config, scan_layers=False, attention=attention, rngs=nnx.Rngs(key))


def tiny_model(seed: int = 0, config: ModelConfig = TINY, *, attention: str = "auto") -> Decoder:
    """A random fp32 decoder (2 layers, hidden 32, vocab 64), built under ``nnx.jit`` (eager NNX
    construction is slow; the seed is traced, so every seed shares one compile). Layers are
    unrolled (``scan_layers=False``): for two layers that compiles faster than a scan."""
    return _build(jax.random.key(seed), config, attention)


CHAR_VOCAB = 128
CHAR_BOS, CHAR_EOS = 1, 2


class CharTokenizer:
    """One id per ASCII character (0-2 are pad / BOS / EOS; other characters map to 127); chat
    turns as ``<role>text``. Implements the tokenizer methods the rollout layer calls."""
    eos_token_id = CHAR_EOS

    def encode(self, text, add_special_tokens=False):
        return [min(ord(c), CHAR_VOCAB - 1) for c in text]

    def __call__(self, text):
        return {"input_ids": self.encode(text)}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i <= CHAR_EOS))

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        text += "<assistant>" if add_generation_prompt else ""
        return [CHAR_BOS] + self.encode(text) if tokenize else text


def char_model(seed: int = 0, *, attention: str = "auto") -> Decoder:
    """:func:`tiny_model` over :class:`CharTokenizer`'s 128 ids."""
    return tiny_model(seed, dataclasses.replace(TINY, vocab_size=CHAR_VOCAB), attention=attention)


@nnx.jit
def _sampled_logprobs(model, tokens, positions, attention_mask, target_index, targets):
    logits, _ = model(tokens, positions, attention_mask=attention_mask)
    return token_logprobs(jnp.take_along_axis(logits, target_index[..., None], axis=1), targets)


def _row_context(prompt: np.ndarray, response: np.ndarray, width: int):
    """One row of a context: ``prompt + response``, right-padded to ``width``; target indices."""
    n, m = len(prompt), len(response)
    tokens = np.zeros(width, np.int32)
    tokens[:n] = prompt
    tokens[n:n + m] = response
    attention = (np.arange(width) < n + m).astype(np.int32)
    return tokens, attention, n - 1 + np.arange(m)


def make_batch(model, *, groups: int = 2, group_size: int = 4, response_len: int = 6,
               max_prompt: int = 5, contexts=CONTEXT_NAMES, seed: int = 0,
               logp_noise: float = 0.1) -> dict:
    """A random batch for ``model`` with ``B = groups * group_size`` rows.

    Row 0 has an empty response (all-masked); row 2 of each group is a continuation whose loss mask
    skips its first two response tokens (suffix-only, as HDL); the rest have random lengths in
    ``[1, response_len]``. Each context in ``contexts`` gets its own random prompt (up to
    ``max_prompt + 2`` tokens) before the same response; as in a real batch, the rows of a group
    share their prompt in the policy, ``teacher`` and ``probe`` contexts (question, reference),
    while each ``hindsight`` row has its own (feedback and reflection are per response). ``logp_old`` is the model's own log-prob
    plus Gaussian noise of scale ``logp_noise`` (ratios near 1, so some tokens clip and most do
    not); rewards are 0/1 with both values in every group, advantages their GRPO advantages.

    Returns:
      The batch dict (host NumPy arrays, except ``logp_old``/``advantages``, float32 jax arrays).
    """
    rng = np.random.default_rng(seed)
    vocab = model.config.vocab_size
    b, t = groups * group_size, response_len
    lengths = rng.integers(1, t + 1, b)
    lengths[0] = 0
    lengths[1] = t
    responses = [rng.integers(0, vocab, n).astype(np.int32) for n in lengths]
    targets = np.zeros((b, t), np.int32)
    mask = np.zeros((b, t), np.float32)
    for i, r in enumerate(responses):
        targets[i, :len(r)] = r
        mask[i, :len(r)] = 1.0
    for g in range(groups):
        row = g * group_size + 2
        if lengths[row] > 2:
            mask[row, :2] = 0.0

    def context(max_len: int, per_group: bool) -> dict:
        width = max_len + t + 1  # one extra padding column
        out = {k: np.zeros((b, width), np.int32) for k in ("tokens", "attention_mask")}
        out["positions"] = np.broadcast_to(np.arange(width, dtype=np.int32), (b, width)).copy()
        out["target_index"] = np.zeros((b, t), np.int32)
        for i, r in enumerate(responses):
            if not per_group or i % group_size == 0:
                prompt = rng.integers(0, vocab, int(rng.integers(1, max_len + 1)))
            tok, att, idx = _row_context(prompt, r, width)
            out["tokens"][i], out["attention_mask"][i] = tok, att
            out["target_index"][i, :len(r)] = idx
        return out

    policy = context(max_prompt, True)
    extra = {name: context(max_prompt + 2, name != "hindsight") for name in contexts}
    rewards = np.zeros(b, np.float32)
    for g in range(groups):
        r = rng.integers(0, 2, group_size)
        r[:2] = (0, 1)
        rewards[g * group_size:(g + 1) * group_size] = rng.permutation(r)
    logp = _sampled_logprobs(model, *(jnp.asarray(policy[k]) for k in (
        "tokens", "positions", "attention_mask", "target_index")), jnp.asarray(targets))
    logp_old = logp + logp_noise * jax.random.normal(jax.random.key(seed), logp.shape)
    return build_batch(tokens=policy["tokens"], positions=policy["positions"],
                       attention_mask=policy["attention_mask"], targets=targets,
                       target_index=policy["target_index"], mask=mask, logp_old=logp_old,
                       advantages=group_advantages(jnp.asarray(rewards), group_size),
                       rewards=rewards, contexts=extra)
