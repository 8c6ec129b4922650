"""Train state: everything a step reads and writes, as one pytree that orbax saves as-is.

An NNX model is split once into a static ``graphdef``, its trainable ``nnx.Param`` state and the
remaining (non-trainable) state. Only the trainable part lives in :class:`TrainState`; the graphdef
and the rest are held by :class:`ModelDef` and merged back inside the jitted step.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct
from jax.sharding import Mesh

from hindsight.train.mesh import PartitionRules, param_shardings, path_str, replicated

REFERENCES = (None, "frozen", "ema")


@struct.dataclass
class TrainState:
    """Shapes: ``step`` int32 ``[]``; ``rng`` uint32 key data (``[2]`` for threefry);
    ``params`` / ``reference`` pytrees of the model's ``nnx.Param`` arrays; ``opt_state`` optax's;
    ``method_state`` any pytree of arrays a method carries between steps (e.g. a controller EMA).
    ``reference`` is None unless a frozen or EMA copy of the params is kept (KL, self-distillation).
    """
    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array
    reference: Any = None
    method_state: Any = None


@dataclasses.dataclass(frozen=True)
class ModelDef:
    """The static half of a split NNX model: ``nnx.merge(graphdef, params, rest)`` rebuilds it."""
    graphdef: Any
    rest: Any

    def merge(self, params):
        return nnx.merge(self.graphdef, params, self.rest)


def split_model(model: nnx.Module) -> tuple[ModelDef, Any]:
    """``model`` -> (ModelDef, trainable params)."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return ModelDef(graphdef, rest), params


def _opt_shardings(abstract_opt, params, p_shardings, mesh: Mesh):
    """Shard each optimizer leaf like the parameter it mirrors, found by path suffix and shape.

    Adam moments are stored under paths ``.../mu/<param path>``; scalars (counts) and anything
    without a matching parameter are replicated.
    """
    table = {}
    for (path, leaf), sh in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                                jax.tree.leaves(p_shardings)):
        table[path_str(path)] = (tuple(np.shape(leaf)), sh)

    def one(path, leaf):
        s = path_str(path)
        best = None
        for p, (shape, sh) in table.items():
            if (s == p or s.endswith("/" + p)) and shape == tuple(np.shape(leaf)):
                if best is None or len(p) > len(best[0]):
                    best = (p, sh)
        return best[1] if best else replicated(mesh)
    return jax.tree_util.tree_map_with_path(one, abstract_opt)


def state_shardings(abstract_state: TrainState, mesh: Mesh, rules: PartitionRules | None) -> TrainState:
    """A TrainState of ``NamedSharding``: params/reference by ``rules``, optimizer state to match."""
    p_sh = param_shardings(abstract_state.params, mesh, rules)
    return TrainState(
        step=replicated(mesh), rng=replicated(mesh), params=p_sh,
        opt_state=_opt_shardings(abstract_state.opt_state, abstract_state.params, p_sh, mesh),
        reference=None if abstract_state.reference is None else p_sh,
        method_state=jax.tree.map(lambda _: replicated(mesh), abstract_state.method_state))


def _reference_copy(params, dtype):
    """A fresh copy of ``params`` in ``dtype`` (None: each leaf's own dtype). A real copy even
    when nothing is cast: the step donates the state, so no buffer may be shared."""
    def copy(p):
        return jnp.array(p, dtype=p.dtype if dtype is None else dtype, copy=True)
    return jax.tree.map(copy, params)


def abstract_train_state(params, optimizer: optax.GradientTransformation, *,
                         reference: str | None = None, reference_dtype=None,
                         method_state=None) -> TrainState:
    """The TrainState's shapes and dtypes (``jax.ShapeDtypeStruct`` leaves), nothing allocated.
    ``params`` may itself be abstract (``nnx.eval_shape`` of a model: a dry run)."""
    def build(params, method_state):
        return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                          opt_state=optimizer.init(params),
                          rng=jax.random.key_data(jax.random.key(0)),
                          reference=_reference_copy(params, reference_dtype) if reference else None,
                          method_state=method_state)
    return jax.eval_shape(build, params, method_state)


def with_shardings(abstract: TrainState, shardings: TrainState) -> TrainState:
    """Attach target shardings to an abstract state (the restore target for orbax)."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, shardings)


def create_train_state(model: nnx.Module, optimizer: optax.GradientTransformation, *, mesh: Mesh,
                       rules: PartitionRules | None = None, seed: int = 0,
                       reference: str | None = None, reference_dtype=None,
                       method_state=None) -> tuple[TrainState, TrainState, ModelDef]:
    """Split ``model`` and place a fresh TrainState on ``mesh``.

    Args:
      model: an NNX model; its ``nnx.Param`` leaves are trained, everything else is frozen.
      optimizer: the optax transformation (see :func:`hindsight.train.optim.make_optimizer`).
      mesh: a ``("data", "fsdp", "tensor")`` mesh.
      rules: partition rules for parameter paths (regex/spec pairs or a callable).
      seed: the state's RNG seed.
      reference: None, ``"frozen"`` (a fixed copy of the initial params) or ``"ema"`` (updated in
        the step with :class:`hindsight.train.step.StepConfig` ``ema_decay``).
      reference_dtype: the reference copy's dtype (None: the params'; ``"bfloat16"`` halves a
        frozen reference).
      method_state: initial method state pytree (replicated), or None.
    Returns:
      ``(state, shardings, model_def)``: the state on the mesh, its TrainState of
      ``NamedSharding`` (for ``jax.jit`` and restore) and the static model half.
    """
    if reference not in REFERENCES:
        raise ValueError(f"`reference` must be one of {list(REFERENCES)}, got {reference!r}")
    model_def, params = split_model(model)
    abstract = abstract_train_state(params, optimizer, reference=reference,
                                    reference_dtype=reference_dtype, method_state=method_state)
    shardings = state_shardings(abstract, mesh, rules)
    params = jax.device_put(params, shardings.params)
    model_def = ModelDef(model_def.graphdef, jax.device_put(model_def.rest, replicated(mesh)))

    def build(params, method_state):
        return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                          opt_state=optimizer.init(params),
                          rng=jax.random.key_data(jax.random.key(seed)),
                          reference=(_reference_copy(params, reference_dtype) if reference
                                     else None),
                          method_state=method_state)
    state = jax.jit(build, out_shardings=shardings)(params, method_state)
    return state, shardings, model_def
