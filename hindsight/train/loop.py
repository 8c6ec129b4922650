"""The RL loop: rollout -> verify -> signal -> updates, with a run directory that resumes.

    summary = hindsight.train.loop.run(config, workdir="runs/grpo")

The config is resolved once (:func:`hindsight.train.experiment.resolve`): typed sections and the
method configured for them, which is handed to the rollout (:func:`hindsight.rollout.collect`) and
the step. Each training step samples ``rollout.prompts_per_step`` prompts of the task's train split
(drawn from a seed derived from ``(seed, step)``, so the data order is a function of the step and
a resumed run sees exactly the prompts an uninterrupted one would), collects the method's batch
with the current params, splits it into ``train.ppo_minibatches`` mini-batches of whole groups and
makes ``train.ppo_epochs`` passes over them, one optimizer update per mini-batch
(:func:`hindsight.train.make_train_step`; ``logp_old`` stays the rollout's). A method state
(CRAFT's controller) is updated once per step, after its updates, from their mean metrics; an EMA
reference after every update. The run directory holds:

* ``config.json`` — the resolved config; a later run in the same directory must match it except
  for :data:`hindsight.train.experiment.RESUMABLE_KEYS` (else it refuses, naming the keys);
* ``metrics.jsonl`` + TensorBoard events — per step: the loss metrics (mean over the step's
  updates), ``reward``, ``response_length``, ``generated_tokens_per_group``, ``rollout_seconds``
  (``rollout_compile_seconds`` of it compiling programs for shapes not run before),
  ``verify_wait_seconds`` (decoding waited for verification), ``verify_worker_seconds`` (checking,
  overlapping decode), ``update_seconds``, ``step_time``, ``tokens_per_s`` (generated tokens / step time),
  for HDL trees ``reflection_tokens_per_group`` and ``rollout_seconds/<phase>`` (:data:`TREE_PHASES`)
  and, on evaluation steps, ``eval_reward`` (held-out);
* ``updates.jsonl`` + TensorBoard ``update/*`` — per optimizer update: ``step``, ``update``,
  ``epoch``, ``minibatch`` and the update's loss metrics (``ratio``, clip fractions, ...);
* ``samples.jsonl`` — per step a few decoded responses (HDL: reflections, branch points and one
  root's per-token hindsight scores; SEED: a few of the skills the policy wrote, ``generated``);
* ``checkpoints/`` — orbax checkpoints (state incl. optimizer, RNG, reference and method state)
  at step boundaries: every ``train.save_every`` steps, at the end, and when the run is
  interrupted. A resumed run restarts at the step after the last checkpoint, so it is exact
  (tested bit for bit with several updates per step);
* ``summary.json`` — per-metric last / mean / min / max;
* ``prepare/<name>.json`` — a method's preparation result (:mod:`hindsight.rollout.prepare`:
  Neuron-OPSD's data selection), computed once with the initial policy and reloaded on resume.

Multi-host (``jax.distributed``, :mod:`hindsight.train.multihost`): each process samples,
verifies and assembles only its share of the step's prompts (whole groups; request keys are folded
from each prompt's number in the step, so the global batch is the single-process one whatever the
process count; DAPO's dynamic sampling is the exception: each process filters its own stream),
samples with a host-local copy of the params, and feeds its rows to the step; rollout metrics are
reduced over the processes, the held-out evaluation is split between them, only the primary
process writes files and every other one reports its progress on stderr, tagged with its index.

Ctrl-C (SIGINT) and SIGTERM (what ``timeout`` and cluster schedulers send on preemption) stop the
run at the next phase boundary (after the rollout or after the step's updates) and write a
checkpoint of the last completed step; a second signal aborts at once.
"""
from __future__ import annotations

import contextlib
import itertools
import signal
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hindsight import storage
from hindsight.methods import LMHead
from hindsight.rollout import (EpisodeOptions, GenerationOptions, PrepareInputs, RolloutConfig,
                               TreeOptions, check_preparation, collect, prepare_task)
