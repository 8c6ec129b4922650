"""A method plugs into :func:`hindsight.train.make_train_step` as is: CRAFT's loss gets the
reference and its controller state, its three named terms are divided by their own counts, and
the controller is updated from the step's metrics at the rollout boundary."""
import numpy as np

import hindsight.train as ht
from hindsight.methods import RolloutShape, get_method


def test_craft_in_the_train_step(models, batch):
    craft = get_method("craft").configure(rollout=RolloutShape(group_size=4))
    mesh = ht.make_mesh(ht.MeshConfig(data=-1))
    tx = ht.make_optimizer(ht.OptimConfig(name="sgd", learning_rate=0.1))
    state, shardings, model_def = ht.create_train_state(
        models[0], tx, mesh=mesh, reference="frozen", method_state=craft.init_state(craft.config))
    step = ht.make_train_step(
        craft.loss_fn, model_def=model_def, optimizer=tx, mesh=mesh, shardings=shardings,
        config=ht.StepConfig(batch_size=8, num_microbatches=2, group_size=4, reference="frozen"),
        loss_kwargs={"config": craft.config})
    lam = float(state.method_state.lam)  # the step donates the state
    new, metrics = step(state, {k: np.asarray(v) for k, v in batch.items()})
    assert np.isfinite(float(metrics["loss"]))
    tokens = float(np.asarray(batch["mask"]).sum())
    for name in ("policy", "distill", "kl"):
        assert float(metrics[f"count/{name}"]) == tokens, name
    np.testing.assert_allclose(float(metrics["weight/distill"]), lam)
    want = sum(float(metrics[f"weight/{n}"]) * float(metrics[f"loss/{n}"])
               for n in ("policy", "distill", "kl"))
    np.testing.assert_allclose(float(metrics["loss"]), want, rtol=1e-6)
    after = craft.update(new.method_state, metrics)
    assert float(after.ema) != 0.5
