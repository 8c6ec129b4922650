"""`make demo` (interim main job): every credit signal on random logits, printed as a table.

Replaced by the GRPO-vs-HDL run on the embedded model once the sampling and training layers land.
Run: ``python -m experiments.demo [--batch 8 --group 4 --length 24 --vocab 512 --seed 0]``.
"""
from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

import hindsight as hs


def _random_inputs(key, *, batch: int, length: int, vocab: int):
    ks = jax.random.split(key, 6)
    student = jax.random.normal(ks[0], (batch, length, vocab)) * 2.0
    # Teacher / probe / base are perturbations of the student: realistic small disagreements.
    teacher = student + jax.random.normal(ks[1], student.shape) * 1.0
    probe = student + jax.random.normal(ks[2], student.shape) * 1.0
    base = student + jax.random.normal(ks[3], student.shape) * 0.5
    tokens = jax.random.categorical(ks[4], student)
    lengths = jax.random.randint(ks[5], (batch,), length // 2, length + 1)
    mask = jnp.arange(length)[None, :] < lengths[:, None]
    return student, teacher, probe, base, tokens, mask


def _stats(name: str, values, mask) -> dict:
    v = np.asarray(values, np.float64)
    m = np.broadcast_to(np.asarray(mask, bool), v.shape)
    sel = v[m]
    return {"signal": name, "shape": list(v.shape), "mean": float(sel.mean()), "min": float(sel.min()),
            "max": float(sel.max()), "finite": bool(np.isfinite(v).all())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--length", type=int, default=24)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    t0 = time.perf_counter()
    student, teacher, probe, base, tokens, mask = _random_inputs(
        jax.random.PRNGKey(a.seed), batch=a.batch, length=a.length, vocab=a.vocab)
    # Mixed-outcome groups (half the rows of each group correct), so group advantages are non-zero.
    rewards = jax.random.permutation(jax.random.PRNGKey(a.seed + 1),
                                     (jnp.arange(a.batch) % 2).astype(jnp.float32).reshape(-1, a.group),
                                     axis=1, independent=True).reshape(-1)
    adv = hs.objectives.group_advantages(rewards, a.group)
    sig = hs.signals
    hd = jax.jit(sig.hindsight_divergence)(student, teacher, tokens, mask)
    rows = [
        _stats("hindsight_divergence (HDL)", hd, mask),
        _stats("persistence_gate (PCSD)", jax.jit(sig.persistence_gate)(teacher, student, tokens, mask), mask),
        _stats("counterfactual_credit (CRAFT)",
               jax.jit(sig.counterfactual_credit, static_argnums=5)(teacher, student, tokens, mask, adv, a.group),
               mask),
        _stats("pmi_target (OPSD-PMI), max |sum q - 1|",
               jnp.abs(jnp.exp(jax.jit(sig.pmi_target)(teacher, probe, base)).sum(-1) - 1), mask),
    ]
    log_q, alpha = jax.jit(sig.barycenter_target)(teacher, student)
    rows.append(_stats("barycenter alpha (DemoPSD)", alpha, mask))
    rows.append(_stats("barycenter_target, max |sum q - 1|", jnp.abs(jnp.exp(log_q).sum(-1) - 1), mask))
    picks = sig.select_branch_points(hd, mask, num_points=2, min_gap=3, tail_guard=2)
    width = max(len(r["signal"]) for r in rows)
    print(f"{'signal':<{width}}  {'shape':<14} {'mean':>9} {'min':>9} {'max':>9}  finite")
    for r in rows:
        print(f"{r['signal']:<{width}}  {str(r['shape']):<14} {r['mean']:9.4f} {r['min']:9.4f} {r['max']:9.4f}  {r['finite']}")
    print(f"HDL branch points per row (K=2, -1 = none): {np.asarray(picks).tolist()}")
    print(json.dumps({"rows": rows, "seconds": round(time.perf_counter() - t0, 2)}))


if __name__ == "__main__":
    main()
