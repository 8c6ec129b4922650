"""DAPO overlong reward shaping, measured in tokens."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight._validation import check_static_float


def overlong_penalty(lengths: jax.Array, *, max_length: int, buffer: int,
                     factor: float = 1.0) -> jax.Array:
    """Soft length penalty added to the verifier reward (DAPO ``overlong_buffer``).

    ``exceed = length - (max_length - buffer)``; ``r_over = min(-exceed / buffer * factor, 0)``: zero up to
    ``max_length - buffer`` tokens, then linear down to ``-factor`` at ``max_length`` (and below it
    beyond, as in DAPO's reward manager, which does not clamp). DAPO example: ``max_length=20480``,
    ``buffer=4096``, ``factor=1.0``.

    Args:
      lengths: ``[...]`` response lengths in tokens (int or float), e.g. ``mask.sum(-1)``.
      max_length: maximum response length ``L_max`` in tokens (static).
      buffer: ``L_buf`` in tokens, ``0 < buffer <= max_length`` (static).
      factor: penalty at ``max_length``, static float >= 0.
    Returns:
      ``[...]`` float32, <= 0.
    """
    max_length = check_static_float("max_length", max_length, low=1.0)
    buffer = check_static_float("buffer", buffer, low=0.0, high=max_length)
    if buffer == 0.0:
        raise ValueError("`buffer` must be positive (it divides the excess length), got 0")
    factor = check_static_float("factor", factor, low=0.0)
    exceed = jnp.asarray(lengths).astype(jnp.float32) - (max_length - buffer)
    return jnp.minimum(-exceed / buffer * factor, 0.0)
