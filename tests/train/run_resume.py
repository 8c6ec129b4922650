"""Child process for the kill-and-resume test (8 forced CPU devices).

``full DIR N``: train N steps on mesh data=8 from the grain iterator, checkpointing at N/2;
writes the losses, the params at N/2 and the final params to ``DIR/full.npz``.
``resume DIR N MESH...``: in a fresh process, for each mesh (``d8``, ``d2f2t2``) restore the
N/2 checkpoint onto that mesh and train to N; writes ``DIR/resume_<mesh>.npz``.
The loss draws a token subsample from the step RNG and keeps an EMA reference and a method
state, so data order, RNG, reference and method state all have to be restored for equality.
"""
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

import hindsight.train as ht
from tests.train.helpers import build_model, flat, grpo_loss, make_batch, model_rules, rows_for

MESHES = {"d8": ht.MeshConfig(data=8), "d2f2t2": ht.MeshConfig(data=2, fsdp=2, tensor=2)}
RECORDS = [{"id": i} for i in range(40)]
TABLE = make_batch(40, seed=3)
DATA = ht.DataConfig(batch_size=16, seed=7)
STEP = ht.StepConfig(batch_size=16, num_microbatches=2, reference="ema", ema_decay=0.9)
OPTIM = ht.OptimConfig(learning_rate=1e-3, schedule="cosine", warmup_steps=1, total_steps=8)
METHOD_STATE = {"loss_ema": jnp.float32(0.0)}


def loss_fn(model, batch, *, rng, reference):
    keep = jax.vmap(lambda k: jax.random.bernoulli(k, 0.8, batch["mask"].shape[1:]))(rng)
    return grpo_loss(model, dict(batch, mask=batch["mask"] * keep), reference=reference,
                     kl_coef=0.01)


def method_update(method_state, metrics):
    return {"loss_ema": 0.5 * method_state["loss_ema"] + 0.5 * metrics["loss"]}


def setup(mesh_name, model):
    mesh = ht.make_mesh(MESHES[mesh_name])
    tx = ht.make_optimizer(OPTIM)
    state, shardings, model_def = ht.create_train_state(
        model, tx, mesh=mesh, rules=model_rules(mesh), seed=11, reference=STEP.reference,
        method_state=METHOD_STATE)
    step = ht.make_train_step(loss_fn, model_def=model_def, optimizer=tx, mesh=mesh,
                              shardings=shardings, config=STEP)
    abstract = ht.abstract_train_state(state.params, tx, reference=STEP.reference,
                                       method_state=METHOD_STATE)
    return mesh, state, shardings, step, abstract


def train(state, step, mesh, it, ckpt, first, last, out):
    for s in range(first, last):
        if ckpt is not None and ckpt.save(s, state, data_iterator=it, meta={"step": s}):
            out["mid"] = flat(state)
        state, metrics = step(state, rows_for(next(it), TABLE))
        # What the loop does at a step boundary: the method state follows the step's metrics.
        state = state.replace(method_state=method_update(state.method_state, metrics))
        out.setdefault("losses", []).append(float(metrics["loss"]))
    out["final"] = flat(state)
    return state


def save(path, out):
    arrays = {"losses": np.asarray(out["losses"], np.float64)}
    for key in ("mid", "final", "restored"):
        arrays.update({f"{key}:{k}": v for k, v in out.get(key, {}).items()})
    np.savez(path, **arrays)


def main():
    mode, directory, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    model = build_model(0)
    ckpt = ht.Checkpointer(ht.CheckpointConfig(directory=f"{directory}/ckpt", save_every=n // 2,
                                               async_save=True))
    if mode == "full":
        mesh, state, _, step, _ = setup("d8", model)
        out = {}
        train(state, step, mesh, ht.make_data_iterator(DATA, RECORDS), ckpt, 0, n, out)
        ckpt.close()
        save(f"{directory}/full.npz", out)
    else:
        for name in sys.argv[4:]:
            mesh, _, shardings, step, abstract = setup(name, model)
            it = ht.make_data_iterator(DATA, RECORDS)
            state, meta = ckpt.restore(abstract, shardings, data_iterator=it)
            out = {"restored": flat(state)}
            train(state, step, mesh, it, None, meta["step"], n, out)
            save(f"{directory}/resume_{name}.npz", out)
        ckpt.close()
    print(json.dumps({"mode": mode, "ok": True}))


if __name__ == "__main__":
    main()
