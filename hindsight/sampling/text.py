"""Strings in, strings out: chat template, stop strings and detokenised samples for notebooks.

Built on `generate` and `score_logprobs`; takes any HF-style tokenizer (``__call__`` / ``encode``,
``decode``, ``apply_chat_template``, ``eos_token_id``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from hindsight.sampling.params import SamplingParams
from hindsight.sampling.rollouts import generate
from hindsight.sampling.score import score_logprobs


@dataclasses.dataclass(frozen=True)
class TextSample:
    """One sampled response.

    Attributes:
      text: decoded response, cut before the first stop string (special tokens skipped).
      token_ids: ``[n]`` the generated ids (up to and including a stop token, or the token that
        completes a stop string).
      logprobs: ``[n]`` sampled-distribution log-probs; policy_logprobs: ``[n]`` untruncated ones at the sampling temperature.
      finish_reason: "stop_token", "stop_string" or "length".
    """

    text: str
    token_ids: np.ndarray
    logprobs: np.ndarray
    policy_logprobs: np.ndarray
    finish_reason: str


def encode_prompt(tokenizer, prompt, *, chat: bool = True, system: str | None = None) -> list[int]:
    """Token ids of a prompt: a user string or a list of ``{"role", "content"}`` messages, through
    the tokenizer's chat template (with the generation prompt) when ``chat``; raw text otherwise."""
    if not chat:
        if not isinstance(prompt, str):
            raise TypeError("with chat=False a prompt must be a string")
        return list(tokenizer(prompt)["input_ids"])
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system is not None:
        messages = [{"role": "system", "content": system}] + messages
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


class StopStrings:
    """A stop check for the engine (:meth:`hindsight.sampling.engine.Engine.submit`'s
    ``stop_check``): ends a response at the first token whose decoded text completes one of
    ``strings`` (e.g. ``"</action>"``, however the tokenizer splits it).

    ``check(ids)`` returns the number of leading ``ids`` to keep (through the token completing
    the earliest stop string) or None. The engine calls it after every decode chunk, so the
    string is usually among the last few tokens: the cut is found scanning back from the end.
    """

    def __init__(self, tokenizer, strings: Sequence[str]):
        if isinstance(strings, str):
            raise TypeError("`strings` must be a sequence of strings, got a single string")
        strings = tuple(strings)
        if not strings or not all(isinstance(x, str) and x for x in strings):
            raise ValueError(f"`strings` must hold non-empty strings, got {strings!r}")
        self.tokenizer, self.strings = tokenizer, strings

    def _text(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def _hit(self, text: str) -> bool:
        return any(x in text for x in self.strings)

    def __call__(self, ids) -> int | None:
        n = len(ids)
        if not n or not self._hit(self._text(ids)):
            return None
        while n > 1 and self._hit(self._text(ids[: n - 1])):
            n -= 1
        return n


def _cut(text: str, stop_strings: Sequence[str]) -> tuple[str, bool]:
    hits = [i for i in (text.find(s) for s in stop_strings) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


def generate_text(model, tokenizer, prompts: Sequence, params: SamplingParams | None = None, *,
                  num_samples: int = 1, key=None, chat: bool = True, system: str | None = None,
                  stop_strings: Sequence[str] = (), stop_at_eos: bool = True,
                  max_len: int | None = None) -> list[list[TextSample]]:
    """Sample ``num_samples`` responses per prompt and decode them.

    Args:
      prompts: strings (user turns) or message lists.
      params: `SamplingParams` (default: temperature 1, 64 new tokens).
      stop_strings: a row ends at the token that completes one (:class:`StopStrings`, checked while
        decoding); its text is cut before the string.
      stop_at_eos: add the tokenizer's ``eos_token_id`` to the stop tokens.
    Returns:
      ``[P][num_samples]`` `TextSample`s.
    """
    params = params or SamplingParams()
    if isinstance(prompts, str):
        raise TypeError("`prompts` must be a list of prompts, got a single string")
    ids = [encode_prompt(tokenizer, p, chat=chat, system=system) for p in prompts]
    eos = getattr(tokenizer, "eos_token_id", None)
    stops = tuple(params.stop_tokens) + ((eos,) if stop_at_eos and eos is not None and eos not in params.stop_tokens else ())
    check = StopStrings(tokenizer, stop_strings) if stop_strings else None
    out = generate(model, ids, dataclasses.replace(params, stop_tokens=stops), key=key,
                   num_samples=num_samples, max_len=max_len, stop_check=check)
    samples = []
    for b in range(out.num_rows):
        n = int(out.lengths[b])
        toks = out.tokens[b, :n]
        text, cut = _cut(tokenizer.decode(toks.tolist(), skip_special_tokens=True), stop_strings)
        reason = "stop_string" if cut else "stop_token" if out.stopped[b] else "length"
        samples.append(TextSample(text=text, token_ids=toks, logprobs=out.logprobs[b, :n],
                                  policy_logprobs=out.policy_logprobs[b, :n], finish_reason=reason))
    return [samples[i * num_samples: (i + 1) * num_samples] for i in range(len(ids))]


def score_text(model, tokenizer, contexts: Sequence, responses: Sequence[str], *, context_index=None,
               chat: bool = True, system: str | None = None) -> list[np.ndarray]:
    """Teacher-forced log-probs of each response's tokens (raw encoding, no special tokens) after its
    context (encoded like a prompt); one ``[n_b]`` array per response."""
    ctx = [encode_prompt(tokenizer, c, chat=chat, system=system) for c in contexts]
    resp = [tokenizer.encode(r, add_special_tokens=False) for r in responses]
    lp = np.asarray(score_logprobs(model, ctx, resp, context_index=context_index))
    return [lp[i, : len(r)] for i, r in enumerate(resp)]
