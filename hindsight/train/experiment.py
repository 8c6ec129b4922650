"""An experiment's configuration: the one schema the launcher reads from ``configs/<method>.py``.

A config file's ``get_config()`` returns a nested ``ml_collections.ConfigDict`` (or plain dicts);
:func:`resolve` turns it, once, into an :class:`Experiment`: the frozen :class:`ExperimentConfig`
(typed sections, every unknown key rejected by its dotted name, every value validated) and the
method configured for it (:meth:`hindsight.methods.Method.configure`), before anything is loaded
or compiled::

    method            registry name ("grpo", "hdl", ...)
    method_config     the method's options (its config dataclass; spec defaults). Options that
                      follow another key (the loss temperature, CRAFT's group size, DAPO's
                      overlong window, Dr.GRPO's normaliser) are None in the config files and
                      derived from the rollout section after the command line is applied; the
                      resolved values are what ``config.json`` shows
    model.*           embedded model name (or a config-only entry, for ``--dry_run``) or path,
                      activation and parameter dtypes, layer scan, remat
    teacher.model.*   an external teacher beside the policy (methods with teacher="external")
    task.*            task registry name and its constructor options
    rollout.*         prompts per step, group size, sampling parameters, engine slots
    train.*           rollouts, PPO epochs and mini-batches, micro-batches, LM-head backend,
                      reference copy and its dtype, optimizer (moment dtype, master weights),
                      mesh, checkpoints
    eval.*            held-out reward: how often, how many examples, temperature
    distributed.*     joining a multi-process run (``jax.distributed``): ``auto`` detection on
                      TPU pods, SLURM, Open MPI and Kubernetes, or an explicit coordinator
                      address, process count and process id; read by the launcher before
                      anything touches the JAX backend (:func:`initialize_from_config`)
    seed              every random draw of the run derives from it

The sections are small frozen dataclasses; their fields and defaults are the documentation.
"""
from __future__ import annotations

import dataclasses
import json
import math
import typing
from collections.abc import Mapping

from hindsight._validation import check_choice
from hindsight.models.attention import ATTENTION_CHOICES
from hindsight.ops import LM_HEAD_BACKENDS, LM_HEAD_DEFAULT
from hindsight.train.mesh import DistributedConfig, MeshConfig, initialize_distributed
from hindsight.train.optim import OptimConfig
from hindsight.train.step import StepConfig

DTYPES = ("float32", "bfloat16")
REFERENCE_CHOICES = ("auto", "none", "frozen", "ema")


class ConfigError(ValueError):
    """A bad experiment config or run directory: raised before anything is loaded or compiled."""


class NonFiniteError(RuntimeError):
    """Training produced a non-finite loss or gradient ``train.max_nonfinite_updates`` times; the
    updates were not applied and no checkpoint was written after them."""