from hindsight.models.registry import tokenizer_mismatch
from hindsight.rollout.collect import check_contexts, episode_mismatch
from hindsight.rollout.episodes import env_pool, play
from hindsight.rollout.runtime import with_eos
from hindsight.sampling import SamplingParams
from hindsight.tasks import EpisodeTask, get_task
from hindsight.train import multihost
from hindsight.train.checkpoint import CheckpointConfig, Checkpointer
from hindsight.train.data import prompt_batches
from hindsight.train.evaluation import sample_rewards
from hindsight.train.experiment import (ConfigError, Experiment, ExperimentConfig,
                                        NonFiniteError, config_differences,
                                        initialize_from_config, resolve)
from hindsight.train.mesh import make_mesh, model_rules
from hindsight.train.metrics import MetricsConfig, MetricsLogger
from hindsight.train.optim import make_optimizer, make_schedule
from hindsight.train.state import create_train_state
from hindsight.train.step import make_train_step

TINY_MODEL = "tiny-random"
EVAL_STREAM = 2**31 - 1  # fold_in index of the evaluation key (training steps use 0, 1, ...)


def load_policy(section, mesh):
    """``(model, tokenizer)`` for the config's model section, params in ``section.param_dtype``."""
    if section.name == TINY_MODEL:
        from hindsight.testing import CharTokenizer, char_model
        graphdef, params, rest = nnx.split(char_model(0, attention=section.attention), nnx.Param, ...)
        params = jax.tree.map(lambda p: p.astype(section.param_dtype), params)
        return nnx.merge(graphdef, params, rest), CharTokenizer()
    from hindsight.models import load
    return load(section.name, dtype=jnp.dtype(section.dtype),
                param_dtype=jnp.dtype(section.param_dtype), mesh=mesh,
                scan_layers=section.scan_layers, remat=section.remat, attention=section.attention)


def _tokenizer_of(name: str):
    if name == TINY_MODEL:
        from hindsight.testing import CharTokenizer
        return CharTokenizer()
    from hindsight.models import load_tokenizer
    return load_tokenizer(name)


def check_teacher_tokenizer(exp) -> None:
    """Raise ConfigError if the external teacher (``teacher.model.name``) does not give the
    policy's token ids: it scores the policy's tokens, so both must read them as the same text.
    Only the tokenizers are loaded (no weights, nothing compiled)."""
    name = exp.teacher.model.name
    if name is None:
        return
    reason = tokenizer_mismatch(_tokenizer_of(exp.model.name), _tokenizer_of(name))
    if reason:
        raise ConfigError(f"teacher.model.name={name!r} does not share the tokenizer of "
                          f"model.name={exp.model.name!r}: {reason}; an external teacher must "
                          f"score the policy's own token ids")


def load_teacher(section, mesh, vocab_size: int):
    """The external teacher of ``teacher.model`` (None without one; its tokenizer was checked
    at pre-flight): frozen, sharded on ``mesh`` by the policy's rules. ``"tiny-random"`` is a
    second tiny random decoder (seed 1; the policy's is seed 0)."""
    if section.name is None:
        return None
    if section.name == TINY_MODEL:
        from hindsight.testing import char_model
        teacher = char_model(1)
    else:
        from hindsight.models import load
        teacher, _ = load(section.name, dtype=jnp.dtype(section.dtype), mesh=mesh,
                          scan_layers=section.scan_layers, remat=False, tokenizer=False)
    if teacher.config.vocab_size != vocab_size:
        raise ConfigError(f"teacher.model.name={section.name!r} has {teacher.config.vocab_size} "
                          f"logits, the policy {vocab_size}: the LM head projects both sides onto "
                          f"one vocabulary")
    return teacher


def train_examples(task, *, seed: int, step: int, count: int):
    """The step's prompts, an endless stream that is a function of ``(seed, step)``: group / HDL
    rollouts take the first ``count``; DAPO dynamic sampling draws more until it has enough mixed
    groups.

    A task with a fixed list of problems (``split_examples``: files, HumanEval) is read in epochs
    through grain (:func:`hindsight.train.prompt_batches`): step ``k``'s prompts are batch ``k``
    of its train split shuffled by ``seed`` and reshuffled each epoch; extra draws come from a
    reshuffle seeded by ``(seed, step)``. A generated task draws from seeds
    ``(seed, step, chunk)``. The stream is the step's, whatever the process count
    (:func:`rollout_step` takes each process's share of it)."""
    base = int(np.random.SeedSequence([seed, step]).generate_state(1)[0])
    if hasattr(task, "split_examples"):
        items = task.split_examples("train")
        if count > len(items):
            raise ConfigError(f"rollout.prompts_per_step={count} exceeds the {len(items)} "
                              f"problems of task {task.name!r}'s train split")
        common = dict(batch_size=count, process_index=0, process_count=1)
        yield from prompt_batches(items, seed=seed, **common)[step]
        extra = prompt_batches(items, seed=base, **common)
        for chunk in itertools.count():
            yield from extra[chunk]
    else:
        for chunk in itertools.count():
            yield from task.examples(split="train", count=count, seed=base + chunk)


