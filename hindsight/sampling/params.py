"""Sampling hyperparameters (one frozen, hashable dataclass, validated on construction).

`SamplingParams` is a *static* argument of every jitted sampling function: the truncation path
(greedy, min-p only, top-k, full sort for top-p) is chosen at trace time, so changing a value
recompiles. Per-row quantities that change every call (stop tokens, max new tokens, RNG keys) are
traced arrays instead and never recompile.
"""
from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How the next token is drawn.

    Attributes:
      temperature: logits are divided by it before truncation; ``0`` means greedy (argmax).
      top_k: keep the ``top_k`` most likely tokens; ``0`` disables it.
      top_p: keep the smallest set of most likely tokens whose probability reaches ``top_p``
        (computed after top-k); ``1.0`` disables it.
      min_p: drop tokens whose probability is below ``min_p`` times the most likely token's
        (computed after top-k and top-p, on the renormalised distribution); ``0.0`` disables it.
      max_new_tokens: default cap on generated tokens per row (a call may pass a smaller per-row cap).
      stop_tokens: default stop token ids (a row stops after emitting one; the stop token is kept in
        the response and counted in its length).

    Order of operations is HF transformers' (temperature, top-k, top-p, min-p). Ties at the top-k /
    top-p boundary keep every token with exactly the boundary logit, so the result is independent of
    the sort's tie order.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    max_new_tokens: int = 64
    stop_tokens: tuple[int, ...] = ()

    def __post_init__(self):
        t = float(self.temperature)
        if not math.isfinite(t) or t < 0:
            raise ValueError(f"SamplingParams.temperature must be a finite number >= 0, got {self.temperature}")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be an integer >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < float(self.top_p) <= 1.0):
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if not (0.0 <= float(self.min_p) < 1.0):
            raise ValueError(f"SamplingParams.min_p must be in [0, 1), got {self.min_p}")
        if int(self.max_new_tokens) != self.max_new_tokens or self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be an integer >= 1, got {self.max_new_tokens}")
        stops = tuple(self.stop_tokens)
        if any(int(s) != s or s < 0 for s in stops):
            raise ValueError(f"SamplingParams.stop_tokens must be non-negative token ids, got {stops}")
        object.__setattr__(self, "temperature", t)
        object.__setattr__(self, "top_k", int(self.top_k))
        object.__setattr__(self, "top_p", float(self.top_p))
        object.__setattr__(self, "min_p", float(self.min_p))
        object.__setattr__(self, "max_new_tokens", int(self.max_new_tokens))
        object.__setattr__(self, "stop_tokens", tuple(int(s) for s in stops))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def policy_temperature(self) -> float:
        """The temperature of the untruncated policy log-probs the sampler records (a group's
        ``policy_logprobs``, the batch's ``logp_old``): ``temperature``, 1 for greedy decoding."""
        return 1.0 if self.greedy else self.temperature

    def for_trace(self) -> "SamplingParams":
        """Copy with only the fields that change the traced computation (the static jit argument):
        ``max_new_tokens`` and ``stop_tokens`` travel as traced per-row arrays, so calls that differ
        only in them share one compilation."""
        return dataclasses.replace(self, max_new_tokens=1, stop_tokens=())

    def check_vocab(self, vocab_size: int) -> None:
        """Raise ValueError if a stop token or ``top_k`` does not fit a vocabulary of ``vocab_size``."""
        bad = [s for s in self.stop_tokens if s >= vocab_size]
        if bad:
            raise ValueError(f"unknown stop token id(s) {bad}: vocabulary size is {vocab_size}")
        if self.top_k > vocab_size:
            raise ValueError(f"SamplingParams.top_k={self.top_k} exceeds the vocabulary size {vocab_size}")
