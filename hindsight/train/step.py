"""The jitted, sharded train step with exact gradient accumulation.

A method supplies ``loss_fn(model, batch, **kwargs) -> (sum, count, metrics)`` where ``metrics`` is
a dict of ``(sum, count)`` pairs (the :mod:`hindsight.objectives` contract). A jitted gradient
program scans over micro-batches, adds the gradients of the *sums*, the counts and the metric
pairs, and divides once: the loss and the gradient are those of the full batch, whatever the
micro-batch count or the mesh (up to float reassociation). A second jitted program applies the
optax update, donating the old state. Both carry explicit in/out shardings.

Keyword arguments the step passes to ``loss_fn`` when its signature accepts them:
``rng`` (a key array ``[rows]``, one key per row of the micro-batch, derived from the state's RNG
and the row's global index, so per-row random choices are the same however the batch is split),
``reference`` (the merged frozen/EMA reference model, when the state keeps one) and
``method_state``.
"""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from hindsight.train.mesh import BATCH_AXES, batch_sharding, data_parallel_size, replicated
from hindsight.train.state import REFERENCES, ModelDef, TrainState

LossFn = Callable[..., tuple]


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """``batch_size``: rows per optimizer step (``B``, all processes together);
    ``num_microbatches``: gradient-accumulation splits of those rows; ``reference``: keep no
    reference (None), a ``"frozen"`` copy of the initial params, or an ``"ema"`` of the trained
    params updated after each step with ``ema_decay``."""
    batch_size: int
    num_microbatches: int = 1
    reference: str | None = None
    ema_decay: float = 0.99

    def __post_init__(self):
        for name in ("batch_size", "num_microbatches"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"step.{name} must be a positive int, got {v!r}")
        if self.batch_size % self.num_microbatches:
            raise ValueError(f"step.batch_size={self.batch_size} is not divisible by "
                             f"step.num_microbatches={self.num_microbatches}")
        if self.reference not in REFERENCES:
            raise ValueError(f"step.reference must be one of {list(REFERENCES)}, got "
                             f"{self.reference!r}")
        if not 0.0 <= self.ema_decay <= 1.0:
            raise ValueError(f"step.ema_decay must be in [0, 1], got {self.ema_decay}")

    def check_shards(self, data: int, fsdp: int) -> None:
        """Raise unless every micro-batch splits evenly over ``data * fsdp`` batch shards."""
        need = data * fsdp * self.num_microbatches
        if self.batch_size % need:
            raise ValueError(
                f"step.batch_size={self.batch_size} must be divisible by mesh.data*mesh.fsdp*"
                f"step.num_microbatches = {data}*{fsdp}*{self.num_microbatches} = {need}")


