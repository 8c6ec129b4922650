"""The training-batch contract between the rollout layer and the methods.

A batch is a flat ``dict`` of arrays whose leading axis is ``B`` rows; the rows of a group are
contiguous (``B = P * G``), so a batch split by whole groups is again a valid batch.

Policy context (the prompt and the sampled response, right-padded), ``L`` positions:
  * ``tokens [B, L]`` int32, ``positions [B, L]`` int32, ``attention_mask [B, L]`` bool or 0/1.

Response, ``T`` positions:
  * ``targets [B, T]`` int32: the response tokens (padding holds a valid id, e.g. 0).
  * ``target_index [B, T]`` int32: for response position ``t``, the index in ``tokens`` of the
    hidden state that predicts ``targets[:, t]`` (the position just before the token); any valid
    index at padding.
  * ``mask [B, T]`` bool or 0/1: 1 where the token gets loss (HDL continuations have 0 on the
    reused prefix).
  * ``logp_old [B, T]`` float32: sampler log-probs of the distribution actually sampled from.
  * ``advantages [B]`` (or ``[B, T]``) float32; ``rewards [B]`` float32.
  Which of ``logp_old`` / ``advantages`` / ``rewards`` a method reads is its ``FIELDS``.
  * optional ``policy_row_mask [B]`` bool or 0/1: 0 on rows trained without the policy-gradient
    term (and its KL), by the method's other terms only (OVCSD's suffix rows); absent: every row.
    :func:`hindsight.methods.policy_gradient.policy_mask` applies it.
  * optional ``row_role [B]`` int32: which of a method's row roles a row plays, routing it to that
    role's loss term; absent: every row is role 0, the policy's own sample. Counterfactual
    recoverability (:mod:`hindsight.methods.recoverability`): 0 the student's sample (SOD; also a
    supervision slot left unused, whose ``mask`` is empty), 1 a retained prefix with a teacher's
    corrective continuation, 2 a rollback branch; each row's ``mask`` holds the tokens its term
    trains (its per-token weights, 0 or 1).

Extra contexts: the same response teacher-forced after another prompt, named ``{name}``:
``{name}_tokens [B, Lc]``, ``{name}_positions [B, Lc]``, ``{name}_attention_mask [B, Lc]`` and
``{name}_target_index [B, T]`` (indices into ``{name}_tokens``). Names in use: ``teacher``
(question + reference answer / feedback), ``probe`` (reference only, OPSD-PMI), ``hindsight``
(question + feedback + reflection, HDL). Each method's ``CONTEXTS`` says which it reads, so the
rollout layer builds only those. A context some rows have no content for (a teacher recipe whose
parts a row lacks, :mod:`hindsight.rollout.contexts`) also carries ``{name}_row_mask [B]`` (0 on
such rows, whose context tokens are a placeholder); a loss reading it leaves those rows out
(:func:`hindsight.methods.forward.context_mask`).

Packed contexts (:mod:`hindsight.packing`, the train step's ``train.packing``): a context's
``tokens`` / ``positions`` / ``attention_mask`` may be replaced by its sequences laid end to end
in ``C`` chunks of ``R`` rows of ``L`` positions, ``{name}_packed_tokens``,
``{name}_packed_positions``, ``{name}_packed_segments`` and ``{name}_packed_prefixes``
``[C, R, L]`` int32 (segment 0 is padding; each other value one piece of a sequence: a row's own
tokens, or one copy of a prefix rows of the chunk share; a position's ``packed_prefixes`` is the
segment it also sees, its own where none); chunk ``c`` holds the sequences of the ``c``-th
contiguous ``B / C`` rows, and ``{name}_target_index [B, T]`` then indexes the flattened ``R * L``
positions of the row's own chunk.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import jax
import numpy as np

from hindsight._validation import shape_of

CONTEXT_NAMES = ("teacher", "probe", "hindsight")
POLICY_KEYS = ("tokens", "positions", "attention_mask")
RESPONSE_KEYS = ("targets", "target_index", "mask")
FIELD_KEYS = ("logp_old", "advantages", "rewards")
CONTEXT_KEYS = ("tokens", "positions", "attention_mask", "target_index")
OPTIONAL_CONTEXT_KEYS = ("row_mask",)
PACKED_KEYS = ("packed_tokens", "packed_positions", "packed_segments",  # replace POLICY_KEYS
               "packed_prefixes")
_INT_KEYS = ("tokens", "positions", "targets", "target_index")


def context_key(context: str | None, key: str) -> str:
    """Batch key of ``key`` in ``context``: ``"tokens"`` (policy) or ``"teacher_tokens"``."""
    return key if context is None else f"{context}_{key}"


def is_packed(batch: Mapping, context: str | None = None) -> bool:
    """Whether ``context`` (None: the policy context) of ``batch`` is packed."""
    return context_key(context, "packed_tokens") in batch


def _is_int(x) -> bool:
    dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
    return np.issubdtype(np.dtype(dtype), np.integer)


def _check_index_range(name: str, index, length: int) -> None:
    """Raise if a concrete index array leaves ``[0, length)``; no-op under tracing."""
    if isinstance(index, jax.core.Tracer):
        return
    i = np.asarray(index)
    if i.size and (i.min() < 0 or i.max() >= length):
        raise ValueError(f"`{name}` holds indices in [{i.min()}, {i.max()}] but its context has "
                         f"{length} positions (valid [0, {length})); point padding at 0")


def check_batch(batch: Mapping, *, method: str, contexts: Iterable[str] = (),
                fields: Iterable[str] = ()) -> tuple[int, int]:
    """Validate ``batch`` for ``method``; return ``(B, T)``. Static checks only (trace-safe), plus
    index ranges when the arrays are concrete.

    Args:
      batch: the batch dict (see the module doc).
      method: the method's name, for error messages.
      contexts: extra context names the method reads.
      fields: which of ``logp_old`` / ``advantages`` / ``rewards`` it reads.
    Raises:
      KeyError naming the missing key, the context and the method; ValueError / TypeError on a shape
      or dtype mismatch, naming the key and the shapes.
    """
    if not isinstance(batch, Mapping):
        raise TypeError(f"method {method!r}: the batch must be a dict of arrays, got "
                        f"{type(batch).__name__}")
    # (batch key, base key, context) for every key the method reads.
    def layout(c):  # a context's token keys, packed or not
        return PACKED_KEYS if is_packed(batch, c) else POLICY_KEYS

    required = [(k, k, None) for k in layout(None) + RESPONSE_KEYS + tuple(fields)]
    for c in contexts:
        required += [(context_key(c, k), k, c) for k in layout(c) + ("target_index",)]
    for key, _, ctx in required:
        if key not in batch:
            where = f" (context {ctx!r})" if ctx else ""
            raise KeyError(f"method {method!r} needs batch key {key!r}{where}; the batch has "
                           f"{sorted(batch)}")
    for key, base, _ in required:
        if (base in _INT_KEYS or base in PACKED_KEYS) and not _is_int(batch[key]):
            raise TypeError(f"method {method!r}: batch[{key!r}] must be an integer array, got "
                            f"dtype {np.dtype(batch[key].dtype)}")
    targets = shape_of(batch["targets"])
    if len(targets) != 2:
        raise ValueError(f"method {method!r}: batch['targets'] must be [B, T], got shape {targets}")
    b, t = targets

    def expect(key, shape):
        if shape_of(batch[key]) != shape:
            raise ValueError(f"method {method!r}: batch[{key!r}] has shape "
                             f"{shape_of(batch[key])}, expected {shape} (B={b}, T={t} from "
                             f"batch['targets'] {targets})")

    for ctx in (None, *contexts):
        keys = layout(ctx)
        tok = shape_of(batch[context_key(ctx, keys[0])])
        if is_packed(batch, ctx):
            if len(tok) != 3 or tok[0] < 1 or b % tok[0]:
                raise ValueError(f"method {method!r}: batch[{context_key(ctx, keys[0])!r}] has "
                                 f"shape {tok}, expected [C, R, L] with C dividing B={b}")
            width = tok[1] * tok[2]   # target_index points into its chunk's R * L positions
        else:
            if len(tok) != 2 or tok[0] != b:
                raise ValueError(f"method {method!r}: batch[{context_key(ctx, keys[0])!r}] has "
                                 f"shape {tok}, expected [B={b}, L]")
            width = tok[1]
        for k in keys[1:]:
            expect(context_key(ctx, k), tok)
        expect(context_key(ctx, "target_index"), (b, t))
        if ctx is not None and context_key(ctx, "row_mask") in batch:
            expect(context_key(ctx, "row_mask"), (b,))
        _check_index_range(context_key(ctx, "target_index"),
                           batch[context_key(ctx, "target_index")], width)
    expect("mask", (b, t))
    if "policy_row_mask" in batch:
        expect("policy_row_mask", (b,))
    if "row_role" in batch:
        expect("row_role", (b,))
        if not _is_int(batch["row_role"]):
            raise TypeError(f"method {method!r}: batch['row_role'] must be an integer array, got "
                            f"dtype {np.dtype(batch['row_role'].dtype)}")
    if "logp_old" in fields:
        expect("logp_old", (b, t))
    if "rewards" in fields:
        expect("rewards", (b,))
    if "advantages" in fields and shape_of(batch["advantages"]) not in ((b,), (b, t)):
        raise ValueError(f"method {method!r}: batch['advantages'] has shape "
                         f"{shape_of(batch['advantages'])}, expected ({b},) or ({b}, {t})")
    return b, t


def build_batch(*, tokens, positions, attention_mask, targets, target_index, mask,
                logp_old=None, advantages=None, rewards=None,
                contexts: Mapping[str, Mapping] | None = None) -> dict:
    """Assemble and validate a batch (the rollout layer's constructor).

    Args:
      tokens, positions, attention_mask: ``[B, L]`` policy context.
      targets, target_index, mask: ``[B, T]``.
      logp_old: optional ``[B, T]``. advantages: optional ``[B]`` or ``[B, T]``. rewards: optional
        ``[B]``.
      contexts: ``{name: {"tokens", "positions", "attention_mask", "target_index"}}`` for each extra
        context (names from ``CONTEXT_NAMES``), optionally with ``"row_mask"`` ``[B]``.
    Returns:
      The flat batch dict (arrays as given, no copies).
    """
    batch = dict(tokens=tokens, positions=positions, attention_mask=attention_mask,
                 targets=targets, target_index=target_index, mask=mask)
    fields = []
    for name, value in (("logp_old", logp_old), ("advantages", advantages), ("rewards", rewards)):
        if value is not None:
            batch[name] = value
            fields.append(name)
    contexts = dict(contexts or {})
    for name, ctx in contexts.items():
        if name not in CONTEXT_NAMES:
            raise ValueError(f"unknown context {name!r}; known contexts: {list(CONTEXT_NAMES)}")
        missing = [k for k in CONTEXT_KEYS if k not in ctx]
        if missing:
            raise KeyError(f"context {name!r} is missing {missing}; it needs {list(CONTEXT_KEYS)}")
        extra = sorted(set(ctx) - set(CONTEXT_KEYS) - set(OPTIONAL_CONTEXT_KEYS))
        if extra:
            raise KeyError(f"context {name!r} has unknown keys {extra}; expected "
                           f"{list(CONTEXT_KEYS)} (optional: {list(OPTIONAL_CONTEXT_KEYS)})")
        batch.update({context_key(name, k): ctx[k] for k in CONTEXT_KEYS + OPTIONAL_CONTEXT_KEYS
                      if k in ctx})
    check_batch(batch, method="build_batch", contexts=tuple(contexts), fields=tuple(fields))
    return batch
