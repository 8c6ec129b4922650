"""JAX decoding with prefix reuse: group fan-out, mid-sequence branching, continuous batching and
teacher-forced scoring under other contexts.

Layers: `params` / `truncation` (what is sampled), `decode` (the jitted prefill + ``while_loop``),
`engine` (the one sampler: continuous batching of prompts, branches and follow-up turns in a slot
batch resized to the work; its result type `Rollouts`), `rollouts` (`generate`: groups) and
`branch` (continue finished rows from a position), each one engine run to completion, `score`
(teacher forcing), `text` (strings in, strings out), `buckets` (the compiled shapes).
"""
from hindsight.sampling.params import SamplingParams
from hindsight.sampling.truncation import sample_tokens, sampling_logprobs, truncated_logits
from hindsight.sampling.rollouts import Rollouts, generate
from hindsight.sampling.branch import branch
from hindsight.sampling.score import CachedPrefix, score_hidden, score_logits, score_logprobs

__all__ = [
    "CachedPrefix", "Rollouts", "SamplingParams", "branch", "generate", "sample_tokens", "sampling_logprobs",
    "score_hidden", "score_logits", "score_logprobs", "truncated_logits",
]