def _positive_int(where: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{where} must be a positive int, got {v!r}")


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """``name``: a registry name (``hindsight.models.load``), an HF folder, a ``.gguf`` path, or
    ``"tiny-random"`` (a 2-layer random decoder over a 128-id character tokenizer, for tests).
    ``dtype``: compute dtype (matmul operands; accumulation is float32 either way): ``"auto"``
    (the default) resolves to ``"bfloat16"`` on a CPU with bf16 matmul instructions (AMX,
    AVX-512 BF16) and ``"float32"`` elsewhere
    (:func:`hindsight.models.precision.auto_compute_dtype`), and ``config.json`` records the
    result. ``param_dtype``: storage dtype of the parameters (and of their
    gradients): ``"bfloat16"`` halves them, and the optimizer then keeps a float32 master copy
    (``train.optim.master_weights``) so updates are applied in float32. ``remat``: rematerialise
    each layer in the backward pass (the train step's activation memory drops to one layer's).
    ``init_from``: a run directory whose latest checkpoint's params start this run (the previous
    stage of a multi-stage experiment, :mod:`hindsight.train.stages`; its ``model.name`` must be
    this one's); a run that has checkpoints of its own resumes from them instead. ``attention``:
    the attention implementation (:data:`hindsight.models.attention.ATTENTION`: ``xla``,
    ``chunked``, ``cudnn``; ``auto`` picks ``cudnn`` on a GPU computing in bf16 / fp16 and
    ``chunked`` elsewhere). The
    config-only entries ``qwen3-8b`` and ``llama-3.1-8b`` (no weights) serve ``--dry_run``
    (:mod:`hindsight.train.dry_run`) and are refused by a run."""
    name: str = "smollm2-135m-instruct"
    dtype: str = "auto"
    param_dtype: str = "float32"
    scan_layers: bool = True
    remat: bool = True
    attention: str = "auto"
    init_from: str | None = None

    def __post_init__(self):
        check_choice("model.dtype", self.dtype, ("auto", *DTYPES))
        check_choice("model.param_dtype", self.param_dtype, DTYPES)
        check_choice("model.attention", self.attention, ATTENTION_CHOICES)


@dataclasses.dataclass(frozen=True)
class TeacherModelSection:
    """An external teacher (``teacher.model``): ``name`` as :class:`ModelSection`'s (None: no
    external teacher; ``"tiny-random"`` is a second random tiny decoder, another seed than the
    policy's, for tests), ``dtype`` its activation dtype. It is loaded beside the policy, sharded
    by the same rules, frozen, and read by methods whose ``method_config.teacher`` is
    ``"external"``; its tokenizer must give the policy's ids (checked before anything compiles)."""
    name: str | None = None
    dtype: str = "float32"
    scan_layers: bool = True

    def __post_init__(self):
        check_choice("teacher.model.dtype", self.dtype, DTYPES)


@dataclasses.dataclass(frozen=True)
class TeacherSection:
    model: TeacherModelSection = TeacherModelSection()


@dataclasses.dataclass(frozen=True)
class TaskSection:
    """``name``: a :func:`hindsight.tasks.get_task` name; ``options``: its keyword arguments."""
    name: str = "reverse"
    options: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RolloutSection:
    """What one training step samples.

    ``prompts_per_step``: ``P`` groups per step; ``group_size``: ``G`` rows per prompt (HDL: its
    tree size, ``num_roots * (1 + sum(counts))``, is used and this must equal it or be None).
    ``max_new_tokens`` is the response width ``T``; ``temperature`` must equal the method's loss
    temperature (checked). ``slots``: engine slot batch (None: ``min(rows, 64)``).
    ``reflection_max_tokens`` / ``hindsight_reflection_tokens``: HDL's reflection caps;
    ``feedback_max_tokens``: the verifier feedback is cut to this many tokens in HDL's reflection
    turn and hindsight context (:class:`hindsight.rollout.TreeOptions`) and in the turn asking
    for a generated context part; ``generated_max_tokens``: the cap on each such part the policy
    writes during the rollout (SEED's skills, :mod:`hindsight.rollout.generated`). ``verify_workers``:
    threads checking responses while the engine keeps decoding (0: inline;
    :mod:`hindsight.rollout.verification`). Episode tasks (:mod:`hindsight.tasks.episodic`):
    ``max_new_tokens`` caps one turn, ``episode_tokens`` the whole episode after the first prompt
    (the batch's ``T``), ``max_turns`` the actions; ``env_step_timeout`` / ``env_reset_timeout``:
    seconds before a hung environment's worker is killed (:class:`hindsight.envs.EnvPool`).
    """
    prompts_per_step: int = 2
    group_size: int | None = 16
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    slots: int | None = None
    chunk_steps: int = 16
    reflection_max_tokens: int = 256
    hindsight_reflection_tokens: int = 256
    feedback_max_tokens: int = 16
    generated_max_tokens: int = 48
    verify_workers: int = 4
    max_turns: int = 8
    episode_tokens: int = 1024
    env_step_timeout: float = 60.0
    env_reset_timeout: float = 300.0

    def __post_init__(self):
        for name in ("prompts_per_step", "max_new_tokens", "chunk_steps",
                     "reflection_max_tokens", "hindsight_reflection_tokens",
                     "feedback_max_tokens", "generated_max_tokens", "max_turns",
                     "episode_tokens"):
            _positive_int(f"rollout.{name}", getattr(self, name))
        for name in ("group_size", "slots"):
            if getattr(self, name) is not None:
                _positive_int(f"rollout.{name}", getattr(self, name))
        if isinstance(self.verify_workers, bool) or not isinstance(self.verify_workers, int) \
                or self.verify_workers < 0:
            raise ValueError(f"rollout.verify_workers must be a non-negative int, got "
                             f"{self.verify_workers!r}")
        for name in ("env_step_timeout", "env_reset_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"rollout.{name} must be a positive number of seconds, got {value!r}")


@dataclasses.dataclass(frozen=True)
class TrainSection:
    """How each rollout is trained on.

    ``num_steps``: rollouts (training steps). Each rollout is split into ``ppo_minibatches``
    mini-batches of whole groups, and ``ppo_epochs`` passes over them make ``ppo_epochs *
    ppo_minibatches`` optimizer updates, ``logp_old`` fixed at rollout time (verl's
    ``ppo_epochs`` / ``ppo_mini_batch_size``, TRL's ``num_iterations``); mini-batches are visited
    in the same order every epoch. ``num_microbatches``: gradient accumulation inside one update.
    ``lm_head``: the training path's LM-head backend (``scan``, ``fused`` (default) or ``dense``,
    :class:`~hindsight.methods.LMHead`), ``lm_head_chunk_size`` its rows per block (None: the
    backend's default). ``packing`` (default on): the model runs over packed rows (each context's
    sequences end to end, :mod:`hindsight.packing`) instead of right-padded ones; losses and
    gradients are the same (``experiments.bench.packing``: 0.64x the padded step's time on a
    GRPO length mix); ``pack_row_multiple`` (default 1): packed rows of that many times the
    batch's width ``S``, so that sequences longer than ``S / 2`` can share a row (at 1 each gets
    a row of its own: the demo's rows packed to 0.61 real tokens). ``reference``: ``"auto"`` keeps a frozen copy of the initial params when
    the method's config needs one and none otherwise; ``"none"``, ``"frozen"``, ``"ema"`` (decay
    ``ema_decay``, applied after every optimizer update) force it. ``reference_dtype``: the
    reference copy's storage dtype (None: the params' ``model.param_dtype``, float32 for an EMA;
    ``"bfloat16"`` halves a frozen reference, which only runs forward passes; an EMA is refused
    in bfloat16, where its ``1 - ema_decay`` steps round away). ``optim`` (its schedule counts
    optimizer updates) and ``mesh`` are :class:`~hindsight.train.OptimConfig` and
    :class:`~hindsight.train.MeshConfig`. Checkpoints every ``save_every`` rollouts (and at the
    end, and on Ctrl-C), the newest ``max_to_keep`` kept. An optimizer update whose loss or
    gradient is not finite is not applied; after ``max_nonfinite_updates`` such updates the run
    stops (:class:`NonFiniteError`) without writing a checkpoint, so the last good one is intact."""
    num_steps: int = 10
    ppo_epochs: int = 1
    ppo_minibatches: int = 1
    num_microbatches: int = 1
    lm_head: str = LM_HEAD_DEFAULT
    lm_head_chunk_size: int | None = None
    packing: bool = True
    pack_row_multiple: int = 1
    reference: str = "auto"
    reference_dtype: str | None = None
    ema_decay: float = 0.99
    optim: OptimConfig = OptimConfig()
    mesh: MeshConfig = MeshConfig()
    save_every: int = 10
    max_to_keep: int = 2
    max_nonfinite_updates: int = 1

    def __post_init__(self):
        for name in ("num_steps", "ppo_epochs", "ppo_minibatches", "num_microbatches",
                     "pack_row_multiple", "save_every", "max_to_keep", "max_nonfinite_updates"):
            _positive_int(f"train.{name}", getattr(self, name))
        if self.lm_head_chunk_size is not None:
            _positive_int("train.lm_head_chunk_size", self.lm_head_chunk_size)
        check_choice("train.lm_head", self.lm_head, LM_HEAD_BACKENDS)
        if not isinstance(self.packing, bool):
            raise ValueError(f"train.packing must be true or false, got {self.packing!r}")
        if self.pack_row_multiple > 1 and not self.packing:
            raise ValueError(f"train.pack_row_multiple={self.pack_row_multiple} needs "
                             f"train.packing=True")
        check_choice("train.reference", self.reference, REFERENCE_CHOICES)
        if self.reference_dtype is not None:
            check_choice("train.reference_dtype", self.reference_dtype, DTYPES)
        if not 0.0 <= self.ema_decay <= 1.0:
            raise ValueError(f"train.ema_decay must be in [0, 1], got {self.ema_decay}")

    @property
    def updates_per_rollout(self) -> int:
        """Optimizer updates per rollout: ``ppo_epochs * ppo_minibatches``."""
        return self.ppo_epochs * self.ppo_minibatches


@dataclasses.dataclass(frozen=True)
class EvalSection:
    """Held-out reward: ``num_examples`` of the task's ``split`` split, one sample each at
    ``temperature`` (0 = greedy), before the first step and every ``every`` steps after it
    (0: only before the first and after the last step). ``at_start``: evaluate before the first
    step (False skips it, e.g. when another run from the same weights, seed and examples already
    has: ``make demo`` evaluates its shared start once). ``num_samples``: ``n`` samples per
    problem at the rollout's sampling parameters for pass@k in ``python -m experiments.evaluate``
    (0: greedy pass@1 only)."""
    every: int = 0
    num_examples: int = 16
    temperature: float = 0.0
    split: str = "test"
    num_samples: int = 0
    at_start: bool = True

    def __post_init__(self):
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 0:
            raise ValueError(f"eval.every must be an int >= 0, got {self.every!r}")
        if not isinstance(self.at_start, bool):
            raise ValueError(f"eval.at_start must be a bool, got {self.at_start!r}")
        if self.num_examples != 0:
            _positive_int("eval.num_examples", self.num_examples)
        if self.num_samples != 0:
            _positive_int("eval.num_samples", self.num_samples)


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    method: str = "grpo"
    method_config: dict = dataclasses.field(default_factory=dict)
    model: ModelSection = ModelSection()
    teacher: TeacherSection = TeacherSection()
    task: TaskSection = TaskSection()
    rollout: RolloutSection = RolloutSection()
    train: TrainSection = TrainSection()
    eval: EvalSection = EvalSection()
    distributed: DistributedConfig = DistributedConfig()
    seed: int = 0
    num_sample_texts: int = 4

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# Keys a resumed run may change: they do not alter the state, the data or the updates.
RESUMABLE_KEYS = ("train.num_steps", "train.save_every", "train.max_to_keep",
                  "train.max_nonfinite_updates", "eval.every", "eval.num_examples",
                  "num_sample_texts") + tuple(
    f"distributed.{f.name}" for f in dataclasses.fields(DistributedConfig))
"""A preempted run may come back on other hosts (another coordinator address, process ids):
the data order and the updates do not depend on them (DAPO's dynamic sampling excepted: each
process filters its own share of the stream)."""


def _plain(value):
    """ConfigDict / FrozenConfigDict / tuple -> plain dicts and lists (JSON-able)."""
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _check_finite(where: str, value) -> None:
    """Refuse inf / NaN anywhere in a config value (``learning_rate=inf`` passes ``> 0``)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number, got {value}")
    if isinstance(value, Mapping):
        for k, v in value.items():
            _check_finite(f"{where}.{k}", v)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_finite(f"{where}[{i}]", v)


def _build(cls, values: Mapping, prefix: str):
    """Construct dataclass ``cls`` from ``values``, recursing into dataclass-typed fields."""
    if not isinstance(values, Mapping):
        raise TypeError(f"config section {prefix.rstrip('.') or '<root>'!r} must be a dict, got "
                        f"{type(values).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"unknown config key(s) {[prefix + u for u in unknown]}; valid keys "
                         f"here: {[prefix + f for f in fields]}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in values.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, value, f"{prefix}{name}.")
        else:
            _check_finite(prefix + name, value)
            kwargs[name] = value
    return cls(**kwargs)


@dataclasses.dataclass(frozen=True)
class Experiment:
    """An experiment resolved once: what the loop hands to the rollout and the step.

    Attributes:
      config: the typed sections; ``method_config`` holds every option of the method with the
        derived ones filled in (this is ``config.json``).
      method: the configured :class:`~hindsight.methods.Method` (config, contexts, rollout shape,
        group size, state hooks).
      reference: the train state's reference copy: None, ``"frozen"`` or ``"ema"``.
    """
    config: ExperimentConfig
    method: typing.Any
    reference: str | None

    @property
    def rows(self) -> int:
        """Rows per rollout: ``prompts_per_step * group_size``."""
        return self.config.rollout.prompts_per_step * self.method.group_size

    @property
    def rows_per_update(self) -> int:
        """Rows per optimizer update: a rollout's rows over ``train.ppo_minibatches``."""
        return self.rows // self.config.train.ppo_minibatches

    def step_config(self) -> StepConfig:
        """The train step's layout: rows per update, micro-batches, the coupled group size,
        the reference copy and row packing."""
        t, m = self.config.train, self.method
        return StepConfig(batch_size=self.rows_per_update, num_microbatches=t.num_microbatches,
                          group_size=m.group_size if m.couples_rows else None,
                          reference=self.reference, ema_decay=t.ema_decay, packing=t.packing,
                          pack_row_multiple=t.pack_row_multiple)


def resolve(config, *, num_devices: int | None = None, process_count: int | None = None,
            backend: str | None = None) -> Experiment:
    """Validate a config (ConfigDict or nested dicts) and configure its method, once.

    Args:
      config: the experiment config.
      num_devices, process_count: the machine (default: JAX's global device and process counts),
        for the mesh and the row-layout checks.
      backend: the platform the run computes on, for ``model.dtype="auto"`` (default: JAX's
        default backend; the dry run, which sizes an accelerator run, passes ``"accelerator"``).
    Raises:
      ConfigError naming the dotted key for an unknown key or a bad value, an unknown method or
      task name (listing the registered ones), a method option its config does not have, a
      reference the method needs but the config removes, or a row layout that cannot keep groups
      whole (:func:`hindsight.train.check_layout`).
    """
    try:
        return _resolve(config, num_devices, process_count, backend)
    except ConfigError:
        raise
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(e.args[0] if e.args else str(e)) from e


def _resolve(config, num_devices, process_count, backend) -> Experiment:
    import jax

    from hindsight.methods import get_method
    from hindsight.models.precision import auto_compute_dtype
    from hindsight.tasks import task_names
    from hindsight.train.step import check_layout

    exp = _build(ExperimentConfig, _plain(config), "")
    try:
        method = get_method(exp.method).configure(exp.method_config, rollout=exp.rollout)
    except TypeError as e:
        raise TypeError(f"method_config: {e}") from None
    if exp.task.name not in task_names():
        raise KeyError(f"unknown task {exp.task.name!r} (task.name); registered tasks: "
                       f"{task_names()}")
    t = exp.train
    needs = method.config.needs_reference
    reference = {"auto": "frozen" if needs else None, "none": None}.get(t.reference, t.reference)
    if needs and reference is None:
        raise ValueError(f"method {exp.method!r} with this method_config needs a reference model; "
                         f"train.reference={t.reference!r} keeps none")
    external = getattr(method.config, "teacher", None) == "external"
    if external and exp.teacher.model.name is None:
        raise ValueError("method_config.teacher='external' needs an external teacher: set "
                         "teacher.model.name")
    if exp.teacher.model.name is not None and not external:
        raise ValueError(f"teacher.model.name={exp.teacher.model.name!r} is set but method "
                         f"{exp.method!r} does not read it (method_config.teacher="
                         f"{getattr(method.config, 'teacher', None)!r}; 'external' reads it)")
    if method.config.needs_frozen_reference and reference != "frozen":
        raise ValueError(f"method {exp.method!r} reads the reference as the frozen initial policy; "
                         f"train.reference={t.reference!r} would move it (use 'frozen' or 'auto')")
    if reference == "ema" and t.reference_dtype == "bfloat16":
        raise ValueError(f"train.reference_dtype='bfloat16' with an EMA reference (train.reference="
                         f"{t.reference!r}): each update moves it by 1 - train.ema_decay = "
                         f"{1 - t.ema_decay:.3g} of the difference, which rounds away in bfloat16; "
                         f"use 'float32' (or a frozen reference)")
    if exp.model.dtype == "auto":   # resolved, so config.json shows the dtype the run computes in
        exp = dataclasses.replace(exp, model=dataclasses.replace(
            exp.model, dtype=auto_compute_dtype(backend)))
    if t.reference_dtype is None:  # resolved, so config.json shows the dtype the run keeps
        t = dataclasses.replace(t, reference_dtype="float32" if reference == "ema"
                                else exp.model.param_dtype)
        exp = dataclasses.replace(exp, train=t)
    num_devices = jax.device_count() if num_devices is None else num_devices
    process_count = jax.process_count() if process_count is None else process_count
    mesh = t.mesh.resolve(num_devices)
    rows = exp.rollout.prompts_per_step * method.group_size
    check_layout(batch_size=rows, num_microbatches=t.num_microbatches,
                 group_size=method.group_size, ppo_minibatches=t.ppo_minibatches,
                 mesh_shape=mesh, process_count=process_count, couples_rows=method.couples_rows)
    o = t.optim
    if o.schedule != "constant" and o.total_steps < t.num_steps * t.updates_per_rollout:
        raise ValueError(f"train.optim.total_steps={o.total_steps} counts optimizer updates and is "
                         f"shorter than train.num_steps * ppo_epochs * ppo_minibatches = "
                         f"{t.num_steps * t.updates_per_rollout}")
    resolved = dataclasses.replace(exp, method_config=_plain(dataclasses.asdict(method.config)))
    return Experiment(config=resolved, method=method, reference=reference)


def flatten(d: Mapping, prefix: str = "") -> dict:
    """Nested dict -> ``{"a.b.c": value}``."""
    out = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and v and k != "options" and k != "method_config":
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_differences(saved: Mapping, current: Mapping) -> list[str]:
    """Dotted keys whose values differ between two resolved configs (``RESUMABLE_KEYS`` ignored),
    compared as JSON so tuples and lists are equal. A key the saved config lacks (written before
    the key existed) differs only when the current value is not the key's default, so a run
    started by an older version resumes unless a new option changes what it computes."""
    a, b = flatten(saved), flatten(current)
    norm = lambda v: json.dumps(v, sort_keys=True)
    defaults = flatten(ExperimentConfig().to_dict())
    keys = sorted((set(a) | set(b)) - set(RESUMABLE_KEYS))
    return [k for k in keys if norm(a.get(k, defaults.get(k))) != norm(b.get(k))]


def initialize_from_config(config) -> bool:
    """Join the multi-process run the config's ``distributed`` section describes (nothing when it
    asks for none): the launcher calls it first, before anything touches the JAX backend (which
    :func:`resolve` does, to count devices). Only that section is read, and validated with errors
    naming its keys. Returns True when a multi-process runtime is (now) running.

    Raises:
      ConfigError for a bad ``distributed`` section.
    """
    import jax
    section = _plain(config).get("distributed") or {}
    try:
        distributed = _build(DistributedConfig, section, "distributed.")
    except (ValueError, TypeError) as e:
        raise ConfigError(e.args[0] if e.args else str(e)) from e
    if jax.distributed.is_initialized():
        return True
    return initialize_distributed(distributed)
