"""A method plugs into :func:`hindsight.train.make_train_step` as is: CRAFT's loss gets the
reference and its controller state, and the controller is updated from the step's metrics."""
import numpy as np

import hindsight.train as ht
from hindsight.methods import get_method
from hindsight.train.mesh import shard_batch


def test_craft_in_the_train_step(models, batch):
    craft = get_method("craft")
    config = craft.make_config(group_size=4)
    mesh = ht.make_mesh(ht.MeshConfig(data=-1))
    tx = ht.make_optimizer(ht.OptimConfig(name="sgd", learning_rate=0.1))
    state, shardings, model_def = ht.create_train_state(
        models[0], tx, mesh=mesh, reference="frozen", method_state=craft.init_state(config))
    step = ht.make_train_step(
        craft.loss_fn, model_def=model_def, optimizer=tx, mesh=mesh, shardings=shardings,
        config=ht.StepConfig(batch_size=8, num_microbatches=2, reference="frozen"),
        loss_kwargs={"config": config}, method_update=craft.method_update(config))
    new, metrics = step(state, shard_batch({k: np.asarray(v) for k, v in batch.items()}, mesh))
    assert np.isfinite(float(metrics["loss"])) and float(metrics["count"]) == batch["mask"].sum()
    want = craft.update_state(craft.init_state(config), metrics, config)
    np.testing.assert_allclose(np.asarray(new.method_state), np.asarray(want), rtol=1e-6)
    assert float(new.method_state.ema) != 0.5