def sampling_params(exp: ExperimentConfig, *, temperature: float | None = None) -> SamplingParams:
    r = exp.rollout
    return SamplingParams(temperature=r.temperature if temperature is None else temperature,
                          top_p=r.top_p, top_k=r.top_k, min_p=r.min_p,
                          max_new_tokens=r.max_new_tokens)


def rollout_config(xp: Experiment) -> RolloutConfig:
    return rollout_config_of(xp.config)


def rollout_config_of(exp: ExperimentConfig) -> RolloutConfig:
    r = exp.rollout
    tree = TreeOptions(reflection_max_tokens=r.reflection_max_tokens,
                       hindsight_reflection_tokens=r.hindsight_reflection_tokens,
                       feedback_max_tokens=r.feedback_max_tokens)
    episodes = EpisodeOptions(max_turns=r.max_turns, episode_tokens=r.episode_tokens,
                              step_timeout=r.env_step_timeout, reset_timeout=r.env_reset_timeout)
    generated = GenerationOptions(max_tokens=r.generated_max_tokens,
                                  feedback_max_tokens=r.feedback_max_tokens)
    return RolloutConfig(slots=r.slots, chunk_steps=r.chunk_steps, tree=tree,
                         num_sample_texts=exp.num_sample_texts,
                         verify_workers=r.verify_workers, episodes=episodes, generated=generated)


def vocab_mask(tokenizer, vocab_size: int):
    """``[V]`` bool, True below the tokenizer's size, when the model pads its vocabulary (the Qwen
    family: 151,665 tokens in 151,936 logits); None when they agree or the tokenizer has no size.

    Raises:
      ConfigError when the tokenizer has more ids than the model has logits.
    """
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else vocab_size
    if size > vocab_size:
        raise ConfigError(f"the tokenizer has {size} ids but the model only {vocab_size} logits")
    return None if size == vocab_size else jnp.arange(vocab_size) < size


def rollout_step(xp: Experiment, model, tokenizer, task, sampling: SamplingParams, *, step: int,
                 pool=None, teacher=None):
    """``(batch, stats)`` of this process's share of the rollout of training step ``step``
    (0-based): the step's prompts (:func:`train_examples`), this process's contiguous share of
    them (:func:`hindsight.train.multihost.prompt_share`; all of them on one process), sampled,
    verified and assembled by :func:`hindsight.rollout.collect` with the run's key
    ``fold_in(key(seed), step)`` and each prompt's number in the step; an episode task's
    environments in ``pool`` (None: a pool for the call). DAPO's dynamic sampling draws every
    ``process_count``-th example of the step's stream from this process's offset, with its own
    key, until it holds its share of mixed groups."""
    exp = xp.config
    count, processes = exp.rollout.prompts_per_step, jax.process_count()
    share = multihost.prompt_share(count)
    examples = train_examples(task, seed=exp.seed, step=step, count=count)
    key = jax.random.fold_in(jax.random.key(exp.seed), step)
    first = share.start
    if xp.method.rollout == "dynamic":
        examples = itertools.islice(examples, jax.process_index(), None, processes)
        if processes > 1:
            key, first = jax.random.fold_in(key, jax.process_index()), 0
    else:
        examples = list(itertools.islice(examples, count))[share]
    batch, stats = collect(xp.method, model, tokenizer, task, examples, key=key,
                           sampling=sampling, rollout=rollout_config(xp),
                           num_groups=share.stop - share.start, pool=pool, teacher_model=teacher,
                           first_index=first, gather=multihost.gather_rows)
    return multihost.agree_widths(batch), stats


