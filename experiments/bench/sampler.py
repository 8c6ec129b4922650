"""Sampler benchmark on SmolLM2-135M-Instruct (CPU): decode throughput vs HF transformers, and the
wall-clock an HDL-shaped rollout saves over independent sampling.

(a) Decode throughput: one 32-token prompt fanned out to B rows, exactly ``--new`` new tokens
    (stop tokens off; HF gets ``min_new_tokens = max_new_tokens``), pure sampling at temperature 1.
    tok/s = B * new / wall time of the whole call (prefill included). HF ``generate`` (fp32, its KV
    cache, 2 torch threads) and ours alternate repetition by repetition; the ratio is taken per
    repetition, median reported. Against the machine's own limit: ``roofline_fraction`` is the
    roofline's time for the call's decode steps over ours (`decode_roofline`: the larger of the
    bytes a step must read over the read bandwidth and its FLOPs over the matmul rate in the
    dtype in use, both measured in the same run); ``_at_shape`` takes the matmul rate at the
    step's own ``[B, hidden] x [hidden, intermediate]`` shape instead of a training-sized one.
(b) HDL rollout step: P distinct prompts, each 2 roots, then per root 2 branch points (random
    positions in ``[1, len - 1 - 8]`` at least 8 apart; 4 and 3 continuations) = 16 trajectories per
    prompt, vs P x 16 independent samples. Same max length, stop tokens off (every row runs to the
    max length, so token counts are exact; each repetition draws its own branch points, so its
    token count is its own and its wall-clock saving is set against it). Both run on the continuous
    batching `Engine` with the same slot count: roots are submitted up front; when a prompt's roots
    finish, its continuations are queued ahead of the remaining roots and share the slot batch with
    them. Wall time = roots + continuations; the hindsight scoring pass (the 2 roots re-scored under
    a feedback context with `score_logprobs`) is timed separately. The single-prompt case (P = 1)
    is reported too: there a tree is mostly sequential (roots, then continuations).
(c) Compile time (first call minus a steady call) and peak resident memory.

The last line is one JSON object with ``decode_tps_ratio_vs_hf`` (the smaller of the batches'),
``decode_tps_ratio_vs_hf_b16`` / ``_b64``, ``roofline_fraction_b16`` / ``_b64`` (and
``_at_shape``), ``hdl_token_saving`` and
``hdl_wallclock_saving`` (fractions of the independent run's tokens / wall time, medians over the
repetitions; the saving is signed, negative when the trees were slower, with
``hdl_wallclock_saving_range`` over the repetitions), ``hdl_saving_efficiency`` (the median over
repetitions of each one's wall-clock saving over its own token saving: each repetition draws its
own branch points) plus every measurement and the machine (load average at start and end).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time

import numpy as np

PARAGRAPH = (
    "The history of the Roman Empire is long and complex, spanning many centuries of war, politics, "
    "culture and trade across Europe, Africa and Asia. Historians still argue about why it rose so far "
    "and why it fell, pointing to economics, disease, climate, religion, administration and the army. "
    "In this essay we look at the evidence from coins, letters, inscriptions and archaeology, and ask "
    "what ordinary people in the provinces thought about the emperors who ruled them from far away.")
TAIL_GUARD, MIN_GAP = 8, 8


def _log(*msg) -> None:
    print(time.strftime("%H:%M:%S"), *msg, file=sys.stderr, flush=True)


def _variant_kwargs(name: str):
    import jax.numpy as jnp

    return {"f32-scan": dict(), "f32-layers": dict(scan_layers=False),
            "bf16-layers": dict(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, scan_layers=False),
            "bf16-scan": dict(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)}[name]


def _prompts(tok, count: int, length: int) -> list[list[int]]:
    ids = tok(PARAGRAPH)["input_ids"]
    if len(ids) < length + count:
        raise ValueError("paragraph too short for the requested prompts")
    return [ids[i: i + length] for i in range(count)]


def _load_hf(path: str):
    import torch
    import transformers

    torch.set_num_threads(2)
    transformers.utils.logging.disable_progress_bar()
    if path.endswith(".gguf"):
        return transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _hf_generate(hf, prompt, batch: int, new: int) -> float:
    import torch

    ids = torch.tensor([prompt] * batch)
    t = time.perf_counter()
    with torch.no_grad():
        hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                    top_p=1.0, max_new_tokens=new, min_new_tokens=new, pad_token_id=0)
    return time.perf_counter() - t


def _ours_generate(model, prompt, batch: int, new: int, seed: int) -> float:
    import jax
    from hindsight.sampling import SamplingParams, generate

    t = time.perf_counter()
    out = generate(model, [prompt], SamplingParams(max_new_tokens=new), num_samples=batch,
                   key=jax.random.key(seed))
    assert int(out.lengths.min()) == new
    return time.perf_counter() - t


def decode_roofline(model, *, batch: int, context: float, bandwidth: float, rates: dict) -> dict:
    """The least time one decode step of ``batch`` rows can take on this machine: the larger of
    the bytes it must read over the measured read ``bandwidth`` (every weight once, the embedding
    only as the tied LM head reads it, plus each row's K/V at a mean ``context``) and its FLOPs
    (2 per matmul weight per row, the LM head included, plus attention's 4 x heads x head_dim
    per layer and context position) over a measured matmul rate. ``rates``: name -> FLOP/s, one
    roofline per rate."""
    import jax
    from flax import nnx

    c = model.config
    leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
    n_params = sum(x.size for x in leaves)
    weight_bytes = sum(x.size * x.dtype.itemsize for x in leaves)
    embed = c.vocab_size * c.hidden_size
    if not c.tie_embeddings:   # an untied embedding is a lookup of `batch` rows, not a matmul
        weight_bytes -= embed * model.embed[...].dtype.itemsize
    matmul_params = n_params - (0 if c.tie_embeddings else embed)
    kv_itemsize = jax.tree.leaves(model.init_cache(1, 1))[0].dtype.itemsize
    kv_bytes = batch * context * c.num_layers * 2 * c.num_kv_heads * c.head_dim * kv_itemsize
    flops = batch * (2 * matmul_params + 4 * c.num_layers * c.num_heads * c.head_dim * context)
    memory_s = (weight_bytes + kv_bytes) / bandwidth
    out = dict(step_bytes=weight_bytes + kv_bytes, step_flops=flops, memory_bound_s=memory_s)
    for name, rate in rates.items():
        out[f"step_s_{name}"] = max(memory_s, flops / rate)
    return out


def decode_throughput(model, hf, prompt, *, batch: int, new: int, reps: int, bandwidth: float,
                      dtype) -> dict:
    import jax.numpy as jnp

    from experiments.bench import matmul_ceiling

    t0 = time.perf_counter()
    _ours_generate(model, prompt, batch, new, 0)
    first = time.perf_counter() - t0
    _hf_generate(hf, prompt, batch, 2)  # warm torch up
    ours, theirs = [], []
    for r in range(reps):
        theirs.append(_hf_generate(hf, prompt, batch, new))
        ours.append(_ours_generate(model, prompt, batch, new, r + 1))
        _log(f"decode B={batch} rep {r}: HF {theirs[-1]:.1f} s, ours {ours[-1]:.1f} s")
    ratios = [h / o for h, o in zip(theirs, ours)]
    toks = batch * new
    _log(f"decode B={batch}: ours {ours} s, HF {theirs} s")
    c = model.config
    # the machine's best matmul rate in the dtype in use (a training-sized MLP matmul) and the
    # rate at this step's own shape ([batch, hidden] x [hidden, intermediate]): XLA:CPU's matmul
    # reaches a fraction of the former with few rows
    rates = {"best": matmul_ceiling(jnp, 2048, c.hidden_size, c.intermediate_size, dtype),
             "at_shape": matmul_ceiling(jnp, batch, c.hidden_size, c.intermediate_size, dtype)}
    roof = decode_roofline(model, batch=batch, context=len(prompt) + new / 2,
                           bandwidth=bandwidth, rates=rates)
    steady = statistics.median(ours)
    return dict(batch=batch, new_tokens=new, ours_tps=toks / steady,
                hf_tps=toks / statistics.median(theirs), ratio=statistics.median(ratios),
                ratio_range=[min(ratios), max(ratios)], ours_s=ours, hf_s=theirs,
                first_call_s=first, compile_s=first - steady,
                matmul_gflops={k: v / 1e9 for k, v in rates.items()}, roofline=roof,
                # tokens/s over the roofline's: the roofline's time for `new` steps over ours
                # (ours includes the one-row prefill of a 32-token prompt)
                roofline_fraction=new * roof["step_s_best"] / steady,
                roofline_fraction_at_shape=new * roof["step_s_at_shape"] / steady)


def _branch_points(rng, length: int) -> list[int]:
    """Two random eligible positions at least MIN_GAP apart (the HDL score would pick them)."""
    hi = length - 1 - TAIL_GUARD
    first = int(rng.integers(1, hi + 1))
    for gap in (MIN_GAP, 1):  # the spec's fallback: relax the gap
        choices = [p for p in range(1, hi + 1) if abs(p - first) >= gap]
        if choices:
            return [first, int(rng.choice(choices))]
    return [first, first]


def hdl_rollout(model, params, prompts, *, slots: int, max_len: int, chunk: int, seed: int,
                new: int | None = None) -> dict:
    """Roots + continuations of every prompt through one engine; returns tokens, wall, the roots."""
    import jax
    from hindsight.sampling.engine import Engine

    engine = Engine(model, params, slots=slots, max_len=max_len, chunk_steps=chunk)
    rng = np.random.default_rng(seed)
    roots, tokens = {}, [0]
    for k, p in enumerate(prompts):
        engine.submit(p, num_samples=2, key=jax.random.key(seed * 1000 + k), keep_cache=True, tag=("root", k),
                      max_new_tokens=new)

    def on_result(tag, res):
        kind, k = tag
        if kind == "root":
            roots[k] = res
            tokens[0] += int(res.lengths.sum())
            pos = [q for r in range(2) for q in _branch_points(rng, int(res.lengths[r]))]
            engine.submit_branch(res, [0, 0, 1, 1], pos, [4, 3, 4, 3], key=jax.random.key(seed * 1000 + 500 + k),
                                 tag=("cont", k))
        else:
            tokens[0] += int((res.lengths - res.branch_positions).sum())

    t = time.perf_counter()
    engine.run(on_result)
    wall = time.perf_counter() - t
    return dict(tokens=tokens[0], wall_s=wall, roots=roots, engine=dict(engine.stats))


def independent_rollout(model, params, prompts, *, slots: int, max_len: int, chunk: int, seed: int,
                        new: int | None = None) -> dict:
    import jax
    from hindsight.sampling.engine import Engine

    engine = Engine(model, params, slots=slots, max_len=max_len, chunk_steps=chunk)
    for k, p in enumerate(prompts):
        engine.submit(p, num_samples=16, key=jax.random.key(seed * 1000 + k), tag=k, max_new_tokens=new)
    t = time.perf_counter()
    out = engine.run()
    wall = time.perf_counter() - t
    return dict(tokens=int(sum(r.lengths.sum() for r in out.values())), wall_s=wall,
                engine=dict(engine.stats))


def scoring_pass(model, tok, prompts, roots) -> float:
    """Re-score every root under a hindsight context (prompt + feedback); each context prefilled once."""
    from hindsight.sampling import score_logprobs

    feedback = tok(" Feedback on an earlier attempt: the answer was incomplete. Reflection: be specific.")["input_ids"]
    contexts = [list(p) + feedback for p in prompts]
    responses = [list(roots[k].tokens[r, : roots[k].lengths[r]]) for k in range(len(prompts)) for r in range(2)]
    times = []
    for _ in range(2):  # the first call compiles the scoring shapes; report the steady one
        t = time.perf_counter()
        np.asarray(score_logprobs(model, contexts, responses))
        times.append(time.perf_counter() - t)
    return times[-1]


def _warm_widths(model, params, prompt, *, slots: int, max_len: int, chunk: int) -> None:
    """Compile the decode chunk at every slot batch width an engine of ``slots`` can resize to
    (its default ``min_slots`` up to ``slots``): one short request per width."""
    import jax
    from hindsight.sampling.engine import Engine

    width = slots
    while width >= max(1, slots // 8):
        engine = Engine(model, params, slots=width, min_slots=width, max_len=max_len,
                        chunk_steps=chunk)
        engine.submit(prompt, num_samples=width, key=jax.random.key(0), max_new_tokens=2)
        engine.run()
        width //= 2


def hdl_comparison(model, tok, prompts, *, new: int, slots: int, chunk: int, reps: int) -> dict:
    """Independent samples and HDL trees, alternating, ``reps`` timed repetitions each after one
    untimed full-size warm-up of both (seed 99). Repetition r draws its own branch points (seed r),
    so each repetition's token saving is its own and its efficiency (wall-clock saving over token
    saving) pairs the two; ``compile_s`` per rollout is the compile time inside it (shapes the
    warm-up did not reach), which the wall-clock includes."""
    from experiments.bench import CompileClock
    from hindsight.sampling import SamplingParams
    from hindsight.sampling.buckets import cache_len_bucket

    clock = CompileClock()
    params = SamplingParams(max_new_tokens=new)
    max_len = cache_len_bucket(max(len(p) for p in prompts), new)
    kw = dict(slots=slots, max_len=max_len, chunk=chunk)
    # a full-size warm-up compiles the decode chunks, prefills, row moves and resizes that rollouts
    # of this shape reach, and a decode chunk at each slot batch width the engine can shrink to
    # (a tree's last rows decode at whichever width holds them; other branch points can still
    # reach another row-move bucket: compile_s)
    hdl_rollout(model, params, prompts, seed=99, **kw)
    independent_rollout(model, params, prompts, seed=99, **kw)
    _warm_widths(model, params, prompts[0], slots=slots, max_len=max_len, chunk=chunk)

    def timed(fn, seed):
        before = clock.seconds
        out = fn(model, params, prompts, seed=seed, **kw)
        out["compile_s"] = clock.seconds - before
        return out

    hdl, ind, score = [], [], []
    for r in range(reps):
        ind.append(timed(independent_rollout, r))
        h = timed(hdl_rollout, r)
        score.append(scoring_pass(model, tok, prompts, h.pop("roots")))
        hdl.append(h)
    token_savings = [1 - h["tokens"] / i["tokens"] for h, i in zip(hdl, ind)]
    ratios = [h["wall_s"] / i["wall_s"] for h, i in zip(hdl, ind)]
    efficiencies = [(1 - w) / t if t else None for w, t in zip(ratios, token_savings)]
    _log(f"HDL P={len(prompts)}: token savings {token_savings}, wall ratios {ratios}")
    token_saving = statistics.median(token_savings)
    wall_saving = 1 - statistics.median(ratios)
    return dict(prompts=len(prompts), new_tokens=new, slots=slots, chunk_steps=chunk,
                hdl_tokens=[h["tokens"] for h in hdl], indep_tokens=[i["tokens"] for i in ind],
                token_savings=token_savings, token_saving=token_saving,
                hdl_wall_s=[h["wall_s"] for h in hdl], indep_wall_s=[i["wall_s"] for i in ind],
                hdl_compile_s=[h["compile_s"] for h in hdl],
                indep_compile_s=[i["compile_s"] for i in ind],
                hdl_engine=hdl[0]["engine"], indep_engine=ind[0]["engine"],
                wall_ratio_range=[min(ratios), max(ratios)], wallclock_saving=wall_saving,
                # per repetition: its own wall-clock saving over its own token saving
                saving_efficiencies=efficiencies,
                saving_efficiency=(statistics.median(efficiencies)
                                   if all(e is not None for e in efficiencies) else None),
                hdl_tps=statistics.median(h["tokens"] / h["wall_s"] for h in hdl),
                indep_tps=statistics.median(i["tokens"] / i["wall_s"] for i in ind),
                scoring_s=statistics.median(score))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="CI size: B=16, P=8 (16 slots), 64 new tokens, 1 repetition")
    ap.add_argument("--variant", default="f32-scan", choices=["f32-scan", "f32-layers", "bf16-layers", "bf16-scan"])
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--prompts", type=int, default=None, help="P for the HDL comparison (>= 8)")
    ap.add_argument("--new", type=int, default=None, help="new tokens per row")
    ap.add_argument("--slots", type=int, default=None, help="engine slot batch (default 2 * prompts)")
    ap.add_argument("--chunk", type=int, default=8, help="decode steps between engine scheduling points")
    ap.add_argument("--skip-decode", action="store_true", help="skip (a), the HF comparison")
    ap.add_argument("--skip-hdl", action="store_true", help="skip (b), the HDL rollout comparison")
    args = ap.parse_args(argv)
    reps = args.reps or (1 if args.quick else 3)
    new = args.new or 64
    n_prompts = args.prompts or (8 if args.quick else 16)
    # 2 roots per prompt fill the slot batch exactly, so the roots phase is throughput-bound too
    slots = args.slots or 2 * n_prompts
    batches = [16] if args.quick else [16, 64]

    import jax
    import jax.numpy as jnp

    import hindsight.models as hm

    t = time.perf_counter()
    kwargs = _variant_kwargs(args.variant)
    dtype = kwargs.get("dtype", jnp.float32)
    model, tok = hm.load("smollm2-135m-instruct", **kwargs)
    load_s = time.perf_counter() - t
    prompts = _prompts(tok, n_prompts, 32)
    result = dict(model="smollm2-135m-instruct", variant=args.variant, quick=args.quick, reps=reps,
                  stop_tokens="off (every row runs to max_new_tokens)", load_s=load_s,
                  machine=dict(cpus=os.cpu_count(), platform=platform.platform(), jax=jax.__version__,
                               load_avg_start=os.getloadavg()))
    if not args.skip_decode:
        from experiments.bench import read_bandwidth

        hf = _load_hf(hm.resolve("smollm2-135m-instruct"))
        bandwidth = read_bandwidth(jnp)
        result["read_bandwidth_gbs"] = bandwidth / 1e9
        result["decode"] = [decode_throughput(model, hf, prompts[0], batch=b, new=new, reps=reps,
                                              bandwidth=bandwidth, dtype=dtype) for b in batches]
        del hf
    if not args.skip_hdl:
        result["hdl"] = hdl_comparison(model, tok, prompts, new=new, slots=slots, chunk=args.chunk, reps=reps)
        result["hdl_single_group"] = hdl_comparison(model, tok, prompts[:1], new=new, slots=16,
                                                    chunk=args.chunk, reps=reps)
    result["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
    result["machine"]["load_avg_end"] = os.getloadavg()
    if "decode" in result:
        result["decode_tps_ratio_vs_hf"] = min(d["ratio"] for d in result["decode"])
        for d in result["decode"]:
            b = d["batch"]
            result[f"decode_tps_ratio_vs_hf_b{b}"] = d["ratio"]
            result[f"roofline_fraction_b{b}"] = d["roofline_fraction"]
            result[f"roofline_fraction_at_shape_b{b}"] = d["roofline_fraction_at_shape"]
        result["compile_s"] = max(d["compile_s"] for d in result["decode"])
    if "hdl" in result:
        result["hdl_token_saving"] = result["hdl"]["token_saving"]
        result["hdl_saving_efficiency"] = result["hdl"]["saving_efficiency"]
        # signed: a tree slower than the independent samples reports a negative saving
        result["hdl_wallclock_saving"] = result["hdl"]["wallclock_saving"]
        result["hdl_wallclock_saving_range"] = [1 - r for r in
                                                reversed(result["hdl"]["wall_ratio_range"])]
    print(json.dumps(result, default=float))


if __name__ == "__main__":
    main()
