"""Numerical checks for a new signal or loss, in the library's conventions (chex underneath).

    import hindsight.testing as hst

    def my_gate(teacher_logprobs, student_logprobs, mask, *, beta=5.0):   # [B, T] -> [B, T]
        ...

    def my_gate_reference(lt, ls, mask, *, beta=5.0):                      # float64 NumPy
        return np.where(mask, 1 / (1 + np.exp(-beta * (lt - ls))), 0.0)

    hst.check_signal(my_gate, my_gate_reference,
                     inputs=dict(teacher_logprobs=hst.LOGPROBS, student_logprobs=hst.LOGPROBS,
                                 mask=hst.MASK),
                     kwargs=dict(beta=2.0), stop_gradient=("teacher_logprobs",))

:func:`check_signal` draws the inputs once per mask pattern of :data:`MASK_PATTERNS` (an
all-masked row, a one-token row, holes inside rows, multi-turn rows with observation tokens
between turns and skipped turn ids; values at masked positions are garbage, down to -1e3) and
checks, for each: the values against the float64 reference (which gets float64 NumPy inputs),
finite values, finite gradients for every differentiable input, zero gradients through the
inputs named in ``stop_gradient``, ``jit`` == eager, ``vmap`` over a stack of two draws == two
calls, padding invariance (more masked positions at the end of every row, holding garbage, change
nothing), and micro-batch invariance (the rows split in two whole-group halves give the same
per-row outputs, and scalar outputs that are sums add up). A failure raises AssertionError naming
the check and the pattern. The inputs' kinds are :class:`Input` values (:data:`LOGPROBS`,
:data:`MASK`, :data:`TURN_ID`, :data:`ROW`, :func:`logits`, ...).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

MASK_PATTERNS = ("all_masked_row", "one_token_row", "holes", "multi_turn")
B, T = 12, 10
"""Rows and response positions of the drawn inputs (groups of 1, 2, 3 or 6 rows split ``B`` in
whole-group halves)."""
GARBAGE = -1e3


@dataclasses.dataclass(frozen=True)
class Input:
    """How one argument is drawn.

    Attributes:
      kind: ``"logprobs"`` ``[B, T]`` (negative, garbage where masked), ``"logits"`` ``[B, T, V]``
        (Gaussian, garbage where masked), ``"values"`` ``[B, T]`` (Gaussian, garbage where
        masked), ``"tokens"`` ``[B, T]`` int32 in ``[0, vocab)``, ``"mask"`` ``[B, T]`` bool,
        ``"turn_id"`` ``[B, T]`` int32 (-1 where masked),
        ``"row"`` ``[B]`` Gaussian (advantages), ``"row_mask"`` ``[B]`` 0/1 float.
      vocab: ``V`` of ``"logits"`` and ``"tokens"``.
      scale: spread of the drawn values.
      differentiable: whether its gradient is checked (float kinds only).
    """
    kind: str
    vocab: int = 0
    scale: float = 2.0
    differentiable: bool = True

    def __post_init__(self):
        kinds = ("logprobs", "logits", "values", "tokens", "mask", "turn_id", "row", "row_mask")
        if self.kind not in kinds:
            raise ValueError(f"`kind` must be one of {list(kinds)}, got {self.kind!r}")
        if self.kind in ("logits", "tokens") and self.vocab < 2:
            raise ValueError(f"kind {self.kind!r} needs `vocab` >= 2, got {self.vocab}")

    @property
    def per_token(self) -> bool:
        return self.kind in ("logprobs", "logits", "values", "tokens", "mask", "turn_id")

    @property
    def is_float(self) -> bool:
        return self.kind in ("logprobs", "logits", "values", "row")


LOGPROBS = Input("logprobs")
VALUES = Input("values")
MASK = Input("mask", differentiable=False)
TURN_ID = Input("turn_id", differentiable=False)
ROW = Input("row")
ROW_MASK = Input("row_mask", differentiable=False)


def logits(vocab: int, *, scale: float = 3.0) -> Input:
    """``[B, T, vocab]`` logits."""
    return Input("logits", vocab=vocab, scale=scale)


def tokens(vocab: int) -> Input:
    """``[B, T]`` token ids in ``[0, vocab)``."""
    return Input("tokens", vocab=vocab, differentiable=False)


def layout(pattern: str, *, seed: int = 0, b: int = B, t: int = T) -> tuple[np.ndarray, np.ndarray]:
    """``(mask [b, t] bool, turn_id [b, t] int32)`` of one of :data:`MASK_PATTERNS`. Every
    pattern has an all-masked row 0; ``one_token_row`` a row with one token; ``holes`` rows with
    masked positions inside them; ``multi_turn`` rows of several turns with observation tokens
    (mask 0) between them and skipped turn ids."""
    if pattern not in MASK_PATTERNS:
        raise ValueError(f"`pattern` must be one of {list(MASK_PATTERNS)}, got {pattern!r}")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, t + 1, b)
    mask = np.arange(t)[None] < lengths[:, None]
    turn = np.where(mask, 0, -1)
    if pattern == "one_token_row":
        mask[1] = False
        mask[1, int(rng.integers(0, t))] = True
    elif pattern == "holes":
        mask &= rng.random((b, t)) < 0.7
    elif pattern == "multi_turn":
        mask[:] = False
        turn[:] = -1
        for row in range(1, b):
            at, k = int(rng.integers(0, 2)), int(rng.integers(0, 2))
            while at < t:
                n = int(rng.integers(1, 4))
                mask[row, at:at + n] = True
                turn[row, at:at + n] = k
                at += n + int(rng.integers(1, 3))  # observation tokens between turns
                k += int(rng.integers(1, 3))       # turn ids may skip
    mask[0] = False
    turn = np.where(mask, np.where(pattern == "multi_turn", turn, 0), -1)
    return mask, turn.astype(np.int32)


def draw(inputs: Mapping[str, Input], pattern: str, *, seed: int = 0, b: int = B,
         t: int = T) -> dict[str, np.ndarray]:
    """Host arrays for ``inputs`` under ``pattern`` (float32 / bool / int32), masked positions
    holding garbage."""
    mask, turn = layout(pattern, seed=seed, b=b, t=t)
    rng = np.random.default_rng(seed + 1)
    out = {}
    for name, spec in inputs.items():
        if spec.kind == "mask":
            out[name] = mask.copy()
        elif spec.kind == "turn_id":
            out[name] = turn.copy()
        elif spec.kind == "tokens":
            out[name] = rng.integers(0, spec.vocab, (b, t)).astype(np.int32)
        elif spec.kind == "row":
            out[name] = (rng.normal(size=b) * spec.scale).astype(np.float32)
        elif spec.kind == "row_mask":
            keep = (rng.random(b) < 0.7).astype(np.float32)
            keep[1] = 0.0
            out[name] = keep
        else:
            shape = (b, t, spec.vocab) if spec.kind == "logits" else (b, t)
            x = rng.normal(size=shape) * spec.scale
            if spec.kind == "logprobs":
                x = -np.abs(x)
            where = mask[..., None] if spec.kind == "logits" else mask
            out[name] = np.where(where, x, GARBAGE * rng.random(shape)).astype(np.float32)
    return out


def _pad(inputs: Mapping[str, Input], arrays: Mapping[str, np.ndarray], extra: int, seed: int):
    """``arrays`` with ``extra`` masked positions appended to every row (garbage values)."""
    rng = np.random.default_rng(seed + 2)
    out = {}
    for name, x in arrays.items():
        spec = inputs[name]
        if not spec.per_token:
            out[name] = x
            continue
        shape = (x.shape[0], extra) + x.shape[2:]
        if spec.kind == "mask":
            tail = np.zeros(shape, bool)
        elif spec.kind == "tokens":
            tail = np.zeros(shape, np.int32)
        elif spec.kind == "turn_id":
            tail = np.full(shape, -1, np.int32)
        else:
            tail = (GARBAGE * rng.random(shape)).astype(np.float32)
        out[name] = np.concatenate([x, tail], axis=1)
    return out


def _as_jax(arrays):
    return {k: jnp.asarray(v) for k, v in arrays.items()}


def _float64(arrays):
    return {k: (np.asarray(v, np.float64) if np.issubdtype(np.asarray(v).dtype, np.floating)
                else np.asarray(v)) for k, v in arrays.items()}


def _fail(check: str, pattern: str, error: Exception):
    raise AssertionError(f"check {check!r} failed on mask pattern {pattern!r}: {error}") from error


def check_signal(fn: Callable, reference: Callable | None, *, inputs: Mapping[str, Input],
                 kwargs: Mapping | None = None, stop_gradient: Sequence[str] = (),
                 group_size: int = 1, patterns: Sequence[str] = MASK_PATTERNS,
                 rtol: float = 1e-5, atol: float = 1e-5, pad: int = 3, seed: int = 0,
                 checks: Sequence[str] | None = None) -> None:
    """Run the kit's checks (module doc) on ``fn(**inputs, **kwargs)``.

    Args:
      fn: the JAX function under test; its output is an array or a pytree of arrays: leaves with
        a leading ``B`` axis are per row (``[B, T, ...]`` leaves per token), scalar leaves sums
        over rows (``(sum, count)`` pairs), anything else compared whole.
      reference: ``reference(**inputs, **kwargs)`` on float64 NumPy arrays, the same pytree; None
        skips the comparison.
      inputs: ``{argument name: Input}``, passed by keyword.
      kwargs: static keyword options of both functions.
      stop_gradient: inputs whose gradient must be exactly zero (teachers, references).
      group_size: rows that belong together (the micro-batch halves keep them whole); 1: rows
        are independent.
      patterns: the mask patterns to draw (:data:`MASK_PATTERNS`).
      rtol, atol: tolerance of the float64 comparison (the other checks compare float32 to
        float32 at ``1e-6``).
      pad: masked positions appended for the padding check (0 skips it).
      checks: a subset of ``("reference", "finite", "gradients", "stop_gradient", "jit",
        "vmap", "padding", "microbatch")`` (None: all).
    Raises:
      AssertionError naming the check and the mask pattern.
    """
    kwargs = dict(kwargs or {})
    every = ("reference", "finite", "gradients", "stop_gradient", "jit", "vmap", "padding",
             "microbatch")
    checks = every if checks is None else tuple(checks)
    unknown = sorted(set(checks) - set(every))
    if unknown:
        raise ValueError(f"unknown checks {unknown}; known: {list(every)}")
    missing = sorted(set(stop_gradient) - set(inputs))
    if missing:
        raise ValueError(f"`stop_gradient` names {missing}, which are not among the inputs "
                         f"{sorted(inputs)}")
    if B % (2 * group_size) and "microbatch" in checks:
        raise ValueError(f"`group_size`={group_size} does not split B={B} rows in whole-group "
                         f"halves; drop 'microbatch' from `checks`")
    call = lambda arrays: fn(**arrays, **kwargs)
    jitted = jax.jit(call)
    # one compile per shape for the whole call: the patterns share their shapes
    diff = [n for n, spec in inputs.items() if spec.is_float and spec.differentiable]
    grad_fn = jax.jit(jax.grad(lambda d, rest: _scalar_objective(call({**rest, **d}))))
    vmapped = jax.jit(jax.vmap(call))
    for pattern in patterns:
        arrays = draw(inputs, pattern, seed=seed)
        x = _as_jax(arrays)
        out = jitted(x)
        steps = {
            "reference": lambda: _check_reference(reference, arrays, kwargs, out, rtol, atol),
            "finite": lambda: chex.assert_tree_all_finite(out),
            "gradients": lambda: _check_gradients(grad_fn, diff, x, stop_gradient, finite=True),
            "stop_gradient": lambda: _check_gradients(grad_fn, diff, x, stop_gradient,
                                                      finite=False),
            "jit": lambda: chex.assert_trees_all_close(call(x), out, rtol=1e-6, atol=1e-6),  # eager
            "vmap": lambda: _check_vmap(vmapped, jitted, inputs, pattern, seed, out),
            "padding": lambda: _check_padding(jitted, inputs, arrays, out, pad, seed),
            "microbatch": lambda: _check_microbatch(jitted, arrays, out, group_size),
        }
        for name in checks:
            if name == "reference" and reference is None:
                continue
            if name == "padding" and not pad:
                continue
            try:
                steps[name]()
            except AssertionError as e:
                _fail(name, pattern, e)


def _check_reference(reference, arrays, kwargs, out, rtol, atol):
    want = reference(**_float64(arrays), **kwargs)
    got = jax.tree.map(lambda a: np.asarray(a, np.float64), out)
    want = jax.tree.map(lambda a: np.asarray(a, np.float64), want)
    chex.assert_trees_all_equal_structs(got, want)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=rtol, atol=atol), got, want)


def _scalar_objective(out):
    """A fixed random linear functional of every float leaf (so no gradient cancels)."""
    leaves = [jnp.asarray(l, jnp.float32) for l in jax.tree.leaves(out)
              if jnp.issubdtype(jnp.asarray(l).dtype, jnp.floating)]
    total = jnp.float32(0.0)
    for i, leaf in enumerate(leaves):
        w = jax.random.normal(jax.random.key(i), leaf.shape)
        total = total + jnp.sum(w * leaf)
    return total


def _check_gradients(grad_fn, names, x, stop_gradient, *, finite: bool):
    if not names:
        return
    grads = grad_fn({n: x[n] for n in names}, {n: v for n, v in x.items() if n not in names})
    if finite:
        chex.assert_tree_all_finite(grads)
        return
    for n in stop_gradient:
        if n in grads and np.any(np.asarray(grads[n]) != 0):
            raise AssertionError(f"input {n!r} is under stop_gradient but its gradient is not "
                                 f"zero (max |g| = {float(np.max(np.abs(grads[n])))})")


def _check_vmap(vmapped, jitted, inputs, pattern, seed, out):
    other = _as_jax(draw(inputs, pattern, seed=seed + 7))
    stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), _as_jax(draw(inputs, pattern,
                                                                         seed=seed)), other)
    both = vmapped(stacked)
    chex.assert_trees_all_close(jax.tree.map(lambda a: a[0], both), out, rtol=1e-6, atol=1e-6)
    chex.assert_trees_all_close(jax.tree.map(lambda a: a[1], both), jitted(other), rtol=1e-6,
                                atol=1e-6)


def _check_padding(jitted, inputs, arrays, out, pad, seed):
    padded = jitted(_as_jax(_pad(inputs, arrays, pad, seed)))

    def cut(p, o):
        p, o = np.asarray(p), np.asarray(o)
        if p.ndim >= 2 and p.shape[0] == B and p.shape[1] == o.shape[1] + pad:
            return p[:, :o.shape[1]]
        return p

    chex.assert_trees_all_close(jax.tree.map(cut, padded, out), out, rtol=1e-6, atol=1e-6)


def _check_microbatch(jitted, arrays, out, group_size):
    half = B // 2
    halves = [jitted(_as_jax({k: v[s] for k, v in arrays.items()}))
              for s in (slice(0, half), slice(half, B))]

    def join(o, a, b):
        o, a, b = np.asarray(o), np.asarray(a), np.asarray(b)
        if o.ndim and o.shape[0] == B:
            return np.concatenate([a, b])
        return a + b if o.ndim == 0 else o

    joined = jax.tree.map(join, out, *halves)
    chex.assert_trees_all_close(joined, jax.tree.map(np.asarray, out), rtol=1e-5, atol=1e-6)
