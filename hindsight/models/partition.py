"""Partition rules for FSDP + tensor parallelism over the named mesh axes `data`, `fsdp`, `tensor`.

A rule maps a regex over the parameter path ("layers/attn/q_proj/kernel", "layers/3/mlp/up_proj/kernel",
"embed", ...) to the PartitionSpec of the *unstacked* parameter. `spec_for` then
  * prepends `None` for the stacked layer axis (scan layout), which is never sharded, and pads
    the spec with `None` to the parameter's rank;
  * drops mesh axes the mesh does not have, or whose size does not divide the dimension (that
    dimension is replicated instead: correct, only less sharded).
So a mesh with any subset of the axes, including axes of size 1, works with the same rules.
The `data` axis shards only the batch, never parameters.
"""
from __future__ import annotations

import re
from typing import Sequence

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

# Heads / MLP hidden / vocab over `tensor`; the model dimension over `fsdp`.
DEFAULT_RULES: tuple[tuple[str, P], ...] = (
    (r"^embed$", P("tensor", "fsdp")),                              # [V, D]
    (r"^lm_head$", P("fsdp", "tensor")),                            # [D, V]
    (r"attn/[qkv]_proj/kernel$", P("fsdp", "tensor")),              # [D, heads*hd]
    (r"attn/[qkv]_proj/bias$", P("tensor")),                        # [heads*hd]
    (r"attn/o_proj/kernel$", P("tensor", "fsdp")),                  # [H*hd, D]
    (r"attn/o_proj/bias$", P()),                                    # [D]
    (r"mlp/(gate|up)_proj/kernel$", P("fsdp", "tensor")),           # [D, F]
    (r"mlp/down_proj/kernel$", P("tensor", "fsdp")),                # [F, D]
    (r"norm/scale$", P()),                                          # every RMSNorm
)


def param_path(path: Sequence) -> str:
    """`('layers', 0, 'attn', 'q_proj', 'kernel')` -> `'layers/0/attn/q_proj/kernel'`."""
    return "/".join(str(p) for p in path)


def is_stacked(path: str) -> bool:
    """Whether a parameter path belongs to the scan layout's stacked layers (`layers/attn/...`, not
    `layers/3/attn/...`)."""
    parts = path.split("/")
    return parts[0] == "layers" and len(parts) > 1 and not parts[1].isdigit()


def rule_spec(path: str, *, rules=DEFAULT_RULES) -> P:
    """The rule's PartitionSpec for an (unstacked) parameter path; KeyError if no rule matches."""
    for pattern, spec in rules:
        if re.search(pattern, path):
            return spec
    raise KeyError(f"no partition rule matches parameter {path!r}")


def spec_for(path: str, shape: Sequence[int], *, mesh: Mesh | None = None, rules=DEFAULT_RULES) -> P:
    """PartitionSpec of a parameter of `shape` at `path`, adapted to `mesh` (see module doc)."""
    spec = tuple(rule_spec(path, rules=rules))
    if is_stacked(path):
        spec = (None,) + spec  # the stacked layer axis is never sharded
    if len(spec) > len(shape):
        raise ValueError(f"partition spec {spec} for {path!r} has more axes than its shape {tuple(shape)}")
    spec = spec + (None,) * (len(shape) - len(spec))
    if mesh is None:
        return P(*spec)
    sizes = dict(mesh.shape)
    fitted = []
    for dim, axis in zip(shape, spec):
        axes = () if axis is None else (axis,) if isinstance(axis, str) else tuple(axis)
        keep = tuple(a for a in axes if a in sizes)
        n = 1
        for a in keep:
            n *= sizes[a]
        fitted.append(None if not keep or dim % n else keep[0] if len(keep) == 1 else keep)
    return P(*fitted)


def partition_specs(state: nnx.State, *, mesh: Mesh | None = None, rules=DEFAULT_RULES) -> nnx.State:
    """The PartitionSpec tree of a model state (`nnx.state(model)` or an abstract one from
    `nnx.eval_shape`), same structure, a `PartitionSpec` per parameter."""
    flat = [(path, var.replace(spec_for(param_path(path), var.shape, mesh=mesh, rules=rules)))
            for path, var in nnx.to_flat_state(state)]
    return nnx.from_flat_state(flat)


def shard_state(state: nnx.State, mesh: Mesh, *, rules=DEFAULT_RULES) -> nnx.State:
    """Place every parameter of `state` onto `mesh` with its rule's sharding."""
    specs = partition_specs(state, mesh=mesh, rules=rules)
    return jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), state, specs)
