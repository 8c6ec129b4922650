"""Export a trained policy to a Hugging Face folder that transformers loads directly.

    python -m experiments.export runs/grpo-smollm2-count_letters --out=exports/grpo-smollm2
    python -m experiments.export /tmp/g --out=/tmp/g-hf --dtype=bfloat16 --step=2

``<workdir>`` is a run directory written by :func:`hindsight.train.loop.run` (``python -m
experiments.run``): its ``config.json`` names the model (``model.name``: a registry name, an HF
folder, a ``.gguf`` file or ``tiny-random``) and the policy is restored from its latest checkpoint
under ``checkpoints/`` (``--step=N``: checkpoint ``N``) by :func:`hindsight.train.loop.trained_policy`,
the code that evaluation and warm starts use. ``--out`` (a new or empty directory) receives:

* ``model.safetensors``: the params in the decoder's HF layout (``hindsight.models.loading.export``:
  torch ``[out, in]`` weights, one ``model.layers.<i>.*`` per layer, no ``lm_head.weight`` when the
  embeddings are tied), in ``--dtype`` (``float32`` or ``bfloat16``; default the checkpoint's);
  above ``--max_shard_mb`` (default 5000, transformers' 5 GB) the tensors are cut into
  ``model-0000k-of-0000n.safetensors`` shards with ``model.safetensors.index.json``;
* ``config.json``: the architecture as transformers' own config class writes it
  (``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM``, tied or untied head, RoPE
  parameters, ``dtype``, the tokenizer's BOS / EOS / pad ids);
* ``generation_config.json``: those special ids, so that ``generate`` stops at EOS;
* the tokenizer (``save_pretrained``: ``tokenizer.json``, ``tokenizer_config.json``, the chat
  template); ``tiny-random``'s character tokenizer is written as the equivalent HF tokenizer.

Then ``AutoModelForCausalLM.from_pretrained(DIR)`` and ``AutoTokenizer.from_pretrained(DIR)`` load it
(tested: logits equal ours, ``tests/experiments/test_export.py``). Nothing is pickled. The folder is
written under a temporary name and renamed when complete, so ``--out`` never holds a partial export.
It prints one JSON object last (``out``, ``step``, ``architecture``, ``dtype``, ``files``,
``num_params``). The whole train state is restored (the one restore path), so the export needs
the memory of the run's state, optimizer included, on one process.
"""
from __future__ import annotations

import json
import os
import sys

from absl import app, flags, logging

from hindsight import storage

DTYPES = ("float32", "bfloat16")

_OUT = flags.DEFINE_string("out", None, "the HF folder to write (must not exist, or be empty)")
_DTYPE = flags.DEFINE_enum("dtype", None, list(DTYPES), "dtype of the written params (default: the "
                           "checkpoint's)")
_STEP = flags.DEFINE_integer("step", None, "the checkpoint to export (default: the latest)")
_MAX_SHARD_MB = flags.DEFINE_float("max_shard_mb", 5000.0, "largest safetensors file in MB (10^6 "
                                   "bytes); above it the params are sharded with an index")
flags.register_validator("max_shard_mb", lambda mb: mb > 0, message="--max_shard_mb must be positive")


class ExportError(ValueError):
    """A bad argument of the export: no run, no checkpoint, an occupied output folder."""


def checkpoint_steps(workdir: str) -> list[int]:
    """The saved steps under ``<workdir>/checkpoints`` (orbax names each step's folder by its
    number), ascending; ``[]`` when there are none."""
    folder = storage.run_path(workdir) / "checkpoints"
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit() and p.is_dir())


def check_arguments(workdir: str, out: str, *, step: int | None = None) -> int:
    """The checkpoint step to export, once every argument is checked (before anything loads).

    Raises:
      ExportError naming the argument: a ``workdir`` that is no run directory or has no
      checkpoint (at ``step``), an ``out`` that exists and is not an empty directory.
    """
    if not storage.run_path(workdir).is_dir():
        raise ExportError(f"workdir {workdir!r} is not a directory (expected the run directory of "
                          f"`python -m experiments.run`)")
    if not (storage.run_path(workdir) / "config.json").exists():
        raise ExportError(f"workdir {workdir!r} holds no run (no config.json)")
    steps = checkpoint_steps(workdir)
    if not steps:
        raise ExportError(f"workdir {workdir!r} has no checkpoint under checkpoints/ (a run saves "
                          f"one every train.save_every steps and when it ends)")
    if step is not None and step not in steps:
        raise ExportError(f"--step={step}: workdir {workdir!r} has no checkpoint at that step; "
                          f"saved steps: {steps}")
    if os.path.exists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        raise ExportError(f"--out={out!r} exists and is not an empty directory; choose a new one")
    return steps[-1] if step is None else step


def hf_tokenizer(tokenizer):
    """The run's tokenizer as a transformers tokenizer (``tiny-random``'s character tokenizer is
    converted; every other model's already is one)."""
    from hindsight.testing import CharTokenizer
    if isinstance(tokenizer, CharTokenizer):
        from hindsight.testing.hf_char_tokenizer import hf_char_tokenizer
        return hf_char_tokenizer()
    return tokenizer


def export_run(workdir: str, out: str, *, dtype: str | None = None, step: int | None = None,
               max_shard_bytes: int | None = None) -> dict:
    """Write the policy of run ``workdir`` at checkpoint ``step`` (default: the latest) to the HF
    folder ``out`` (see the module doc); params cast to ``dtype`` (None: the checkpoint's),
    sharded above ``max_shard_bytes`` (None: 5 GB). Returns the summary the command prints.

    Raises:
      ExportError (see :func:`check_arguments`), ValueError for a ``dtype`` not in ``DTYPES``.
    """
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    step = check_arguments(workdir, out, step=step)
    from hindsight.models.loading.export import save_hf_folder
    from hindsight.train.loop import trained_policy

    model, tokenizer, step = trained_policy(workdir, step=step)
    written = save_hf_folder(model, hf_tokenizer(tokenizer), out, dtype=dtype,
                             max_shard_bytes=max_shard_bytes)
    return {"out": out, "workdir": workdir, "step": step,
            **{k: written[k] for k in ("architecture", "dtype", "files", "num_params")}}


def main(argv) -> int:
    if len(argv) != 2:
        raise app.UsageError(f"expected one run directory, got {argv[1:]}: python -m "
                             f"experiments.export <workdir> --out=DIR")
    logging.set_verbosity(logging.WARNING)  # orbax logs every restore phase at INFO
    try:  # before JAX is imported: a wrong argument is reported in a second
        step = check_arguments(argv[1], _OUT.value, step=_STEP.value)
    except ExportError as e:
        print(f"export error: {e}", file=sys.stderr)
        return 2
    from hindsight.models import UnsupportedModelError
    from hindsight.train.experiment import ConfigError

    try:
        summary = export_run(argv[1], _OUT.value, dtype=_DTYPE.value, step=step,
                             max_shard_bytes=int(_MAX_SHARD_MB.value * 10**6))
    except (ExportError, ConfigError, UnsupportedModelError) as e:
        print(f"export error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    flags.mark_flags_as_required(["out"])
    app.run(main)
