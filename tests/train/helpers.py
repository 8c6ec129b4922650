"""Tiny model, GRPO loss and batches shared by the train tests (and their subprocess scripts)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import hindsight as hs
from hindsight.models.config import ModelConfig
from hindsight.models.decoder import Decoder
from hindsight.objectives import Loss, Term, aggregate, group_advantages, policy_loss, term

VOCAB, SEQ, PROMPT, GROUP = 64, 12, 4, 4

TINY = ModelConfig(family="llama", vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                   num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, tie_embeddings=False)


def tiny_model(seed: int = 0) -> Decoder:
    """The real hindsight decoder with a tiny config (fp32); every dim divides a 2-way axis."""
    return Decoder(TINY, rngs=nnx.Rngs(seed))


class TinyMLPLM(nnx.Module):
    """A 2-layer MLP LM with the decoder's call shape; compiles in a fraction of the decoder's time.

    Each position sees its own token plus a causal running mean of the previous embeddings, so
    the loss still mixes positions (as attention does) while staying tiny.
    """

    def __init__(self, *, vocab: int = VOCAB, dim: int = 16, seed: int = 0):
        rngs = nnx.Rngs(seed)
        self.embed = nnx.Embed(vocab, dim, rngs=rngs)
        self.hidden = nnx.Linear(2 * dim, dim, rngs=rngs)
        self.out = nnx.Linear(dim, vocab, rngs=rngs)

    def __call__(self, tokens, positions, *, cache=None, attention_mask=None, return_hidden=False):
        e = self.embed(tokens)
        context = jnp.cumsum(e, axis=1) / (positions[..., None] + 1.0)
        h = jnp.tanh(self.hidden(jnp.concatenate([e, context], axis=-1)))
        return (h if return_hidden else self.out(h)), cache


def model_rules(mesh):
    """The models package's partition rules, through the train engine's adapter."""
    from hindsight.train.mesh import model_rules as rules
    return rules(mesh)


def grpo_loss(model, batch, *, mode: str = "token-mean", norm: float | None = None,
              kl_coef: float = 0.0, reference=None, aux_weight: float = 0.0):
    """GRPO loss on a teacher-forced batch: terms ``policy`` (and ``aux``: the mean response
    entropy per row, a term whose count is the number of rows, so the step must divide two terms
    by different counts).

    batch: ``tokens``/``positions``/``mask`` ``[B, S]`` (mask = 1 on response tokens),
    ``logp_old`` ``[B, S-1]``, ``advantages`` ``[B]``.
    """
    tokens = batch["tokens"]
    logits, _ = model(tokens, batch["positions"])
    logits = logits[:, :-1]
    targets, mask = tokens[:, 1:], batch["mask"][:, 1:]
    logp = hs.ops.token_logprobs(logits, targets)
    logp_ref = None
    if reference is not None:
        ref_logits, _ = reference(tokens, batch["positions"])
        logp_ref = hs.ops.token_logprobs(ref_logits[:, :-1], targets)
    total, count, metrics = policy_loss(logp, batch["logp_old"], batch["advantages"], mask,
                                        mode=mode, norm=norm, logp_ref=logp_ref, kl_coef=kl_coef)
    entropy = hs.ops.entropy(logits)
    metrics["entropy"] = aggregate(jax.lax.stop_gradient(entropy), mask)
    terms = {"policy": Term(total, count, mode=mode)}
    if aux_weight:
        terms["aux"] = term(entropy, mask, mode="seq-mean-token-mean", weight=aux_weight)
    return Loss(terms, metrics)


def make_batch(batch_size: int, *, seed: int = 0, seq: int = SEQ, vocab: int = VOCAB) -> dict:
    """A random GRPO batch as host NumPy arrays (groups of ``GROUP`` contiguous rows)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (batch_size, seq), dtype=np.int32)
    positions = np.broadcast_to(np.arange(seq, dtype=np.int32), (batch_size, seq)).copy()
    lengths = rng.integers(1, seq - PROMPT + 1, batch_size)
    col = np.arange(seq)[None]
    mask = ((col >= PROMPT) & (col < PROMPT + lengths[:, None])).astype(np.float32)
    mask[0] = 0.0  # an all-masked row must be harmless
    logp_old = (-np.log(vocab) + 0.3 * rng.standard_normal((batch_size, seq - 1))).astype(np.float32)
    rewards = rng.integers(0, 2, batch_size).astype(np.float32)
    adv = np.asarray(group_advantages(jnp.asarray(rewards), GROUP))
    return {"tokens": tokens, "positions": positions, "mask": mask, "logp_old": logp_old,
            "advantages": adv.astype(np.float32)}


