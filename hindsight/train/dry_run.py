"""Will a config fit its mesh? Per-device bytes of a run, from shapes alone.

    python -m experiments.run --config=configs/grpo.py --config.model.name=qwen3-8b \\
        --config.train.mesh.data=1 --config.train.mesh.fsdp=8 --dry_run

:func:`dry_run` resolves the config, builds the mesh and the model's abstract parameters
(:func:`hindsight.models.abstract_model`: ``nnx.eval_shape``, no weights read, so the config-only
entries ``qwen3-8b`` / ``llama-3.1-8b`` work offline), the abstract train state
(:func:`~hindsight.train.state.abstract_train_state`) and its shardings, then lowers and compiles
both programs of the train step (:class:`~hindsight.train.step.TrainStep`: the gradient pass and
the update) on abstract inputs of one optimizer update's shape. Nothing is allocated.

Per-device bytes are those of device 0's shard of every array (``sharding.shard_shape``), so an
array a rule leaves replicated (the RMSNorm scales) counts whole on every device:

* ``params`` / ``optimizer`` / ``reference`` / ``teacher``: the train state's arrays (and an
  external teacher's, sharded by the same rules); ``grad``: one gradient per parameter, in the
  parameter's dtype and sharding (the gradient pass's output);
* ``temp``: the larger of the two compiled programs' temporaries (``memory_analysis()``), i.e.
  activations, the float32 gradient accumulator of several micro-batches, gathered FSDP shards
  (on CPU devices compiled without the bfloat16 float normalization, which accelerators do not
  need: :data:`CPU_COMPILER_OPTIONS`);
* ``kv_cache``: the sampler's slot batch, ``[L, slots, max_len, KV, hd]`` for K and V in the
  compute dtype, rows over ``("data", "fsdp")`` and KV heads over ``tensor``
  (:data:`KV_CACHE_SPEC`); ``slots`` and ``max_len`` as the rollout sizes its engine
  (``rollout.slots`` or ``min(rows, 64)`` rounded to a power of two; the prompt bucket plus the
  response rounded to 64);
* ``sampler_weights``: the decode engine's per-layer copy of the stacked layer weights
  (:func:`hindsight.sampling.decode.graph_and_weights` unrolls a scanned model; 0 without
  ``model.scan_layers``);
* ``peak``: ``state + max(grad + temp, sampler_weights + kv_cache)``: training and sampling do
  not overlap; decode temporaries and the runtime's own buffers are not included.

Input widths: the response is ``rollout.max_new_tokens`` (``rollout.episode_tokens`` for an
episode task); every context's prompt is taken as ``prompt_tokens`` long (HDL's hindsight context
adds its feedback and reflection caps); widths are bucketed as the rollout buckets them
(:func:`hindsight.sampling.buckets.cache_len_bucket`). The vocabulary mask is left out (it needs
the tokenizer and holds one ``[V]`` bool).
"""
from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from hindsight.batch import context_key
from hindsight.methods import LMHead
from hindsight.models import Decoder, abstract_model
from hindsight.models.partition import is_stacked
from hindsight.sampling.buckets import cache_len_bucket, pow2_bucket
from hindsight.tasks import EpisodeTask, get_task
from hindsight.train.experiment import Experiment, resolve
from hindsight.train.mesh import BATCH_AXES, make_mesh, model_rules, param_shardings, path_str
from hindsight.train.optim import make_optimizer
from hindsight.train.state import abstract_train_state, split_model, state_shardings, with_shardings
from hindsight.train.step import TrainStep

TINY_MODEL = "tiny-random"
DEFAULT_PROMPT_TOKENS = 256
# [L, rows, positions, KV heads, head dim]: rows over the batch axes, KV heads with the attention
# heads' tensor-parallel shards (the q/k/v kernels split their output columns over `tensor`).
KV_CACHE_SPEC = P(None, BATCH_AXES, None, "tensor", None)
KEYS = ("params", "optimizer", "grad", "reference", "teacher", "temp", "kv_cache",
        "sampler_weights")