def split_microbatches(batch, num_micro: int, num_shards: int):
    """``[B, ...]`` leaves -> ``[M, B/M, ...]`` without moving rows between devices.

    Micro-batch ``m`` is the ``m``-th contiguous slice of every batch shard's rows: with ``S``
    shards the row index is ``(s, m, r) -> s*B/S + m*B/(S*M) + r``. Each device thus keeps its own
    rows, and a group of ``G`` contiguous rows stays whole when ``G`` divides ``B/(S*M)``.
    """
    def one(x):
        b = x.shape[0]
        x = x.reshape((num_shards, num_micro, b // (num_shards * num_micro)) + x.shape[1:])
        x = jnp.swapaxes(x, 0, 1).reshape((num_micro, b // num_micro) + x.shape[3:])
        return x
    return jax.tree.map(one, batch)


def _accepted(fn: Callable) -> set[str] | None:
    """Keyword names ``fn`` accepts (None = any, it takes ``**kwargs``)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params}


def _add(a, b):
    return jax.tree.map(jnp.add, a, b)


class TrainStep:
    """A compiled-on-first-call train step: ``state, metrics = step(state, batch)``.

    ``batch`` is a pytree of global arrays with ``B = config.batch_size`` rows on their leading
    axis, sharded over ``("data", "fsdp")`` (see :func:`hindsight.train.mesh.shard_batch`); the
    state is donated. ``metrics`` is a dict of float32 scalars: ``loss``, ``count`` (the summed
    loss denominator, e.g. tokens), ``grad_norm`` (before clipping), ``grad_clipped`` (1 when
    clipping fired), ``learning_rate`` (the rate used for this update) and each of the loss's
    metric pairs, divided once.
    """

    def __init__(self, loss_fn: LossFn, *, model_def: ModelDef,
                 optimizer: optax.GradientTransformation, mesh: Mesh, shardings: TrainState,
                 config: StepConfig, schedule: optax.Schedule | None = None,
                 max_grad_norm: float | None = None, loss_kwargs: dict | None = None,
                 method_update: Callable | None = None):
        config.check_shards(mesh.shape["data"], mesh.shape["fsdp"])
        if (shardings.reference is None) != (config.reference is None):
            raise ValueError(f"step.reference={config.reference!r} does not match the train state, "
                             f"which {'has no' if shardings.reference is None else 'has a'} "
                             f"reference copy (create_train_state(reference=...))")
        self.config, self.mesh = config, mesh
        self._loss_fn, self._model_def = loss_fn, model_def
        self._optimizer, self._schedule, self._max_norm = optimizer, schedule, max_grad_norm
        self._loss_kwargs = dict(loss_kwargs or {})
        self._method_update = method_update
        self._accepts = _accepted(loss_fn)
        rep = replicated(mesh)
        # Two programs: the gradient pass (also serving :meth:`grads`, compiled once) and the
        # update, which donates the old state.
        self._jitted_grads = jax.jit(
            self._accumulate, in_shardings=(shardings, rep, batch_sharding(mesh)),
            out_shardings=(shardings.params, rep, rep))
        self._jitted_apply = jax.jit(
            self._apply, in_shardings=(shardings, shardings.params, rep, rep),
            out_shardings=(shardings, rep), donate_argnums=(0,))

    def _wants(self, name: str) -> bool:
        return self._accepts is None or name in self._accepts

    def _micro_loss(self, params, batch, rng, state: TrainState, rest):
        md = ModelDef(self._model_def.graphdef, rest)
        kwargs = dict(self._loss_kwargs)
        if self._wants("rng"):
            kwargs["rng"] = jax.random.wrap_key_data(rng)
        if state.reference is not None and self._wants("reference"):
            kwargs["reference"] = md.merge(jax.lax.stop_gradient(state.reference))
        if state.method_state is not None and self._wants("method_state"):
            kwargs["method_state"] = state.method_state
        total, count, metrics = self._loss_fn(md.merge(params), batch, **kwargs)
        return jnp.asarray(total, jnp.float32), (jnp.asarray(count, jnp.float32), metrics)

    def _accumulate(self, state: TrainState, rest, batch):
        """Sum gradients, loss and metric pairs over micro-batches; divide once.

        Returns ``(grads, metrics, next_rng)``: ``grads`` float32-accumulated then cast to the
        param dtypes; ``metrics`` the finalized loss metrics plus ``loss`` and ``count``;
        ``next_rng`` the state's next RNG key data.
        """
        cfg = self.config
        key, step_key = jax.random.split(jax.random.wrap_key_data(state.rng))
        # One key per global row, split along with the rows: a loss's per-row random choices do
        # not depend on the micro-batch count or the mesh.
        row_keys = jax.random.key_data(jax.random.split(step_key, cfg.batch_size))
        micro, keys = split_microbatches((batch, row_keys), cfg.num_microbatches,
                                         data_parallel_size(self.mesh))
        # Keep each micro-batch spread over every batch shard (the reshape is device-local).
        micro, keys = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(
            x, NamedSharding(self.mesh, P(None, BATCH_AXES))), (micro, keys))
        grad_fn = jax.value_and_grad(self._micro_loss, has_aux=True)

        def micro_step(mb, k):
            (total, (count, metrics)), grads = grad_fn(state.params, mb, k, state, rest)
            return jax.tree.map(lambda g: g.astype(jnp.float32), grads), total, count, metrics

        if cfg.num_microbatches == 1:
            # No accumulator: a float32 copy of every gradient would be live for nothing.
            grads, total, count, metrics = micro_step(*jax.tree.map(lambda x: x[0], (micro, keys)))
        else:
            def body(carry, xs):
                return _add(carry, micro_step(*xs)), None

            first = jax.tree.map(lambda x: x[0], (micro, keys))
            shapes = jax.eval_shape(micro_step, *first)
            zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), shapes)
            (grads, total, count, metrics), _ = jax.lax.scan(body, zeros, (micro, keys))

        denom = jnp.maximum(count, 1.0)
        grads = jax.tree.map(lambda g, p: (g / denom).astype(p.dtype), grads, state.params)
        out = {name: s / jnp.maximum(c, 1.0) for name, (s, c) in metrics.items()}
        out.update(loss=total / denom, count=count)
        return grads, out, jax.random.key_data(key)

    def _apply(self, state: TrainState, grads, metrics: dict, rng):
        cfg = self.config
        out = dict(metrics)
        grad_norm = optax.global_norm(grads)
        updates, opt_state = self._optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        out["grad_norm"] = grad_norm
        if self._max_norm is not None:
            out["grad_clipped"] = (grad_norm > self._max_norm).astype(jnp.float32)
        if self._schedule is not None:
            out["learning_rate"] = jnp.asarray(self._schedule(state.step), jnp.float32)

        reference = state.reference
        if reference is not None and cfg.reference == "ema":
            d = cfg.ema_decay
            reference = jax.tree.map(lambda r, p: (d * r + (1.0 - d) * p).astype(r.dtype),
                                     reference, params)
        method_state = state.method_state
        if self._method_update is not None:
            method_state = self._method_update(method_state, out)
        new = TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                         rng=rng, reference=reference,
                         method_state=method_state)
        return new, out

    def check_batch(self, batch) -> None:
        """Raise (before any compile) unless every leaf has ``config.batch_size`` rows."""
        for path, x in jax.tree_util.tree_flatten_with_path(batch)[0]:
            rows = np.shape(x)[0] if np.ndim(x) else None
            if rows != self.config.batch_size:
                raise ValueError(f"batch leaf {jax.tree_util.keystr(path)} has shape "
                                 f"{np.shape(x)}; expected step.batch_size="
                                 f"{self.config.batch_size} rows on its leading axis")

    def __call__(self, state: TrainState, batch) -> tuple[TrainState, dict]:
        self.check_batch(batch)
        grads, metrics, rng = self._jitted_grads(state, self._model_def.rest, batch)
        return self._jitted_apply(state, grads, metrics, rng)

    def grads(self, state: TrainState, batch) -> tuple:
        """``(grads, metrics)`` of the step's loss at ``state`` without updating (not donated):
        the exact full-batch gradient the optimizer would see, before clipping."""
        self.check_batch(batch)
        grads, metrics, _ = self._jitted_grads(state, self._model_def.rest, batch)
        return grads, metrics

    def lower(self, state: TrainState, batch):
        """``jax.jit(...).lower`` of the gradient pass (the step's memory peak), e.g. for
        ``.compile().memory_analysis()``."""
        self.check_batch(batch)
        return self._jitted_grads.lower(state, self._model_def.rest, batch)


def make_train_step(loss_fn: LossFn, *, model_def: ModelDef, optimizer: optax.GradientTransformation,
                    mesh: Mesh, shardings: TrainState, config: StepConfig,
                    schedule: optax.Schedule | None = None, max_grad_norm: float | None = None,
                    loss_kwargs: dict | None = None,
                    method_update: Callable | None = None) -> TrainStep:
    """Build the sharded train step (validates ``config`` against ``mesh`` before compiling).

    Args:
      loss_fn: ``loss_fn(model, batch, **kwargs) -> (sum, count, metrics)``; ``batch`` is one
        micro-batch (leaves ``[B/M, ...]``); ``metrics`` maps names to ``(sum, count)`` pairs.
      model_def: the static model half from :func:`hindsight.train.state.create_train_state`.
      optimizer: optax transformation (clipping included, see :mod:`hindsight.train.optim`).
      mesh, shardings: the mesh and the TrainState of ``NamedSharding`` for in/out shardings.
      config: batch size, micro-batches, reference policy.
      schedule, max_grad_norm: only to report ``learning_rate`` and ``grad_clipped``.
      loss_kwargs: static keyword arguments for ``loss_fn`` (hyperparameters).
      method_update: ``method_update(method_state, metrics) -> method_state`` run after each
        update with the step's finalized metrics (e.g. a controller EMA); None keeps it unchanged.
    """
    return TrainStep(loss_fn, model_def=model_def, optimizer=optimizer, mesh=mesh,
                     shardings=shardings, config=config, schedule=schedule,
                     max_grad_norm=max_grad_norm, loss_kwargs=loss_kwargs,
                     method_update=method_update)
