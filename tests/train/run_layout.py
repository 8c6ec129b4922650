"""Child process (8 forced CPU devices): every registered method's train-step loss and gradient
on a fixed batch of B = 32 rows in groups of G = 8 (mixed rewards), split into 1 or 2 PPO
mini-batches and 1, 2 or 4 micro-batches, on 2 devices (data=2) and on 8 (data=2, fsdp=2,
tensor=2), against the single-device, single-micro-batch step on the same mini-batch.

``METHOD...`` names the methods and ``--full`` runs every combination (else the most split one per
device count). Prints one JSON line: per method and combination the loss and gradient relative
errors, or the refusal message of a layout the method cannot take (a loss that couples the rows of
a group needs whole groups in every micro-batch).
"""
import json
import sys

import jax
import numpy as np

import hindsight.train as ht
from hindsight.methods import LMHead, RolloutShape, get_method
from hindsight.testing import make_batch, tiny_model
from tests.train.helpers import flat, max_rel_err

ROWS, GROUP = 32, 8
MESHES = {1: ht.MeshConfig(data=1), 2: ht.MeshConfig(data=2),
          8: ht.MeshConfig(data=2, fsdp=2, tensor=2)}
HEAD = LMHead(chunk_size=16)


def configured(name: str):
    """Method ``name`` configured for the batch's groups of 8 rows (an HDL tree of 2 roots x
    (1 + 2 + 1) rows is a group of 8)."""
    tree = get_method(name).rollout == "hdl_tree"
    return get_method(name).configure(
        {"counts": (2, 1)} if tree else {},
        rollout=RolloutShape(group_size=None if tree else GROUP, max_new_tokens=6))


def step_for(method, model, mesh, rows, micro, packing=False, external_teacher=None):
    tx = ht.make_optimizer(ht.OptimConfig(name="sgd", learning_rate=0.1, max_grad_norm=None))
    reference = "frozen" if method.config.needs_reference else None
    state = method.init_state(method.config) if method.init_state else None
    state, shardings, model_def = ht.create_train_state(
        model, tx, mesh=mesh, rules=ht.model_rules(mesh), reference=reference,
        method_state=state)
    step = ht.make_train_step(
        method.loss_fn, model_def=model_def, optimizer=tx, mesh=mesh, shardings=shardings,
        config=ht.StepConfig(batch_size=rows, num_microbatches=micro, reference=reference,
                             group_size=method.group_size if method.couples_rows else None,
                             packing=packing),
        loss_kwargs={"config": method.config}, head=HEAD, external_teacher=external_teacher)
    return state, step


def grads_of(method, model, mesh, minis, micro, packing=False):
    """``[(loss, grads)]`` of each mini-batch, from one compiled step (they share shapes)."""
    state, step = step_for(method, model, mesh, len(minis[0]["targets"]), micro, packing)
    out = []
    for batch in minis:
        grads, metrics = step.grads(state, batch)
        out.append((float(metrics["loss"]), flat(grads)))
    return out


def main():
    names = [a for a in sys.argv[1:] if not a.startswith("--")]
    full = "--full" in sys.argv
    packing = "--packed" in sys.argv  # every layout's step on packed rows
    assert jax.device_count() == 8, jax.devices()
    model = tiny_model(0)
    batch = {k: np.asarray(v) for k, v in make_batch(model, groups=ROWS // GROUP,
                                                     group_size=GROUP, seed=3).items()}
    combos = ([(d, k, m) for d in (2, 8) for k in (1, 2) for m in (1, 2, 4)] if full
              else [(2, 1, 2), (8, 2, 4)])
    if packing:
        combos = [(1, 1, 1)] + combos
    single = ht.make_mesh(ht.MeshConfig(data=1), devices=jax.devices()[:1])
    out = {}
    for name in names:
        method = configured(name)
        minis = {k: [{key: v[i * ROWS // k:(i + 1) * ROWS // k] for key, v in batch.items()}
                     for i in range(k)] for k in (1, 2)}
        refs = {k: grads_of(method, model, single, minis[k], 1) for k in (1, 2)}
        res = out[name] = {"credit": None}
        for devices, k, micro in combos:
            mesh = ht.make_mesh(MESHES[devices], devices=jax.devices()[:devices])
            label = f"d{devices}-k{k}-m{micro}"
            try:
                got = grads_of(method, model, mesh, minis[k], micro, packing)
            except ValueError as e:
                res[label] = {"refused": str(e)}
                continue
            res[label] = {
                "loss_rel": max(abs(g[0] - r[0]) / max(abs(r[0]), 1e-30)
                                for g, r in zip(got, refs[k])),
                "grads_rel": max(max_rel_err(g[1], r[1]) for g, r in zip(got, refs[k])),
                "grad_norm": max(float(np.sqrt(sum(np.sum(x.astype(np.float64) ** 2)
                                                   for x in r[1].values()))) for r in refs[k])}
        if name == "craft":  # the sibling credit is not zero on this batch
            state, step = step_for(method, model, single, ROWS, 1)
            res["credit"] = float(step.grads(state, batch)[1]["credit_abs"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