def bytes_per_device(tree, shardings) -> int:
    """Bytes device 0 holds of ``tree`` (arrays or ``jax.ShapeDtypeStruct``) laid out by
    ``shardings`` (a matching tree of ``jax.sharding.Sharding``): the sum over leaves of
    ``prod(sharding.shard_shape(shape)) * itemsize``."""
    leaves, shards = jax.tree.leaves(tree), jax.tree.leaves(shardings)
    if len(leaves) != len(shards):
        raise ValueError(f"{len(leaves)} arrays but {len(shards)} shardings")
    return sum(int(np.prod(s.shard_shape(tuple(x.shape)))) * jnp.dtype(x.dtype).itemsize
               for x, s in zip(leaves, shards))


def _abstract_policy(section):
    """The abstract decoder of a model section (``model`` or ``teacher.model``; a teacher section
    has no ``param_dtype`` nor ``remat``: float32, no remat, as the loop loads it)."""
    dtype = jnp.dtype(section.dtype)
    param_dtype = jnp.dtype(getattr(section, "param_dtype", "float32"))
    if section.name == TINY_MODEL:  # what the launcher's tiny-random loads: layers unrolled
        from hindsight.testing.models import CHAR_VOCAB, TINY
        cfg = dataclasses.replace(TINY, vocab_size=CHAR_VOCAB)
        return nnx.eval_shape(lambda: Decoder(cfg, dtype=dtype, param_dtype=param_dtype,
                                              scan_layers=False, rngs=nnx.Rngs(0)))
    return abstract_model(section.name, dtype=dtype, param_dtype=param_dtype,
                          scan_layers=section.scan_layers, remat=getattr(section, "remat", False),
                          attention=getattr(section, "attention", "auto"))


def _sharded(model, mesh):
    """``(model, params, shardings)``: the abstract ``model`` with its params' shardings attached
    (as the loaders place a model on a mesh by the partition rules)."""
    _, params = split_model(model)
    shardings = param_shardings(params, mesh, model_rules(mesh))
    nnx.update(model, with_shardings(params, shardings))
    return model, params, shardings


def response_width(xp: Experiment) -> int:
    """``T``: the response width of the run's batches."""
    r = xp.config.rollout
    task = get_task(xp.config.task.name, **xp.config.task.options)
    return r.episode_tokens if isinstance(task, EpisodeTask) else r.max_new_tokens


def context_widths(xp: Experiment, *, prompt_tokens: int, response: int) -> dict:
    """``{context: L}``: the bucketed width of the policy context (key None) and of each extra
    context the method reads."""
    r = xp.config.rollout
    extra = {"hindsight": r.feedback_max_tokens + r.hindsight_reflection_tokens}
    return {c: cache_len_bucket(prompt_tokens + extra.get(c, 0), response)
            for c in (None, *xp.method.contexts)}


def abstract_batch(xp: Experiment, *, rows: int, response: int, widths: dict) -> dict:
    """``jax.ShapeDtypeStruct`` leaves of ``rows`` rows of the method's batch
    (:mod:`hindsight.batch`): each context's ``[rows, L]`` arrays and ``[rows, T]`` target
    indices, the ``[rows, T]`` response arrays and the fields the method reads."""
    i32, f32 = jnp.int32, jnp.float32
    s = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype)
    batch = {"targets": s((rows, response), i32), "mask": s((rows, response), f32)}
    for ctx, width in widths.items():
        for key in ("tokens", "positions", "attention_mask"):
            batch[context_key(ctx, key)] = s((rows, width), i32)
        batch[context_key(ctx, "target_index")] = s((rows, response), i32)
    fields = {"logp_old": (rows, response), "advantages": (rows,), "rewards": (rows,)}
    batch.update({name: s(fields[name], f32) for name in xp.method.fields})
    return batch


