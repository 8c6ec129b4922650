"""The jitted, sharded train step with exact gradient accumulation over named loss terms.

A method supplies ``loss_fn(model, batch, **kwargs) -> Loss`` (:mod:`hindsight.objectives.terms`):
named terms, each a ``(sum, count)`` pair with a weight, and metrics as ``(sum, count)`` pairs. The
step's objective is ``sum_k weight_k * sum_k / count_k`` over the *whole* batch, whatever the
micro-batch count or the mesh (up to float reassociation):

1. every term's count is added over the micro-batches first (counts depend on the batch only, so
   XLA reduces that pass to the mask arithmetic: the model passes in it are dead code);
2. one gradient pass scans the micro-batches, each contributing ``sum_k weight_k * sum_k^m /
   count_k``: one float32 gradient accumulator serves every term;
3. a second jitted program applies the optax update, donating the old state.

Both programs carry explicit in/out shardings.

Row layout (:func:`shard_batch`, :func:`check_layout`). The step takes each process's rows of the
optimizer step's batch (``B / process_count`` rows, in process order) and lays them out as
``[M, B / M, ...]`` global arrays, the row axis split over ``("data", "fsdp")``: micro-batch ``m``
is the ``m``-th contiguous slice of every process's rows. With groups of ``G`` contiguous rows a
micro-batch therefore holds whole groups when ``G`` divides ``B / (M * process_count)``; a loss that
couples the rows of a group (``StepConfig.group_size``, e.g. CRAFT's sibling credit) is refused
otherwise, before anything compiles. Inside a micro-batch a group may still span devices (8
devices, 4 rows each, groups of 8): the loss sees the logical micro-batch and XLA moves the few
``[B, T]`` values a group reduction needs.

Keyword arguments the step passes to ``loss_fn`` when its signature accepts them:
``head`` (the :class:`~hindsight.methods.LMHead`), ``rng`` (a key array ``[rows]``, one key per
row of the micro-batch, derived from the state's RNG and the row's index in the step's batch, so
per-row random choices are the same however the batch is split), ``reference`` (the merged
frozen/EMA reference model, when the state keeps one), ``method_state`` and ``counts`` (each term's
count over the whole optimizer step, from pass 1, when there is more than one micro-batch): a
loss given ``counts`` may return its :class:`~hindsight.objectives.Loss` with ``objective`` formed
(``sum_k weight_k * sum_k / counts_k`` with the gradient, e.g. position by position inside the LM
head, :func:`hindsight.methods.policy_gradient.surrogate_loss`), which the step then
differentiates instead of recombining the terms.
"""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from hindsight.objectives import objective, term_metrics
from hindsight.packing import (pack_batch, packed_fraction, packed_rows, shared_tokens_saved,
                               with_packed_rows)
from hindsight.train import multihost
from hindsight.train.mesh import BATCH_AXES, replicated
from hindsight.train.state import REFERENCES, ModelDef, TrainState, split_model

LossFn = Callable[..., object]


def _positive_int(where: str, v) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{where} must be a positive int, got {v!r}")


