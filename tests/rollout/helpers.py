"""Test doubles for the rollout tests: the library's character tokenizer and tiny decoder
(:mod:`hindsight.testing`), and a verifier whose rewards the test controls."""
from __future__ import annotations

import collections
import dataclasses

from hindsight.testing import CharTokenizer, char_model
from hindsight.tasks import Example, Verdict

__all__ = ["CharTokenizer", "ScriptedTask", "char_model", "examples"]


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


def configured(name, *, group_size=None, temperature=1.0, max_new_tokens=64, **options):
    """The registry's ``name`` configured for a rollout of ``group_size`` rows per prompt."""
    from hindsight.methods import RolloutShape, get_method
    return get_method(name).configure(options, rollout=RolloutShape(
        group_size=group_size, max_new_tokens=max_new_tokens, temperature=temperature))