def kv_cache(model, mesh, *, slots: int, max_len: int):
    """``(abstract cache, shardings)`` of the sampler's slot batch (:data:`KV_CACHE_SPEC`,
    axes that do not divide a dimension dropped)."""
    cache = jax.eval_shape(lambda: model.init_cache(slots, max_len))
    return cache, param_shardings(cache, mesh, lambda path, shape: KV_CACHE_SPEC)


# The CPU backend has no bfloat16 dots: its float normalization converts their operands to float32,
# and loop-invariant code motion then hoists the converts of every layer's weights out of the
# layer scan: a float32 copy of the params (+4 bytes per parameter per device in the gradient
# pass, measured) that accelerators with native bfloat16 (GPU, TPU) never make. A dry run on CPU
# devices stands in for an accelerator and runs nothing, so its compiles leave that pass out.
CPU_COMPILER_OPTIONS = {"xla_disable_hlo_passes": "float-normalization-bf16"}


def _temp_bytes(lowered, mesh) -> int:
    """The compiled program's temporaries per device (``memory_analysis().temp_size_in_bytes``)."""
    cpu = mesh.devices.flat[0].platform == "cpu"
    compiled = lowered.compile(compiler_options=CPU_COMPILER_OPTIONS if cpu else None)
    return int(compiled.memory_analysis().temp_size_in_bytes)


def dry_run(config, *, prompt_tokens: int = DEFAULT_PROMPT_TOKENS) -> dict:
    """Per-device memory of ``config`` on this process's devices (see the module doc).

    Args:
      config: an experiment config (ConfigDict or nested dicts), resolved as a run resolves it.
      prompt_tokens: the longest prompt of every context, for the batch and KV-cache widths.
    Returns:
      A JSON-able dict: ``model``, ``devices``, ``mesh``, the dtypes, the shapes used, one
      ``<name>_bytes_per_device`` per entry of :data:`KEYS`, ``state_bytes_per_device``,
      ``peak_bytes_per_device``, ``param_count`` and ``compile_seconds``.
    Raises:
      :class:`~hindsight.train.experiment.ConfigError` for a bad config (before anything is
      compiled).
    """
    if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) or prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be a positive int, got {prompt_tokens!r}")
    # model.dtype='auto' as on an accelerator (float32): the dry run sizes a run on one
    xp = resolve(config, backend="accelerator")
    exp, method, t = xp.config, xp.method, xp.config.train
    mesh = make_mesh(t.mesh)
    model, params, p_sh = _sharded(_abstract_policy(exp.model), mesh)
    model_def, _ = split_model(model)
    tx = make_optimizer(t.optim, param_dtype=exp.model.param_dtype)
    method_state = method.init_state(method.config) if method.init_state is not None else None
    abstract = abstract_train_state(params, tx, reference=xp.reference,
                                    reference_dtype=t.reference_dtype, method_state=method_state)
    shardings = state_shardings(abstract, mesh, model_rules(mesh))
    state = with_shardings(abstract, shardings)
    teacher, teacher_bytes = None, 0
    if exp.teacher.model.name is not None:
        teacher, t_params, t_sh = _sharded(_abstract_policy(exp.teacher.model), mesh)
        teacher_bytes = bytes_per_device(t_params, t_sh)

    step = TrainStep(method.loss_fn, model_def=model_def, optimizer=tx, mesh=mesh,
                     shardings=shardings, config=xp.step_config(),
                     loss_kwargs={"config": method.config}, external_teacher=teacher,
                     head=LMHead(backend=t.lm_head, chunk_size=t.lm_head_chunk_size))
    response = response_width(xp)
    widths = context_widths(xp, prompt_tokens=prompt_tokens, response=response)
    rows = xp.rows_per_update // jax.process_count()
    start = time.perf_counter()
    grads_lowered = step.lower(state, abstract_batch(xp, rows=rows, response=response,
                                                      widths=widths))
    grad_temp = _temp_bytes(grads_lowered, mesh)
    update_temp = _temp_bytes(step.lower_update(state, *grads_lowered.out_info), mesh)
    compile_seconds = time.perf_counter() - start

    slots = pow2_bucket(exp.rollout.slots or min(xp.rows, 64))
    max_len = cache_len_bucket(prompt_tokens, response)
    cache, cache_sh = kv_cache(model, mesh, slots=slots, max_len=max_len)
    stacked = [(x, s) for (path, x), s in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                                               jax.tree.leaves(p_sh))
               if is_stacked(path_str(path))]
    sizes = {
        "params": bytes_per_device(abstract.params, shardings.params),
        "optimizer": bytes_per_device(abstract.opt_state, shardings.opt_state),
        "grad": bytes_per_device(abstract.params, shardings.params),
        "reference": (0 if abstract.reference is None else
                      bytes_per_device(abstract.reference, shardings.reference)),
        "teacher": teacher_bytes,
        "temp": max(grad_temp, update_temp),
        "kv_cache": bytes_per_device(cache, cache_sh),
        "sampler_weights": bytes_per_device([x for x, _ in stacked], [s for _, s in stacked]),
    }
    state_bytes = sizes["params"] + sizes["optimizer"] + sizes["reference"] + sizes["teacher"]
    peak = state_bytes + max(sizes["grad"] + sizes["temp"],
                             sizes["sampler_weights"] + sizes["kv_cache"])
    return {
        "model": exp.model.name, "method": exp.method, "devices": int(mesh.devices.size),
        "mesh": {a: int(n) for a, n in mesh.shape.items()},
        "param_dtype": exp.model.param_dtype, "dtype": exp.model.dtype,
        "mu_dtype": t.optim.mu_dtype, "optimizer": t.optim.name,
        "master_weights": bool(exp.model.param_dtype != "float32" and t.optim.master_weights),
        "reference": xp.reference, "reference_dtype": t.reference_dtype if xp.reference else None,
        "param_count": int(sum(np.prod(x.shape) for x in jax.tree.leaves(abstract.params))),
        "rows_per_update": xp.rows_per_update, "num_microbatches": t.num_microbatches,
        "response_tokens": response, "prompt_tokens": prompt_tokens,
        "context_tokens": {"policy" if c is None else c: w for c, w in widths.items()},
        "kv_cache": {"slots": slots, "max_len": max_len, "dtype": exp.model.dtype},
        **{f"{k}_bytes_per_device": v for k, v in sizes.items()},
        "grad_pass_temp_bytes_per_device": grad_temp,
        "update_temp_bytes_per_device": update_temp,
        "state_bytes_per_device": state_bytes, "peak_bytes_per_device": peak,
        "compile_seconds": round(compile_seconds, 1),
    }


