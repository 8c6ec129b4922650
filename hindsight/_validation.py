"""Argument checks shared by every layer.

All checks run at trace time on static information (ranks, shapes, dtypes). Value checks (token ids
inside the vocabulary) run only when the array is concrete, i.e. outside `jit`; under `jit` they are
skipped because raising on traced values is impossible.
"""
from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp


def shape_of(x) -> tuple:
    return tuple(np.shape(x))


def check_rank(name: str, x, *, rank: int | None = None, min_rank: int | None = None) -> None:
    """Raise ValueError unless `x` has exactly `rank` (or at least `min_rank`) dimensions."""
    nd = len(shape_of(x))
    if rank is not None and nd != rank:
        raise ValueError(f"`{name}` must have rank {rank}, got shape {shape_of(x)}")
    if min_rank is not None and nd < min_rank:
        raise ValueError(f"`{name}` must have rank >= {min_rank}, got shape {shape_of(x)}")


def check_same_shape(names: tuple[str, ...], *xs) -> None:
    """Raise ValueError unless all arrays share one shape."""
    shapes = [shape_of(x) for x in xs]
    if any(s != shapes[0] for s in shapes[1:]):
        desc = ", ".join(f"`{n}` {s}" for n, s in zip(names, shapes))
        raise ValueError(f"shape mismatch: {desc}")


def check_vocab_match(name_a: str, a, name_b: str, b) -> None:
    """Raise ValueError unless two logits tensors have identical shapes (same positions, same vocab)."""
    sa, sb = shape_of(a), shape_of(b)
    if sa[-1:] != sb[-1:]:
        raise ValueError(
            f"vocab mismatch: `{name_a}` has vocab {sa[-1] if sa else None} (shape {sa}) but "
            f"`{name_b}` has vocab {sb[-1] if sb else None} (shape {sb}); pad the smaller "
            f"vocabulary and pass `vocab_mask`")
    if sa != sb:
        raise ValueError(f"shape mismatch: `{name_a}` {sa} vs `{name_b}` {sb}")


def check_leading(name: str, x, lead: tuple, lead_name: str) -> None:
    """Raise ValueError unless `x.shape` starts with `lead` (the shape of `lead_name`)."""
    s = shape_of(x)
    if s[: len(lead)] != tuple(lead):
        raise ValueError(f"`{name}` has shape {s}, expected leading dims {tuple(lead)} to match `{lead_name}`")


def check_tokens_in_vocab(name: str, tokens, vocab: int) -> None:
    """Raise ValueError if concrete `tokens` hold ids outside `[0, vocab)`. No-op under tracing."""
    if not jnp.issubdtype(jnp.asarray(tokens).dtype if not isinstance(tokens, jax.core.Tracer)
                          else tokens.dtype, jnp.integer):
        raise TypeError(f"`{name}` must be an integer array, got dtype {tokens.dtype}")
    if isinstance(tokens, jax.core.Tracer):
        return
    t = np.asarray(tokens)
    if t.size and (t.min() < 0 or t.max() >= vocab):
        raise ValueError(
            f"`{name}` holds ids in [{t.min()}, {t.max()}] but the vocabulary has {vocab} entries "
            f"(valid ids are [0, {vocab})); pad masked positions with a valid id such as 0")


def check_group_size(batch: int, group_size: int, *, name: str = "group_size") -> None:
    """Raise ValueError unless `group_size` is a positive int dividing `batch`."""
    if not isinstance(group_size, (int, np.integer)) or isinstance(group_size, bool) or group_size < 1:
        raise ValueError(f"`{name}` must be a positive Python int, got {group_size!r}")
    if batch % group_size:
        raise ValueError(f"`{name}`={group_size} does not divide the batch size B={batch}")


def check_static_float(name: str, value, *, low: float | None = None, high: float | None = None) -> float:
    """Return `value` as a Python float; raise if it is traced or outside `[low, high]`."""
    if isinstance(value, jax.core.Tracer):
        raise TypeError(f"`{name}` must be a static Python number (it selects a code path), got a tracer")
    v = float(value)
    if (low is not None and v < low) or (high is not None and v > high):
        raise ValueError(f"`{name}` must be in [{low}, {high}], got {v}")
    return v


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {sorted(choices)}, got {value!r}")