def check_layout(*, batch_size: int, num_microbatches: int = 1, group_size: int | None = None,
                 ppo_minibatches: int = 1, mesh_shape: dict | None = None,
                 process_count: int = 1, couples_rows: bool = False) -> None:
    """Raise ValueError (naming every number involved) unless a rollout of ``batch_size`` rows
    splits into ``ppo_minibatches`` mini-batches of whole groups, each into ``num_microbatches``
    micro-batches over ``process_count`` processes and the ``data * fsdp`` batch shards, and,
    when the loss ``couples_rows``, every micro-batch holds whole groups of ``group_size``.

    ``batch_size`` counts the rows of one rollout (all processes); ``mesh_shape`` maps axis names
    to sizes (``mesh.shape``).
    """
    for name, v in (("batch_size", batch_size), ("num_microbatches", num_microbatches),
                    ("ppo_minibatches", ppo_minibatches), ("process_count", process_count)):
        _positive_int(name, v)
    shape = dict(mesh_shape or {})
    shards = int(np.prod([shape.get(a, 1) for a in BATCH_AXES]))
    mesh = "(" + ", ".join(f"{a}={shape[a]}" for a in shape) + ")" if shape else "(1 device)"
    where = (f"(rows {batch_size}, group_size={group_size}, "
             f"train.ppo_minibatches={ppo_minibatches}, train.num_microbatches={num_microbatches}, "
             f"{process_count} process(es), mesh {mesh})")
    g = group_size or 1
    if batch_size % (g * ppo_minibatches * process_count):
        raise ValueError(f"a rollout must split into train.ppo_minibatches mini-batches of whole "
                         f"groups on every process: group_size * ppo_minibatches * processes = "
                         f"{g * ppo_minibatches * process_count} must divide the rows {where}")
    step_rows = batch_size // ppo_minibatches
    need = num_microbatches * shards
    if step_rows % need:
        raise ValueError(f"the rows of one optimizer step ({step_rows}) must split evenly into "
                         f"train.num_microbatches * data * fsdp = {need} pieces {where}")
    if couples_rows and step_rows % (g * num_microbatches * process_count):
        raise ValueError(f"this loss couples the rows of a group, so every micro-batch must hold "
                         f"whole groups: group_size * num_microbatches * processes = "
                         f"{g * num_microbatches * process_count} must divide the rows of one "
                         f"optimizer step ({step_rows}) {where}; lower train.num_microbatches or "
                         f"train.ppo_minibatches, or raise rollout.prompts_per_step")


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """``batch_size``: rows per optimizer step (``B``, all processes together);
    ``num_microbatches``: gradient-accumulation splits of those rows; ``group_size``: when set,
    the loss couples the rows of each group of ``group_size`` contiguous rows and every
    micro-batch must hold whole groups (:func:`check_layout`); ``reference``: keep no reference
    (None), a ``"frozen"`` copy of the initial params, or an ``"ema"`` of the trained params
    updated after each optimizer step with ``ema_decay``; ``packing``: run the model over
    packed rows (:mod:`hindsight.packing`), one chunk per micro-batch and batch shard, each row
    ``pack_row_multiple`` times the batch's width."""
    batch_size: int
    num_microbatches: int = 1
    group_size: int | None = None
    reference: str | None = None
    ema_decay: float = 0.99
    packing: bool = False
    pack_row_multiple: int = 1

    def __post_init__(self):
        _positive_int("step.batch_size", self.batch_size)
        _positive_int("step.num_microbatches", self.num_microbatches)
        if self.group_size is not None:
            _positive_int("step.group_size", self.group_size)
        if self.reference not in REFERENCES:
            raise ValueError(f"step.reference must be one of {list(REFERENCES)}, got "
                             f"{self.reference!r}")
        if not 0.0 <= self.ema_decay <= 1.0:
            raise ValueError(f"step.ema_decay must be in [0, 1], got {self.ema_decay}")
        if not isinstance(self.packing, bool):
            raise ValueError(f"step.packing must be a bool, got {self.packing!r}")
        _positive_int("step.pack_row_multiple", self.pack_row_multiple)
        if self.pack_row_multiple > 1 and not self.packing:
            raise ValueError(f"step.pack_row_multiple={self.pack_row_multiple} needs "
                             f"step.packing=True")

    def check(self, mesh: Mesh) -> None:
        """:func:`check_layout` of one optimizer step's rows on ``mesh``."""
        check_layout(batch_size=self.batch_size, num_microbatches=self.num_microbatches,
                     group_size=self.group_size, mesh_shape=dict(mesh.shape),
                     process_count=jax.process_count(), couples_rows=self.group_size is not None)