def format_table(report: dict) -> str:
    """The report as a readable table (GiB per device), the assumptions underneath."""
    row = lambda name, n: f"  {name:<18}{n:>18,}{n / 2**30:>10.3f}"
    mesh = " x ".join(f"{a}={n}" for a, n in report["mesh"].items())
    lines = [f"dry run: {report['model']} ({report['param_count']:,} params), {report['method']}, "
             f"{report['devices']} devices, mesh {mesh}",
             f"  params {report['param_dtype']}, activations {report['dtype']}, "
             f"{report['optimizer']} mu {report['mu_dtype']}, master weights "
             f"{report['master_weights']}, reference {report['reference']} "
             f"({report['reference_dtype']})",
             f"  {report['rows_per_update']} rows per update in {report['num_microbatches']} "
             f"micro-batch(es), response {report['response_tokens']} tokens, contexts "
             f"{report['context_tokens']}; sampler {report['kv_cache']['slots']} slots x "
             f"{report['kv_cache']['max_len']} positions",
             f"  {'per device':<18}{'bytes':>18}{'GiB':>10}"]
    lines += [row(key, report[f"{key}_bytes_per_device"]) for key in KEYS + ("state", "peak")]
    lines.append("  (peak = params + optimizer + reference + teacher + max(grad + temp, "
                 "sampler_weights + kv_cache))")
    return "\n".join(lines)