def flat(tree) -> dict[str, np.ndarray]:
    """Path -> host array, for comparing param/grad trees across meshes and processes."""
    from hindsight.train.mesh import path_str
    return {path_str(p): np.asarray(jax.device_get(x))
            for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def max_rel_err(a: dict, b: dict) -> float:
    """Max over leaves of the relative error ``||a - b|| / ||b||`` (L2 norms, float64)."""
    assert a.keys() == b.keys()
    return max(float(np.linalg.norm((a[k].astype(np.float64) - b[k]).ravel())
                     / (np.linalg.norm(b[k].astype(np.float64).ravel()) + 1e-30)) for k in a)


def sgd_step(model, mesh, *, batch_size: int = 16, num_microbatches: int = 2, loss_fn=None):
    """``(state, step)`` for a GRPO step with SGD + momentum + global-norm clipping on ``mesh``.

    SGD keeps the update Lipschitz in the gradient, so updated params can be compared at 1e-5
    across meshes. (Adam's first update, ``lr * g / (|g| + eps)`` per element, maps gradient
    elements at the fp32 reassociation noise floor, ~1e-6 of a leaf's largest, to O(lr) updates of
    arbitrary sign; the gradients themselves are compared directly instead.)
    """
    import hindsight.train as ht
    tx = ht.make_optimizer(ht.OptimConfig(name="sgd", learning_rate=1.0, momentum=0.9,
                                          max_grad_norm=0.05))
    state, shardings, model_def = ht.create_train_state(model, tx, mesh=mesh,
                                                        rules=model_rules(mesh))
    step = ht.make_train_step(loss_fn or grpo_loss, model_def=model_def, optimizer=tx, mesh=mesh,
                              shardings=shardings, max_grad_norm=0.05,
                              config=ht.StepConfig(batch_size=batch_size,
                                                   num_microbatches=num_microbatches))
    return state, step


def rows_for(records: list[dict], table: dict) -> dict:
    """The train rows of a data batch: record ``{"id": i}`` selects row ``i`` of ``table``
    (a :func:`make_batch` result); stands in for rollout in the data-driven tests."""
    ids = np.asarray([r["id"] for r in records])
    return {k: v[ids] for k, v in table.items()}


def build_model(seed: int = 0):
    """:func:`tiny_model` built under ``nnx.jit`` (eager NNX construction is slow)."""
    return nnx.jit(lambda: tiny_model(seed))()


def subprocess_env(num_devices: int) -> dict:
    """Environment for a child JAX process with ``num_devices`` forced CPU devices.

    XLA reads the flag at backend start-up, so it must be set before the child imports jax; the
    parent (the pytest worker) keeps its single device.
    """
    import os
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={num_devices}"])
    env["JAX_PLATFORMS"] = "cpu"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_script(module: str, *args: str, num_devices: int = 1, timeout: float = 300.0) -> dict:
    """Run ``python -m module args`` in a fresh process; return the JSON of its last stdout line."""
    import json
    import subprocess
    import sys
    env = subprocess_env(num_devices)
    proc = subprocess.run([sys.executable, "-m", module, *args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=env["PYTHONPATH"].split(":")[0])
    if proc.returncode:
        raise AssertionError(f"{module} failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def step_records(run_dir: str) -> list[dict]:
    """The training steps' records of a run's ``metrics.jsonl`` (evaluation-only lines left out)."""
    import json
    import os
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [r for r in map(json.loads, f) if "loss" in r]


def trained_params(run_dir: str) -> tuple[int, list[np.ndarray]]:
    """``(step, params as host arrays)`` of a run's latest checkpoint."""
    from hindsight.train.loop import trained_policy
    model, _, step = trained_policy(run_dir)
    return step, [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]
