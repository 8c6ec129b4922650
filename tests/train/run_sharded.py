"""Child process: one GRPO train step on several meshes of 8 forced CPU devices vs one device.

Prints one JSON line: the max relative errors of loss, gradients and updated params of each
mesh against the single-device step, and the sharding actually used for one weight.
"""
import json

import jax

import hindsight.train as ht
from hindsight.train.mesh import path_str
from tests.train.helpers import build_model, flat, make_batch, max_rel_err, sgd_step

MESHES = {"single": ht.MeshConfig(data=1), "d2f2t2": ht.MeshConfig(data=2, fsdp=2, tensor=2),
          "d8": ht.MeshConfig(data=8)}


def run(mesh_cfg, model, batch, *, devices):
    mesh = ht.make_mesh(mesh_cfg, devices=devices)
    state, step = sgd_step(model, mesh)
    grads, metrics = step.grads(state, batch)
    spec = state.params["layers"]["attn"]["q_proj"]["kernel"].sharding.spec
    # The optimizer's copy of q_proj (SGD momentum) is sharded like the parameter.
    opt_specs = {str(x.sharding.spec) for p, x in jax.tree_util.tree_flatten_with_path(
        state.opt_state)[0] if path_str(p).endswith("layers/attn/q_proj/kernel")}
    assert opt_specs == {str(spec)}, (opt_specs, spec)
    state, step_metrics = step(state, batch)
    return (float(metrics["loss"]), flat(grads), flat(state.params),
            {k: float(v) for k, v in step_metrics.items()}, str(spec))


def main():
    assert jax.device_count() == 8, jax.devices()
    model, batch = build_model(0), make_batch(16, seed=1)
    results = {name: run(cfg, model, batch, devices=jax.devices()[:1] if name == "single"
                         else jax.devices()) for name, cfg in MESHES.items()}
    loss0, grads0, params0, metrics0, _ = results["single"]
    out = {"loss": loss0, "metrics": metrics0}
    for name in ("d2f2t2", "d8"):
        loss, grads, params, metrics, spec = results[name]
        out[name] = {"loss_rel": abs(loss - loss0) / abs(loss0),
                     "grads_rel": max_rel_err(grads, grads0),
                     "params_rel": max_rel_err(params, params0),
                     "metrics_rel": max(abs(metrics[k] - metrics0[k]) / max(abs(metrics0[k]), 1e-30)
                                        for k in metrics0),
                     "q_proj_spec": spec}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
