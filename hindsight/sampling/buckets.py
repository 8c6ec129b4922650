"""Shape buckets, so that a run compiles a handful of times instead of once per call.

Every jitted sampling function is keyed by these rounded shapes (plus the static `SamplingParams`):

* batch (rows of a decode / prefill / score call): next power of two, at least 1. Extra rows are
  inactive padding and cost compute only up to 2x.
* prompt / context length: next power of two, at least ``MIN_PROMPT_BUCKET`` (16), up to
  ``POW2_PROMPT_LIMIT`` (128); longer ones round up to a multiple of ``LONG_PROMPT_MULTIPLE``
  (32), so that a 130-token context (an HDL hindsight context) pads to 160 rather than 192:
  prefill and teacher-forced scoring are compute-bound, and cost per padded position. Prompts are
  right-padded; the pad tokens' K/V land in slots a real token later overwrites before any query
  reads them (the cache contract: queries read only ``slot <= position``). The engine's prefills
  and turn extensions feed prompts and turns past 128 tokens in pieces of 128
  (:func:`hindsight.sampling.decode.extend_in_chunks`), so their widths stay in the powers of two
  up to 128 whatever the lengths.
* cache length (``max_len``): ``prompt bucket + max new tokens`` (or a longer sequence a caller
  needs room for, e.g. a follow-up turn after a whole response) rounded up to a multiple of
  ``CACHE_LEN_MULTIPLE`` (64).
* response length in scoring: next power of two, at least 16.
* rows moved between caches (engine refills): next power of two.

``max_new_tokens`` itself is a traced per-row limit (the decode loop is a ``while_loop`` with a traced
bound), so it never recompiles as long as the cache-length bucket holds.
"""
from __future__ import annotations

MIN_PROMPT_BUCKET = 16
POW2_PROMPT_LIMIT = 128
LONG_PROMPT_MULTIPLE = 32
CACHE_LEN_MULTIPLE = 64


def pow2_bucket(n: int, minimum: int = 1) -> int:
    """Smallest power of two ``>= max(n, minimum)``."""
    n = max(int(n), int(minimum), 1)
    return 1 << (n - 1).bit_length()


def round16(n: int) -> int:
    """``n`` (at least 0) rounded up to a multiple of 16: a token budget that tokenisation
    differences at the seams of a template do not change, so calls share compiled shapes."""
    return -(-max(int(n), 0) // 16) * 16


def prompt_bucket(length: int) -> int:
    """Padded prompt / context length for a longest prompt of ``length`` tokens."""
    if length <= POW2_PROMPT_LIMIT:
        return pow2_bucket(length, MIN_PROMPT_BUCKET)
    return -(-int(length) // LONG_PROMPT_MULTIPLE) * LONG_PROMPT_MULTIPLE


def cache_len_bucket(prompt_len: int, max_new_tokens: int, *, min_len: int = 0) -> int:
    """Cache length for prompts up to ``prompt_len`` tokens (already bucketed or not) followed by
    ``max_new_tokens`` generated ones, and for sequences of ``min_len`` tokens."""
    need = max(prompt_bucket(prompt_len) + int(max_new_tokens), int(min_len))
    return -(-need // CACHE_LEN_MULTIPLE) * CACHE_LEN_MULTIPLE