def episode_pool(xp: Experiment, task):
    """The run's environment pool for an episode task (None for other tasks): enough workers for
    a step's episodes and for an evaluation's, started once for the whole run."""
    if not isinstance(task, EpisodeTask):
        return None
    exp = xp.config
    workers = max(exp.rollout.prompts_per_step * xp.method.group_size, exp.eval.num_examples, 1)
    return env_pool(task, workers=workers, options=rollout_config_of(exp).episodes)


# The rollout keys `evaluate` samples with (`sampling_params`, the slot batch, verification and the
# episode options): two runs that also agree on the model, the seed, the task and ``eval.*`` evaluate
# the same parameters alike (``experiments.demo`` shares one start evaluation on this).
EVAL_ROLLOUT_KEYS = ("temperature", "top_p", "top_k", "min_p", "max_new_tokens", "slots", "chunk_steps",
                     "verify_workers", "max_turns", "episode_tokens", "env_step_timeout", "env_reset_timeout")


def evaluate(model, tokenizer, task, exp: ExperimentConfig, *, key, pool=None) -> float:
    """Mean reward of one sample per held-out example (``eval.*``); an episode task's
    environments in ``pool`` (None: a pool for the call). In a multi-process run each process
    evaluates a contiguous share of the examples (numbered as in the whole list, so the figure
    does not depend on the process count) and the mean is taken over all of them."""
    e = exp.eval
    examples = task.examples(split=e.split, count=e.num_examples, seed=exp.seed)
    per = -(-len(examples) // jax.process_count())
    first = jax.process_index() * per
    mine = examples[first:first + per]
    params = with_eos(sampling_params(exp, temperature=e.temperature), tokenizer)
    rewards = np.zeros(0)
    if mine and isinstance(task, EpisodeTask):  # one episode per example; its return is the reward
        groups, _, _ = play(model, tokenizer, task, mine, key=key, params=params,
                            group_size=1, options=rollout_config_of(exp).episodes,
                            slots=exp.rollout.slots, chunk_steps=exp.rollout.chunk_steps,
                            pool=pool, first_index=first)
        rewards = np.array([g.rewards.mean() for g in groups])
    elif mine:
        rewards = sample_rewards(model, tokenizer, task, mine, key=key, params=params,
                                 samples=1, slots=exp.rollout.slots,
                                 chunk_steps=exp.rollout.chunk_steps,
                                 verify_workers=exp.rollout.verify_workers,
                                 first_index=first).rewards
    return multihost.weighted_mean(float(np.sum(rewards)), float(np.size(rewards)))


def preflight(xp: Experiment):
    """Every check that can run before the run directory is touched: the model name resolves, the
    task builds with its options, the sampling parameters (training and evaluation) validate, the
    evaluation split exists. Returns ``(task, sampling)``.

    Raises:
      ConfigError naming the key.
    """
    from hindsight.tasks import SPLITS
    exp = xp.config
    try:
        if exp.model.name != TINY_MODEL:
            from hindsight.models import registry
            registry.resolve(exp.model.name)
        task = get_task(exp.task.name, **exp.task.options)
        sampling = sampling_params(exp)
        sampling_params(exp, temperature=exp.eval.temperature)
        check_teacher_tokenizer(exp)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{e.args[0] if e.args else e}") from e
    try:
        check_contexts(xp.method)
        check_preparation(xp.method)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if exp.eval.split not in SPLITS:
        raise ConfigError(f"eval.split must be one of {list(SPLITS)}, got {exp.eval.split!r}")
    if isinstance(task, EpisodeTask):
        error = episode_mismatch(xp.method, task)
        if error:
            raise ConfigError(f"task.name={task.name!r}: {error}")
        if exp.rollout.episode_tokens <= exp.rollout.max_new_tokens:
            raise ConfigError(f"rollout.episode_tokens ({exp.rollout.episode_tokens}) must exceed "
                              f"rollout.max_new_tokens ({exp.rollout.max_new_tokens}), which caps "
                              f"one turn of an episode")
    return task, sampling


def _prepare_workdir(workdir: str, resolved: dict) -> None:
    """Write ``config.json``, or check an existing one matches (a foreign run is refused)."""
    path = storage.run_path(workdir) / "config.json"
    if path.exists():
        saved = storage.read_json(path)
        diff = config_differences(saved, resolved)
        if diff:
            raise ConfigError(f"workdir {workdir!r} holds a run of another config (differs at "
                             f"{diff}); resume it with its own config or use a new --workdir")
    if jax.process_index() == 0:
        storage.write_json(path, resolved, indent=2, sort_keys=True)


class _StopFlag:
    """SIGINT (Ctrl-C) or SIGTERM (``timeout``, cluster schedulers, preemption) -> ``stop`` is set
    and ``signal`` names it; a second signal raises KeyboardInterrupt (main thread only)."""
    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.stop = False
        self.signal: str | None = None

    def agreed(self) -> bool:
        """Whether to stop now, as every process of the run decides together: a signal may reach
        some processes only, or at different times, and one process leaving the loop while the
        others enter the next step's collectives would hang them. A process that received no
        signal adopts its peer's (one tiny all-gather per phase boundary; no collective on a
        single process)."""
        if jax.process_count() == 1:
            return self.stop
        code = signal.Signals[self.signal].value if self.signal else 0
        codes = multihost.allgather(np.array([code], np.int64))
        if codes.max() > 0 and not self.stop:
            self.stop, self.signal = True, signal.Signals(int(codes.max())).name
        return self.stop

    def __call__(self, signum, frame):
        if self.stop:
            raise KeyboardInterrupt
        self.stop, self.signal = True, signal.Signals(signum).name
        print(f"\n[hindsight] {self.signal}: stopping at the next step boundary and saving a "
              f"checkpoint (send it again to abort without saving)", flush=True)

    @contextlib.contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self) for s in self.SIGNALS}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def _slice(batch: dict, part: int, parts: int) -> dict:
    """The ``part``-th of ``parts`` contiguous row slices of every leaf."""
    if parts == 1:
        return batch
    return {k: v[part * (len(v) // parts):(part + 1) * (len(v) // parts)]
            for k, v in batch.items()}


def minibatches(batch: dict, count: int) -> list[dict]:
    """This process's rows of the rollout (it sampled only those), cut into ``count``
    mini-batches: mini-batch ``k`` is the ``k``-th contiguous slice, whole groups by the layout
    check (:func:`hindsight.train.check_layout`)."""
    return [_slice(batch, k, count) for k in range(count)]


def _mean_records(records: list[dict]) -> dict:
    """Per metric, the mean over the step's updates (verl's reduction of mini-batch metrics)."""
    return {k: float(np.mean([r[k] for r in records])) for k in records[0]}


# HDL's rollout phases (:class:`hindsight.rollout.runtime.PhaseClock`): decoding the roots, the
# reflections (their turn's extension included), scoring the roots under `h`, decoding the
# continuations and any fresh rows. Logged as ``rollout_seconds/<phase>``.
TREE_PHASES = ("roots", "reflection", "scoring", "continuations", "fresh")


def _rollout_metrics(stats) -> dict:
    out = {"reward": stats.reward_mean, "response_length": stats.response_length_mean,
           "generated_tokens_per_group": float(np.mean(stats.generated_tokens)),
           "rollout_seconds": stats.seconds["total"],
           "rollout_compile_seconds": stats.compile_seconds,
           "verifier_errors": stats.verifier_errors,
           "verify_wait_seconds": stats.seconds.get("verify_wait", 0.0),
           "verify_worker_seconds": stats.verify_worker_seconds}
    if stats.source is not None:
        out["on_policy"] = float(stats.source == "on_policy")
    if stats.turns_per_episode is not None:
        out.update(turns_per_episode=stats.turns_per_episode,
                   env_wait_seconds=stats.seconds.get("env_wait", 0.0),
                   env_seconds=stats.seconds.get("env", 0.0))
    if stats.reflection_tokens:   # HDL trees: the rollout's seconds by phase, fixed keys
        out["reflection_tokens_per_group"] = float(np.mean(stats.reflection_tokens))
        out.update({f"rollout_seconds/{k}": stats.seconds.get(k, 0.0) for k in TREE_PHASES})
    if stats.rollout == "dynamic":
        out.update(gen_batches=stats.gen_batches, dropped_groups=stats.dropped_groups,
                   filled_groups=stats.filled_groups)
    if stats.selection is not None:  # completions from the policy's own samples
        out.update(stats.selection)
    if stats.recoverability is not None:   # counts only: every process logs the same keys
        out.update({f"{k}_states" if k != "states" else "error_states": stats.recoverability[k]
                    for k in ("states", "recoverable", "irreversible", "ambiguous")})
    return out


def _sample_record(step: int, stats) -> dict:
    rec = {"step": step, "texts": stats.sample_texts}
    if stats.generated_texts:
        rec["generated"] = stats.generated_texts
    if stats.rollout == "hdl_tree":
        rec.update(reflections=stats.reflections, branch_positions=stats.branch_positions,
                   trace=stats.trace)
    return rec


def _train_state(xp: Experiment, model, tx, mesh):
    """``(state, shardings, model_def)`` of a fresh run of ``xp`` (the shapes a checkpoint of it
    restores onto)."""
    method, exp = xp.method, xp.config
    method_state = method.init_state(method.config) if method.init_state is not None else None
    return create_train_state(model, tx, mesh=mesh, rules=model_rules(mesh), seed=exp.seed,
                              reference=xp.reference, reference_dtype=exp.train.reference_dtype,
                              method_state=method_state)


def warm_start(model, section, mesh):
    """``model`` with the params of the latest checkpoint of the run in ``section.init_from``
    (a previous stage), which must have trained the same ``model.name``."""
    path = storage.run_path(section.init_from) / "config.json"
    if not path.exists():
        raise ConfigError(f"model.init_from={section.init_from!r} holds no run (no config.json)")
    previous = storage.read_json(path)["model"]
    for key in ("name", "scan_layers"):  # the same parameter tree
        if previous[key] != getattr(section, key):
            raise ConfigError(f"model.init_from={section.init_from!r} trained model.{key}="
                              f"{previous[key]!r}, this run model.{key}={getattr(section, key)!r}")
    trained, _, _ = trained_policy(section.init_from)
    graphdef, _, rest = nnx.split(model, nnx.Param, ...)
    _, params, _ = nnx.split(trained, nnx.Param, ...)
    # the previous stage may have kept another model.param_dtype: this run's state is in its own
    params = jax.tree.map(lambda p: p.astype(section.param_dtype), params)
    return nnx.merge(graphdef, params, rest)


def trained_policy(workdir: str, *, step: int | None = None):
    """``(model, tokenizer, step)``: the policy of the run in ``workdir`` (its ``config.json``) at
    checkpoint ``step`` (default: the latest).

    Raises:
      ConfigError when ``workdir`` holds no run config; FileNotFoundError when it has no
      checkpoint (at ``step``).
    """
    path = storage.run_path(workdir) / "config.json"
    if not path.exists():
        raise ConfigError(f"--checkpoint={workdir!r} holds no run (no config.json)")
    xp = resolve(storage.read_json(path))
    mesh = make_mesh(xp.config.train.mesh)
    model, tokenizer = load_policy(xp.config.model, mesh)
    tx = make_optimizer(xp.config.train.optim, param_dtype=xp.config.model.param_dtype)
    state, shardings, model_def = _train_state(xp, model, tx, mesh)
    ckpt = Checkpointer(CheckpointConfig(directory=storage.run_path(workdir) / "checkpoints"))
    try:
        state, _ = ckpt.restore(jax.eval_shape(lambda s: s, state), shardings, step=step)
        saved = ckpt.latest_step if step is None else step
    finally:
        ckpt.close()
    return model_def.merge(state.params), tokenizer, int(saved)


def run(config, workdir: str, *, progress: bool = True) -> dict:
    """Train ``config`` (ConfigDict or nested dicts, see :mod:`hindsight.train.experiment`) in
    ``workdir``, resuming from its latest checkpoint when there is one.

    Returns:
      The metrics summary plus ``start_step`` (the checkpoint step this invocation resumed from,
      0 for a fresh run), ``final_step``, ``interrupted`` (bool), ``stop_signal`` (the
      signal's name, e.g. ``"SIGTERM"``, or None), ``workdir`` and ``eval_reward`` (the list of
      ``(step, reward)`` evaluations of this invocation) and ``process_generated_tokens`` (the
      tokens this process sampled in this invocation). A run that already holds
      ``train.num_steps`` steps is reported from its files, which stay untouched.

    A config whose ``distributed`` section asks for a multi-process run joins it first
    (:func:`hindsight.train.experiment.initialize_from_config`): every process calls ``run`` with
    the same config and ``workdir``.
    Raises:
      :class:`~hindsight.train.experiment.ConfigError` for a bad config (before any model is
      loaded) or a ``workdir`` holding a run of another config.
    """
    initialize_from_config(config)   # first: resolving counts devices, which starts the backend
    xp = resolve(config)
    exp, method, t = xp.config, xp.method, xp.config.train
    task, sampling = preflight(xp)
    _prepare_workdir(workdir, exp.to_dict())

    mesh = make_mesh(t.mesh)
    model, tokenizer = load_policy(exp.model, mesh)
    ckpt_dir = storage.run_path(workdir) / "checkpoints"
    if exp.model.init_from is not None and not (ckpt_dir.exists() and any(ckpt_dir.iterdir())):
        model = warm_start(model, exp.model, mesh)  # a run with checkpoints resumes from them
    # the method's preparation (Neuron-OPSD's data selection) with the frozen initial policy, or
    # its result saved by the first run in this directory
    task = prepare_task(method, task, model, tokenizer, workdir=workdir, inputs=PrepareInputs(
        seed=exp.seed, sampling=sampling, rollout=rollout_config(xp),
        prompts_per_step=exp.rollout.prompts_per_step))
    tx = make_optimizer(t.optim, param_dtype=exp.model.param_dtype)
    state, shardings, model_def = _train_state(xp, model, tx, mesh)
    head = LMHead(backend=t.lm_head, chunk_size=t.lm_head_chunk_size,
                  vocab_mask=vocab_mask(tokenizer, model.config.vocab_size))
    teacher = load_teacher(exp.teacher.model, mesh, model.config.vocab_size)
    del model  # the state owns the params now; the policy is re-merged from it each step
    step_fn = make_train_step(
        method.loss_fn, model_def=model_def, optimizer=tx, mesh=mesh, shardings=shardings,
        config=xp.step_config(),
        schedule=make_schedule(t.optim), max_grad_norm=t.optim.max_grad_norm,
        loss_kwargs={"config": method.config}, head=head, external_teacher=teacher)
    update_method = (None if method.update_state is None else
                     jax.jit(lambda s, m: s.replace(method_state=method.update(s.method_state, m)),
                             donate_argnums=(0,)))
    ckpt = Checkpointer(CheckpointConfig(directory=ckpt_dir,
                                         save_every=t.save_every, max_to_keep=t.max_to_keep))
    if ckpt.latest_step is not None:
        abstract = jax.eval_shape(lambda s: s, state)
        state, _ = ckpt.restore(abstract, shardings)
    per_step = t.updates_per_rollout
    start = int(state.step) // per_step
    root_key = jax.random.key(exp.seed)
    if start >= t.num_steps:  # finished: report it, write nothing
        ckpt.close()
        summary = MetricsLogger.read_summary(workdir, up_to=start)
        summary.update(start_step=start, final_step=start, interrupted=False, stop_signal=None,
                       workdir=workdir, eval_reward=[], process_generated_tokens=0)
        if progress and jax.process_index() == 0:
            print(f"[hindsight] {workdir} already holds {start} steps (train.num_steps="
                  f"{t.num_steps}): nothing to train", flush=True)
        return summary
    logger = MetricsLogger(MetricsConfig(logdir=workdir, progress=progress),
                           total_steps=t.num_steps, initial_step=start)
    evals: list[tuple[int, float]] = []

    def policy():
        """The policy this process samples with (its own copy on several processes)."""
        return model_def.merge(multihost.host_local(state.params, mesh))

    def eval_due(step: int) -> bool:
        if exp.eval.num_examples == 0:
            return False
        return step == t.num_steps or (exp.eval.every and step % exp.eval.every == 0)

    pool = episode_pool(xp, task)  # one pool for the run, closed with the loop's context
    rollout_teacher = None
    if teacher is not None:   # GKD's seq_kd rows are sampled by it: this process's own copy
        teacher_def, teacher_state = nnx.split(teacher)
        rollout_teacher = nnx.merge(teacher_def, multihost.host_local(teacher_state, mesh))
    process_tokens = 0  # generated by this process in this invocation
    stop = _StopFlag()
    saved_at, nonfinite = start, 0
    primary = jax.process_index() == 0
    samples = (storage.JsonlLog(storage.run_path(workdir) / "samples.jsonl",
                                keep_through=start if start > 0 else -1) if primary else None)
    with stop.installed(), (samples or contextlib.nullcontext()), \
            (pool or contextlib.nullcontext()):
        if start == 0 and exp.eval.num_examples and exp.eval.at_start:
            evals.append((0, evaluate(policy(), tokenizer, task, exp,
                                      key=jax.random.fold_in(root_key, EVAL_STREAM), pool=pool)))
            logger.write(0, {"eval_reward": evals[-1][1]}, advance=False)
        for step in range(start, t.num_steps):
            if stop.agreed():
                break
            t0 = time.perf_counter()
            batch, stats = rollout_step(xp, policy(), tokenizer, task, sampling, step=step,
                                        pool=pool, teacher=rollout_teacher)
            process_tokens += int(np.sum(stats.generated_tokens))
            if stop.agreed():
                break  # the rollout is discarded; the state is still that of `step`
            t1 = time.perf_counter()
            updates = []
            for epoch in range(t.ppo_epochs):
                for k, mini in enumerate(minibatches(batch, t.ppo_minibatches)):
                    state, train_metrics = step_fn(state, mini)
                    updates.append(logger.write_update(step + 1, int(state.step), train_metrics,
                                                       epoch=epoch, minibatch=k))
                    if updates[-1]["nonfinite"]:
                        nonfinite += 1
                        if nonfinite >= t.max_nonfinite_updates:
                            last = ckpt.latest_step
                            logger.close()
                            ckpt.close()
                            u = updates[-1]
                            raise NonFiniteError(
                                f"step {step + 1}, update {int(state.step)}: the loss or gradient "
                                f"is not finite (loss={u['loss']}, grad_norm={u['grad_norm']}); it "
                                f"was not applied. Stopped after {nonfinite} such update(s) "
                                f"(train.max_nonfinite_updates={t.max_nonfinite_updates}); no "
                                f"checkpoint was written after them, the last one is step "
                                f"{last} in {workdir}")
            record = _mean_records(updates)
            finite = [u for u in updates if not u["nonfinite"]]
            if update_method is not None and finite:
                state = update_method(state, _mean_records(finite))
            t2 = time.perf_counter()
            rollout = multihost.reduce_metrics(
                {**_rollout_metrics(stats), "generated_tokens": float(np.sum(stats.generated_tokens))})
            generated = rollout.pop("generated_tokens")   # every process's
            record.update(rollout, update_seconds=t2 - t1, step_time=t2 - t0,
                          tokens_per_s=generated / (t2 - t0))
            if jax.process_count() > 1:   # the primary draws the bar; every other one says this
                print(f"[hindsight p{jax.process_index()}/{jax.process_count()}] step {step + 1}/"
                      f"{t.num_steps}: {int(np.sum(stats.generated_tokens))} tokens generated "
                      f"here, rollout {t1 - t0:.1f} s, update {t2 - t1:.1f} s",
                      file=sys.stderr, flush=True)
            if eval_due(step + 1):
                evals.append((step + 1, evaluate(policy(), tokenizer, task, exp,
                                                 key=jax.random.fold_in(root_key, EVAL_STREAM),
                                                 pool=pool)))
                record["eval_reward"] = evals[-1][1]
            logger.write(step + 1, record)
            if samples is not None:
                samples.write(_sample_record(step + 1, stats))
            if ckpt.save(step + 1, state, meta={"metrics": record}):
                saved_at = step + 1
    final = int(state.step) // per_step
    if saved_at != final:
        ckpt.save(final, state, meta={"interrupted": stop.stop}, force=True)
    ckpt.close()
    summary = logger.close()
    summary.update(start_step=start, final_step=final, interrupted=stop.stop,
                   stop_signal=stop.signal, workdir=workdir, eval_reward=[list(e) for e in evals],
                   process_generated_tokens=process_tokens)
    return summary
