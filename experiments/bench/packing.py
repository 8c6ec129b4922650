"""Packed vs right-padded training rows: one GRPO train step on SmolLM2-135M, side by side.

What is measured: two :class:`hindsight.train.TrainStep` of GRPO's own loss on the same batch,
``StepConfig(packing=False)`` (the rows right-padded to the batch's width ``S``) and
``packing=True`` (each row's real tokens packed end to end into rows of ``S`` positions,
:mod:`hindsight.packing`), and with ``--row-multiple k`` (k > 1) a third,
``pack_row_multiple=k`` (rows of ``k * S`` positions, so that sequences longer than ``S / 2``
share rows). The batch is a realistic length mix of a GRPO step on a reasoning
task: ``B`` rows in groups of ``--group-size`` responses to one prompt (1: every row its own
prompt), prompts of 40-90 tokens (uniform), responses capped at ``--cap`` tokens whose
lengths are log-normal around ``cap / 3`` with a quarter of the rows truncated at the cap (the
mix is reported: mean, quartiles, the padded width and the packed rows). The packed forms lay a
group's prompt once per packed row (:func:`hindsight.packing.shared_prefixes`);
``shared_tokens_saved`` is the fraction of the padded rows' real tokens that this removes. With
``--group-size`` > 1 a fourth form, ``packed_distinct``, packs the same lengths with every row's
prompt tokens its own (nothing to share): ``shared_vs_distinct_time_ratio`` is the packed step's
time over its, the copies' effect alone. Both steps compile ahead
of time; XLA's buffer plan gives each gradient program's temporaries
(``memory_analysis().temp_size_in_bytes``), and timed steps alternate (padded, packed, padded,
...) so that both see the same machine load; the median is reported. The first step of each
starts from the same state: their loss and gradient norm agree (the packed rows compute the same
function).

The last stdout line is one JSON object: ``packed_time_ratio`` (packed / padded step time),
``packed_temp_ratio`` (packed / padded temporaries), ``packed_fraction`` (real tokens over packed
positions; ``padded_fraction`` the same for the padded rows), with ``--row-multiple k`` the same
three for the third form (``packed_x{k}_time_ratio``, ``packed_x{k}_temp_ratio``,
``packed_x{k}_fraction``, against the padded step), the length mix, every time, the
loss and gradient-norm differences, and the machine with its load before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

GIB = 2.0 ** 30


def length_mix(rng, *, rows: int, cap: int, group_size: int = 1):
    """``(prompt lengths, response lengths)`` of ``rows`` rows, each group of ``group_size``
    rows with one prompt (see the module doc)."""
    import numpy as np

    prompts = np.repeat(rng.integers(40, 91, -(-rows // group_size)), group_size)[:rows]
    responses = np.minimum(np.round(rng.lognormal(np.log(cap / 3), 0.6, rows)), cap)
    responses[rng.permutation(rows)[:rows // 4]] = cap   # truncated at the cap
    return prompts.astype(int), np.maximum(responses, 1).astype(int)


def make_rows(vocab: int, prompts, responses, *, width: int, group_size: int = 1,
              seed: int = 0) -> dict:
    """Right-padded rows of ``prompts[i] + responses[i]`` random tokens in the
    :mod:`hindsight.batch` layout, every response token in the loss; the rows of a group of
    ``group_size`` share their prompt's tokens."""
    import numpy as np

    from hindsight.batch import build_batch

    rng = np.random.default_rng(seed)
    b, t = len(prompts), int(max(responses))
    tokens = np.zeros((b, width), np.int32)
    attention = np.zeros((b, width), np.int32)
    targets = np.zeros((b, t), np.int32)
    index = np.zeros((b, t), np.int32)
    mask = np.zeros((b, t), np.float32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        if i % group_size == 0:
            prompt = rng.integers(0, vocab, p)
        tokens[i, :p] = prompt
        tokens[i, p:p + r] = rng.integers(0, vocab, r)
        attention[i, :p + r] = 1
        targets[i, :r] = tokens[i, p:p + r]
        index[i, :r] = p - 1 + np.arange(r)
        mask[i, :r] = 1.0
    return build_batch(
        tokens=tokens, positions=np.broadcast_to(np.arange(width, dtype=np.int32),
                                                 (b, width)).copy(),
        attention_mask=attention, targets=targets, target_index=index, mask=mask,
        logp_old=(-np.log(vocab) + rng.standard_normal((b, t))).astype(np.float32) * mask,
        advantages=rng.standard_normal(b).astype(np.float32))


def main(argv=None) -> dict:
    import jax
    import numpy as np

    import hindsight.models as models
    import hindsight.train as ht
    from hindsight.methods import get_method
    import jax.numpy as jnp

    from hindsight.models.precision import auto_compute_dtype
    from hindsight.packing import pack_batch, packed_fraction, shared_tokens_saved
    from hindsight.sampling.buckets import round16
    from experiments.bench import load_and_machine

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="the tiny random model, 16 rows, cap 64 (CI size)")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--cap", type=int, default=192, help="response cap in tokens")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--group-size", type=int, default=1,
                        help="responses per prompt (1: every row its own prompt)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                        help="compute dtype (auto: what model.dtype=auto picks on this machine)")
    parser.add_argument("--row-multiple", type=int, default=1,
                        help="also time packed rows of k times the width (train.pack_row_multiple)")
    args = parser.parse_args(argv)
    if args.row_multiple < 1:
        parser.error(f"--row-multiple must be >= 1, got {args.row_multiple}")
    if args.group_size < 1 or args.rows % args.group_size:
        parser.error(f"--group-size must divide --rows ({args.rows}), got {args.group_size}")
    load_start = os.getloadavg()
    dtype = auto_compute_dtype() if args.dtype == "auto" else args.dtype
    if args.quick:
        from hindsight.testing import tiny_model
        model, name, cap, dtype = tiny_model(0), "tiny-random", 64, "float32"
        model.remat = True
    else:
        name, cap = "smollm2-135m-instruct", args.cap
        model, _ = models.load(name, dtype=getattr(jnp, dtype), remat=True, tokenizer=False)
    rng = np.random.default_rng(0)
    prompts, responses = length_mix(rng, rows=args.rows, cap=cap, group_size=args.group_size)
    width = round16(int(max(prompts + responses)))
    rows = make_rows(model.config.vocab_size, prompts, responses, width=width,
                     group_size=args.group_size)
    # the same lengths, every prompt's tokens its own: nothing to share
    distinct = make_rows(model.config.vocab_size, prompts, responses, width=width)

    method = get_method("grpo")
    mesh = ht.make_mesh(ht.MeshConfig(data=1), devices=jax.devices()[:1])
    optim = ht.OptimConfig(learning_rate=1e-6)
    tx = ht.make_optimizer(optim)
    state, shardings, model_def = ht.create_train_state(model, tx, mesh=mesh)
    del model
    k = args.row_multiple
    forms = {"padded": (False, 1, rows), "packed": (True, 1, rows)}
    if args.group_size > 1:
        forms["packed_distinct"] = (True, 1, distinct)
    if k > 1:
        forms[f"packed_x{k}"] = (True, k, rows)
    steps, out = {}, {}
    for form, (packing, multiple, batch) in forms.items():
        steps[form] = ht.make_train_step(
            method.loss_fn, model_def=model_def, optimizer=tx, mesh=mesh, shardings=shardings,
            config=ht.StepConfig(batch_size=args.rows, packing=packing,
                                 pack_row_multiple=multiple),
            loss_kwargs={"config": method.config})
        t0 = time.perf_counter()
        mem = steps[form].lower(state, batch).compile().memory_analysis()
        grads, metrics = steps[form].grads(state, batch)
        out[form] = {"compile_s": round(time.perf_counter() - t0, 2),
                     "xla_temp_gib": mem.temp_size_in_bytes / GIB, "times_s": [],
                     "first_loss": float(metrics["loss"]),
                     "first_grad_norm": float(np.sqrt(sum(np.sum(np.square(g, dtype=np.float64))
                                                          for g in jax.tree.leaves(grads))))}
        del grads
    for form, (_, _, batch) in forms.items():   # warm-up (compiles the update program too)
        state, _ = steps[form](state, batch)
    for _ in range(args.repeats):
        for form, (_, _, batch) in forms.items():
            t0 = time.perf_counter()
            state, metrics = steps[form](state, batch)
            jax.block_until_ready(metrics)
            out[form]["times_s"].append(round(time.perf_counter() - t0, 3))
    for r in out.values():
        r["step_time_s"] = statistics.median(r["times_s"])
    packed = pack_batch(rows, chunks=1)
    real = int(np.sum(prompts + responses))
    result = {
        "bench": "packing", "model": name, "method": "grpo", "rows": args.rows,
        "group_size": args.group_size,
        "dtype": dtype,
        "mix": {"prompt_tokens": [int(prompts.min()), int(prompts.max())],
                "response_cap": cap,
                "response_mean": float(responses.mean()),
                "response_quartiles": [float(q) for q in np.percentile(responses, [25, 50, 75])],
                "truncated_rows": int(np.sum(responses == cap))},
        "padded_shape": list(rows["tokens"].shape),
        "packed_shape": list(packed["packed_tokens"].shape),
        "padded_fraction": real / rows["tokens"].size,
        "packed_fraction": packed_fraction(packed),
        "shared_tokens_saved": shared_tokens_saved(real, packed),
        "padded": out["padded"], "packed": out["packed"],
        "packed_time_ratio": out["packed"]["step_time_s"] / out["padded"]["step_time_s"],
        "packed_temp_ratio": out["packed"]["xla_temp_gib"] / out["padded"]["xla_temp_gib"],
        "first_loss_abs_diff": abs(out["packed"]["first_loss"] - out["padded"]["first_loss"]),
        "first_grad_norm_rel_diff": abs(out["packed"]["first_grad_norm"]
                                        - out["padded"]["first_grad_norm"])
        / out["padded"]["first_grad_norm"],
        **load_and_machine(load_start),
    }
    if args.group_size > 1:
        form = out["packed_distinct"]
        result.update({
            "packed_distinct": form,
            "packed_distinct_shape": list(pack_batch(distinct, chunks=1)["packed_tokens"].shape),
            "packed_distinct_time_ratio": form["step_time_s"] / out["padded"]["step_time_s"],
            "shared_vs_distinct_time_ratio": out["packed"]["step_time_s"] / form["step_time_s"]})
    if k > 1:
        wide = pack_batch(rows, chunks=1, row_multiple=k)
        form = out[f"packed_x{k}"]
        result.update({
            f"packed_x{k}": form, f"packed_x{k}_shape": list(wide["packed_tokens"].shape),
            f"packed_x{k}_fraction": packed_fraction(wide),
            f"packed_x{k}_shared_tokens_saved": shared_tokens_saved(real, wide),
            f"packed_x{k}_time_ratio": form["step_time_s"] / out["padded"]["step_time_s"],
            f"packed_x{k}_temp_ratio": form["xla_temp_gib"] / out["padded"]["xla_temp_gib"],
            f"packed_x{k}_first_loss_abs_diff": abs(form["first_loss"]
                                                   - out["padded"]["first_loss"])})
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
