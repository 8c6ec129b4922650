"""Format-independent half of weight loading: name table -> checked -> placed NNX parameters.

A loader (safetensors, GGUF) describes its file as `SourceTensor`s (name, stored shape, a lazy
reader) plus a table of `NameRule`s. `build_model` then
  1. derives every parameter the decoder needs (abstract model, no allocation),
  2. checks that each has exactly one source tensor of the right shape, and that no source tensor is
     left unexplained, and raises one `WeightLoadError` listing every problem (file + tensor) before
     any parameter is created, so nothing is ever half-loaded;
  3. reads, transforms (transpose, un-permute), casts and stacks the tensors, places them (sharded
     on `mesh` with the partition rules when given) and merges them into a `Decoder`.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from hindsight.models.config import ModelConfig
from hindsight.models.decoder import Decoder
from hindsight.models.partition import DEFAULT_RULES, is_stacked, param_path, spec_for

_MAX_LISTED = 12


class WeightLoadError(ValueError):
    """A checkpoint does not match the decoder: missing / unexpected tensor or wrong shape."""


@dataclasses.dataclass(frozen=True)
class SourceTensor:
    """A tensor in a checkpoint file: `shape` as stored (numpy order), `read()` -> np.ndarray."""

    name: str
    file: str
    shape: tuple[int, ...]
    read: Callable[[], np.ndarray]


@dataclasses.dataclass(frozen=True)
class NameRule:
    """`ours` (decoder path) <-> `theirs` (file tensor name); both may hold `{layer}`.

    `transform(array, cfg) -> array` (shape-preserving, e.g. undoing a row permutation) runs first,
    then `transpose` swaps the two axes (torch Linear `[out, in]` -> our kernel `[in, out]`)."""

    ours: str
    theirs: str
    transpose: bool = False
    transform: Callable[[np.ndarray, ModelConfig], np.ndarray] | None = None

    def match(self, path: str) -> str | None:
        """The file tensor name for decoder path `path`, or None if this rule does not cover it."""
        pattern = "^" + re.escape(self.ours).replace(r"\{layer\}", r"(?P<layer>\d+)") + "$"
        m = re.match(pattern, path)
        return None if m is None else self.theirs.format(**m.groupdict())


def build_model(cfg: ModelConfig, tensors: Sequence[SourceTensor], table: Sequence[NameRule], *,
                origin: str, ignore: Callable[[str], bool] = lambda name: False,
                dtype=jnp.float32, param_dtype=jnp.float32, scan_layers: bool = True,
                remat: bool = False, attention: str = "auto", mesh: Mesh | None = None,
                rules=DEFAULT_RULES) -> Decoder:
    """Check every source tensor against `cfg`, then build a loaded `Decoder` (see module doc).

    `origin` names the checkpoint (folder / file) in errors; `ignore(name)` marks file tensors that
    are legitimately unused (e.g. a tied `lm_head.weight`)."""
    abstract = nnx.eval_shape(lambda: Decoder(cfg, dtype=dtype, param_dtype=param_dtype,
                                              scan_layers=scan_layers, remat=remat,
                                              attention=attention, rngs=nnx.Rngs(0)))
    graphdef, abstract_state = nnx.split(abstract)
    targets = [(param_path(p), tuple(var.shape)) for p, var in nnx.to_flat_state(abstract_state)]
    plan = _plan(targets, tensors, table, origin=origin, ignore=ignore, scan_layers=scan_layers,
                 num_layers=cfg.num_layers)
    # Only now, with every tensor accounted for, is anything read or allocated.
    flat = []
    for path, var in nnx.to_flat_state(abstract_state):
        key = param_path(path)
        stacked, entries = plan[key]
        value = _materialize(entries, cfg, param_dtype, stacked=stacked)
        if mesh is None:
            array = jnp.asarray(value)
        else:
            sharding = NamedSharding(mesh, spec_for(key, value.shape, mesh=mesh, rules=rules))
            array = jax.make_array_from_callback(value.shape, sharding, lambda idx, v=value: v[idx])
        flat.append((path, var.replace(array)))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def _plan(targets, tensors, table, *, origin, ignore, scan_layers, num_layers):
    """Map each decoder path to `(stacked, [(SourceTensor, NameRule), ...])` (one entry per layer
    when stacked), or raise a `WeightLoadError` listing all missing / misshapen / unexpected tensors."""
    by_name = {t.name: t for t in tensors}
    used, problems, plan = set(), [], {}
    for path, shape in targets:
        stacked = scan_layers and is_stacked(path)
        if stacked:
            parts = [(f"layers/{i}/{path[len('layers/'):]}", tuple(shape[1:])) for i in range(num_layers)]
        else:
            parts = [(path, shape)]
        entries = []
        plan[path] = (stacked, entries)
        for unstacked, want in parts:
            found = [(r, r.match(unstacked)) for r in table]
            found = [(r, n) for r, n in found if n is not None]
            if not found:
                raise WeightLoadError(f"{origin}: no name rule for decoder parameter {unstacked!r}")
            rule, name = found[0]
            src = by_name.get(name)
            if src is None:
                problems.append(f"missing tensor {name!r} (for {unstacked}, shape {want}) in {origin}")
                continue
            used.add(name)
            stored = tuple(reversed(src.shape)) if rule.transpose else tuple(src.shape)
            if stored != want:
                problems.append(
                    f"{src.file}: tensor {name!r} has shape {tuple(src.shape)}, expected "
                    f"{tuple(reversed(want)) if rule.transpose else want} (for {unstacked})")
                continue
            entries.append((src, rule))
    for name in sorted(set(by_name) - used):
        if not ignore(name):
            problems.append(f"{by_name[name].file}: unexpected tensor {name!r} (shape "
                            f"{tuple(by_name[name].shape)}) not used by the decoder")
    if problems:
        more = f"\n  ... and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
        raise WeightLoadError(f"cannot load {origin}: {len(problems)} problem(s):\n  "
                              + "\n  ".join(problems[:_MAX_LISTED]) + more)
    return plan


def _materialize(entries, cfg: ModelConfig, param_dtype, *, stacked: bool) -> np.ndarray:
    """Read, transform and cast the source tensor(s) of one parameter; stack per-layer ones."""
    arrays = []
    for src, rule in entries:
        a = np.asarray(src.read())
        if rule.transform is not None:
            a = rule.transform(a, cfg)
        if rule.transpose:
            a = a.T
        arrays.append(np.asarray(a, dtype=jnp.dtype(param_dtype)))
    return np.stack(arrays) if stacked else arrays[0]
