"""Test doubles for the rollout tests: a character tokenizer with a chat template, a tiny random
decoder over its 128 ids, and a verifier whose rewards the test controls."""
from __future__ import annotations

import collections
import dataclasses

from hindsight.methods.testing import TINY, tiny_model
from hindsight.tasks import Example, Verdict

VOCAB = 128
BOS, EOS = 1, 2


class CharTokenizer:
    """One id per ASCII character (0-2 are pad / BOS / EOS); chat turns as ``<role>text``."""
    eos_token_id = EOS

    def encode(self, text, add_special_tokens=False):
        return [min(ord(c), VOCAB - 1) for c in text]

    def __call__(self, text):
        return {"input_ids": self.encode(text)}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i <= EOS))

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return [BOS] + self.encode(text + ("<assistant>" if add_generation_prompt else ""))


def char_model(seed: int = 0):
    return tiny_model(seed, dataclasses.replace(TINY, vocab_size=VOCAB))


@dataclasses.dataclass
class ScriptedTask:
    """``data[0]`` of an example says how its rows are rewarded: ``"mixed"`` alternates 1, 0, 1, ...
    over successive verify calls of that example, ``"zero"`` / ``"one"`` always give 0 / 1."""
    name: str = "scripted"
    calls: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def verify(self, example: Example, response: str) -> Verdict:
        kind = example.data[0]
        if kind == "mixed":
            reward = float(self.calls[example.prompt] % 2 == 0)
            self.calls[example.prompt] += 1
        else:
            reward = float(kind == "one")
        return Verdict(reward, "verified correct" if reward else f"expected {example.answer}")


def examples(*kinds: str) -> list[Example]:
    return [Example(prompt=f"q{i}?", answer=f"a{i}", data=(k,)) for i, k in enumerate(kinds)]