def shard_batch(batch, mesh: Mesh, *, num_microbatches: int = 1):
    """This process's rows ``[B / process_count, ...]`` -> global ``[M, B / M, ...]`` arrays.

    Micro-batch ``m`` is the ``m``-th contiguous slice of every process's rows; its row axis is
    split over ``("data", "fsdp")`` (see the module doc). Host arrays are not copied before the
    transfer. ``jax.ShapeDtypeStruct`` leaves (a dry run's abstract rows) give the global arrays'
    ``ShapeDtypeStruct`` with their sharding.
    """
    sharding = NamedSharding(mesh, P(None, BATCH_AXES))
    n = jax.process_count()

    def one(x):
        if isinstance(x, jax.ShapeDtypeStruct):
            shape = (num_microbatches, x.shape[0] * n // num_microbatches) + tuple(x.shape[1:])
            return jax.ShapeDtypeStruct(shape, x.dtype, sharding=sharding)
        x = np.asarray(x)
        local = x.reshape((num_microbatches, x.shape[0] // num_microbatches) + x.shape[1:])
        shape = (num_microbatches, local.shape[1] * n) + x.shape[1:]
        return jax.make_array_from_process_local_data(sharding, local, shape)
    return jax.tree.map(one, batch)


def _micro_row_order(batch_size: int, num_micro: int, processes: int) -> np.ndarray:
    """``[M, B/M]`` indices into the step's rows (process-major order) of each laid-out row."""
    per = batch_size // (processes * num_micro)
    rows = np.arange(batch_size).reshape(processes, num_micro, per)
    return rows.transpose(1, 0, 2).reshape(num_micro, batch_size // num_micro)


def _accepted(fn: Callable) -> set[str] | None:
    """Keyword names ``fn`` accepts (None = any, it takes ``**kwargs``)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params}


def _add(a, b):
    return jax.tree.map(jnp.add, a, b)


def _first(tree):
    return jax.tree.map(lambda x: x[0], tree)


class TrainStep:
    """A compiled-on-first-call train step: ``state, metrics = step(state, batch)``.

    ``batch`` is this process's rows of one optimizer step (host or device arrays, ``B /
    process_count`` rows on their leading axis, groups contiguous); the state is donated.
    ``metrics`` is a dict of float32 scalars: ``loss`` (the weighted objective), per term
    ``loss/<name>`` (its mean), ``weight/<name>`` and ``count/<name>`` (its normaliser over the
    batch), ``grad_norm`` (before clipping), ``nonfinite`` (1 when the loss or the gradient was not
    finite and the update was therefore not applied), ``grad_clipped`` (1 when clipping fired),
    ``learning_rate`` (the rate used for this update), with ``packing`` ``packed_fraction`` (real
    tokens over packed positions) and ``shared_tokens_saved`` (the fraction of the real tokens the
    shared prefix copies leave out), both of this process's policy context, and each of the
    loss's metric pairs, divided once.
    """

    def __init__(self, loss_fn: LossFn, *, model_def: ModelDef,
                 optimizer: optax.GradientTransformation, mesh: Mesh, shardings: TrainState,
                 config: StepConfig, schedule: optax.Schedule | None = None,
                 max_grad_norm: float | None = None, loss_kwargs: dict | None = None,
                 head=None, external_teacher: nnx.Module | None = None):
        config.check(mesh)
        if (shardings.reference is None) != (config.reference is None):
            raise ValueError(f"step.reference={config.reference!r} does not match the train state, "
                             f"which {'has no' if shardings.reference is None else 'has a'} "
                             f"reference copy (create_train_state(reference=...))")
        self.config, self.mesh = config, mesh
        self._loss_fn, self._model_def = loss_fn, model_def
        self._optimizer, self._schedule, self._max_norm = optimizer, schedule, max_grad_norm
        self._loss_kwargs = dict(loss_kwargs or {})
        self._head = head
        self._accepts = _accepted(loss_fn)
        self._order = _micro_row_order(config.batch_size, config.num_microbatches,
                                       jax.process_count())
        rep = replicated(mesh)
        micro = NamedSharding(mesh, P(None, BATCH_AXES))
        # The external teacher is an input of the gradient pass (never a constant of the program,
        # never part of the state): its params keep the shardings they were loaded with, a model
        # loaded off the mesh is replicated on it.
        self._teacher_def, self._teacher_params, teacher_sh = None, None, None
        if external_teacher is not None:
            self._teacher_def, params = split_model(external_teacher)
            teacher_sh = jax.tree.map(
                lambda x: x.sharding if isinstance(getattr(x, "sharding", None), NamedSharding)
                and x.sharding.mesh == mesh else rep, params)
            self._teacher_params = _put(params, teacher_sh)
        # Two programs: the gradient pass (also serving :meth:`grads`, compiled once) and the
        # update, which donates the old state.
        self._jitted_grads = jax.jit(
            self._accumulate, in_shardings=(shardings, rep, micro, teacher_sh),
            out_shardings=(shardings.params, rep, rep))
        self._jitted_apply = jax.jit(
            self._apply, in_shardings=(shardings, shardings.params, rep, rep),
            out_shardings=(shardings, rep), donate_argnums=(0,))

    def _wants(self, name: str) -> bool:
        return self._accepts is None or name in self._accepts

    def _loss(self, params, batch, rng, state: TrainState, rest, teacher, counts=None):
        md = ModelDef(self._model_def.graphdef, rest)
        kwargs = dict(self._loss_kwargs)
        if teacher is not None and self._wants("external_teacher"):
            kwargs["external_teacher"] = self._teacher_def.merge(jax.lax.stop_gradient(teacher))
        if counts is not None and self._wants("counts"):
            kwargs["counts"] = counts
        if self._head is not None and self._wants("head"):
            kwargs["head"] = self._head
        if self._wants("rng"):
            kwargs["rng"] = jax.random.wrap_key_data(rng)
        if state.reference is not None and self._wants("reference"):
            kwargs["reference"] = md.merge(jax.lax.stop_gradient(state.reference))
        if state.method_state is not None and self._wants("method_state"):
            kwargs["method_state"] = state.method_state
        return self._loss_fn(md.merge(params), batch, **kwargs)

    def _accumulate(self, state: TrainState, rest, micro, teacher):
        """Counts, then gradients of the weighted term sums over the micro-batches.

        Returns ``(grads, metrics, next_rng)``: ``grads`` float32-accumulated then cast to the
        param dtypes; ``metrics`` the finalized loss metrics plus the term metrics and ``loss``;
        ``next_rng`` the state's next RNG key data.
        """
        cfg = self.config
        key, step_key = jax.random.split(jax.random.wrap_key_data(state.rng))
        # One key per row of the step, laid out like the rows: a loss's per-row random choices do
        # not depend on the micro-batch count, the process count or the mesh.
        row_keys = jax.random.key_data(jax.random.split(step_key, cfg.batch_size))
        keys = row_keys[self._order]
        micro, keys = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(
            x, NamedSharding(self.mesh, P(None, BATCH_AXES))), (micro, keys))

        def counts_of(mb, k):
            terms = self._loss(state.params, mb, k, state, rest, teacher).terms
            return {name: jnp.asarray(t.count, jnp.float32) for name, t in terms.items()}

        if cfg.num_microbatches == 1:
            counts = None  # each term's own count is the batch's
        else:
            # Only the counts are used: XLA drops the model passes of this scan.
            zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(counts_of, *_first((micro, keys))))
            counts, _ = jax.lax.scan(lambda c, xs: (_add(c, counts_of(*xs)), None), zeros,
                                     (micro, keys))

        def micro_objective(params, mb, k):
            loss = self._loss(params, mb, k, state, rest, teacher, counts)
            # a loss told the counts may form its objective itself (inside the LM head)
            value = objective(loss.terms, counts) if loss.objective is None else loss.objective
            sums = {name: jnp.asarray(t.sum, jnp.float32) for name, t in loss.terms.items()}
            own = {name: jnp.asarray(t.count, jnp.float32) for name, t in loss.terms.items()}
            weights = {name: jnp.asarray(t.weight, jnp.float32) for name, t in loss.terms.items()}
            return value, (jax.lax.stop_gradient(sums), own, weights, loss.metrics)

        grad_fn = jax.value_and_grad(micro_objective, has_aux=True)

        def micro_step(mb, k):
            (value, aux), grads = grad_fn(state.params, mb, k)
            return jax.tree.map(lambda g: g.astype(jnp.float32), grads), value, aux

        if cfg.num_microbatches == 1:
            # No accumulator: a float32 copy of every gradient would be live for nothing.
            grads, value, (sums, counts, weights, metrics) = micro_step(*_first((micro, keys)))
        else:
            def body(carry, xs):
                grads, value, (sums, own, weights, metrics) = micro_step(*xs)
                return _add(carry, (grads, value, sums, metrics)), weights

            first = _first((micro, keys))
            grads0, value0, (sums0, _, _, metrics0) = jax.eval_shape(micro_step, *first)
            zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32),
                                 (grads0, value0, sums0, metrics0))
            (grads, value, sums, metrics), weights = jax.lax.scan(body, zeros, (micro, keys))
            weights = _first(weights)  # the same in every micro-batch (a term's contract)

        grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
        out = {name: s / jnp.maximum(c, 1.0) for name, (s, c) in metrics.items()}
        terms = {name: _Pair(sums[name], counts[name], weights[name]) for name in sums}
        out.update(term_metrics(terms))
        out["loss"] = value
        return grads, out, jax.random.key_data(key)

    def _apply(self, state: TrainState, grads, metrics: dict, rng):
        cfg = self.config
        out = dict(metrics)
        grad_norm = optax.global_norm(grads)
        # A non-finite loss or gradient is not applied: params, optimizer and reference stay as
        # they were (the step counter and the RNG still advance), and ``nonfinite`` says so.
        finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
        updates, opt_state = self._optimizer.update(grads, state.opt_state, state.params)
        params = keep(optax.apply_updates(state.params, updates), state.params)
        opt_state = keep(opt_state, state.opt_state)
        out["grad_norm"] = grad_norm
        out["nonfinite"] = 1.0 - finite.astype(jnp.float32)
        if self._max_norm is not None:
            out["grad_clipped"] = (grad_norm > self._max_norm).astype(jnp.float32)
        if self._schedule is not None:
            out["learning_rate"] = jnp.asarray(self._schedule(state.step), jnp.float32)

        reference = state.reference
        if reference is not None and cfg.reference == "ema":
            d = cfg.ema_decay
            reference = keep(jax.tree.map(lambda r, p: (d * r + (1.0 - d) * p).astype(r.dtype),
                                          reference, params), reference)
        new = TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                         rng=rng, reference=reference, method_state=state.method_state)
        return new, out

    def check_batch(self, batch) -> None:
        """Raise (before any compile) unless every leaf has this process's share of
        ``config.batch_size`` rows."""
        rows = self.config.batch_size // jax.process_count()
        for path, x in jax.tree_util.tree_flatten_with_path(batch)[0]:
            if (np.shape(x)[0] if np.ndim(x) else None) != rows:
                raise ValueError(f"batch leaf {jax.tree_util.keystr(path)} has shape "
                                 f"{np.shape(x)}; expected this process's {rows} of "
                                 f"step.batch_size={self.config.batch_size} rows on its leading "
                                 f"axis")

    def place(self, batch):
        """This process's rows -> the step's ``[M, B/M, ...]`` global arrays
        (:func:`shard_batch`); with ``packing``, each context first packed into one chunk per
        micro-batch and local batch shard (a packed leaf becomes ``[M, shards, R, L]``, the
        shard axis split like the rows)."""
        return self._place(batch)[0]

    def _place(self, batch) -> tuple[dict, dict]:
        """``(placed batch, host metrics)``: with ``packing``, ``packed_fraction`` (this
        process's real policy tokens over its packed positions) and ``shared_tokens_saved``."""
        self.check_batch(batch)
        extra = {}
        if self.config.packing:
            real = batch["attention_mask"]
            real = None if isinstance(real, jax.ShapeDtypeStruct) else int(np.sum(
                np.asarray(real) > 0))
            shards = int(np.prod([self.mesh.shape.get(a, 1) for a in BATCH_AXES]))
            batch = pack_batch(batch, chunks=self.config.num_microbatches
                               * max(shards // jax.process_count(), 1),
                               row_multiple=self.config.pack_row_multiple)
            if not isinstance(batch["packed_segments"], jax.ShapeDtypeStruct):
                if jax.process_count() > 1:   # every process must feed arrays of one shape
                    local = packed_rows(batch)
                    most = multihost.allgather(np.array(list(local.values()))).max(axis=0)
                    batch = with_packed_rows(batch, dict(zip(local, map(int, most))))
                extra["packed_fraction"] = packed_fraction(batch)
                extra["shared_tokens_saved"] = shared_tokens_saved(real, batch)
        return shard_batch(batch, self.mesh, num_microbatches=self.config.num_microbatches), extra

    def __call__(self, state: TrainState, batch) -> tuple[TrainState, dict]:
        placed, extra = self._place(batch)
        grads, metrics, rng = self._jitted_grads(state, self._model_def.rest, placed,
                                                 self._teacher_params)
        state, metrics = self._jitted_apply(state, grads, metrics, rng)
        return state, {**metrics, **extra}

    def grads(self, state: TrainState, batch) -> tuple:
        """``(grads, metrics)`` of the step's loss at ``state`` without updating (not donated):
        the exact full-batch gradient the optimizer would see, before clipping."""
        grads, metrics, _ = self._jitted_grads(state, self._model_def.rest, self.place(batch),
                                               self._teacher_params)
        return grads, metrics

    def lower(self, state: TrainState, batch):
        """``jax.jit(...).lower`` of the gradient pass (the step's memory peak), e.g. for
        ``.compile().memory_analysis()``. ``state`` and ``batch`` may be abstract
        (``jax.ShapeDtypeStruct`` leaves: a dry run, :mod:`hindsight.train.dry_run`)."""
        return self._jitted_grads.lower(state, self._model_def.rest, self.place(batch),
                                        self._teacher_params)

    def lower_update(self, state: TrainState, grads, metrics: dict, rng):
        """``jax.jit(...).lower`` of the update program (optimizer, EMA; donates ``state``) on
        the gradient pass's outputs ``(grads, metrics, rng)``, concrete or abstract (e.g.
        ``self.lower(state, batch).out_info``)."""
        return self._jitted_apply.lower(state, grads, metrics, rng)


def _put(tree, shardings):
    """``jax.device_put`` of ``tree``; an abstract leaf (``jax.ShapeDtypeStruct``, a dry run)
    gets its sharding attached instead."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
                        if isinstance(x, jax.ShapeDtypeStruct) else jax.device_put(x, s),
                        tree, shardings)


@dataclasses.dataclass(frozen=True)
class _Pair:
    """A term's batch totals, for :func:`hindsight.objectives.term_metrics`."""
    sum: jax.Array
    count: jax.Array
    weight: jax.Array


def make_train_step(loss_fn: LossFn, *, model_def: ModelDef,
                    optimizer: optax.GradientTransformation, mesh: Mesh, shardings: TrainState,
                    config: StepConfig,
                    schedule: optax.Schedule | None = None, max_grad_norm: float | None = None,
                    loss_kwargs: dict | None = None, head=None,
                    external_teacher: nnx.Module | None = None) -> TrainStep:
    """Build the sharded train step (validates ``config`` against ``mesh`` before compiling).

    Args:
      loss_fn: ``loss_fn(model, batch, **kwargs) -> Loss``; ``batch`` is one micro-batch (leaves
        ``[B/M, ...]``).
      model_def: the static model half from :func:`hindsight.train.state.create_train_state`.
      optimizer: optax transformation (clipping included, see :mod:`hindsight.train.optim`).
      mesh, shardings: the mesh and the TrainState of ``NamedSharding`` for in/out shardings.
      config: batch size, micro-batches, coupled group size, reference policy.
      schedule, max_grad_norm: only to report ``learning_rate`` and ``grad_clipped``.
      loss_kwargs: static keyword arguments for ``loss_fn`` (hyperparameters).
      head: the :class:`~hindsight.methods.LMHead` passed to ``loss_fn`` as ``head`` (None: the
        loss's default).
      external_teacher: a frozen model passed to ``loss_fn`` as ``external_teacher`` (methods
        with ``teacher="external"``); its params are an input of the compiled step.
    """
    return TrainStep(loss_fn, model_def=model_def, optimizer=optimizer, mesh=mesh,
                     shardings=shardings, config=config, schedule=schedule,
                     max_grad_norm=max_grad_norm, loss_kwargs=loss_kwargs, head=head,
                     external_teacher=external_teacher)
