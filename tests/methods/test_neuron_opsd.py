"""Neuron-OPSD's teacher (other-methods §8 step 5): the EMA of the student at tau = 0.01 that
``configs/neuron_opsd.py`` sets, through the train step's update (spec: theta_bar = 1, theta = 2
gives 1.01), and the loss's gradient reaching the student only."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import hindsight.train as ht
from hindsight.methods import LMHead, get_method
from hindsight.testing import make_batch, tiny_model
from tests.train.helpers import TinyMLPLM, grpo_loss, make_batch as mlp_batch


def test_ema_teacher_spec_number():
    import configs.neuron_opsd
    from hindsight.train.experiment import resolve
    train = resolve(configs.neuron_opsd.get_config("tiny"), num_devices=1,
                    process_count=1).config.train
    mesh = ht.make_mesh(ht.MeshConfig())
    tx = optax.set_to_zero()  # the params stay at 2: only the EMA moves
    state, shardings, model_def = ht.create_train_state(TinyMLPLM(), tx, mesh=mesh,
                                                        reference="ema")
    state = state.replace(params=jax.tree.map(lambda p: jnp.full_like(p, 2.0), state.params),
                          reference=jax.tree.map(lambda p: jnp.full_like(p, 1.0), state.reference))
    step = ht.make_train_step(
        lambda model, batch, *, reference: grpo_loss(model, batch),
        model_def=model_def, optimizer=tx, mesh=mesh, shardings=shardings,
        config=ht.StepConfig(batch_size=8, reference=train.reference, ema_decay=train.ema_decay))
    state, _ = step(state, mlp_batch(8, seed=0))
    for leaf in jax.tree.leaves(state.reference):
        np.testing.assert_allclose(np.asarray(leaf), 1.01, rtol=1e-6)


def test_gradient_reaches_the_student_only():
    """The teacher (the reference model) gets no gradient; the student does."""
    method = get_method("neuron_opsd")
    policy, reference = tiny_model(0), tiny_model(1)
    batch = make_batch(policy)

    def loss(models):
        student, teacher = models
        return method.loss_fn(student, batch, head=LMHead(chunk_size=20),
                              reference=teacher).value()

    grads = nnx.jit(nnx.grad(loss))(nnx.List([policy, reference]))
    student = jax.tree.leaves(nnx.state(grads[0], nnx.Param))
    teacher = jax.tree.leaves(nnx.state(grads[1], nnx.Param))
    assert sum(float(jnp.abs(g).sum()) for g in student) > 0
    assert all(float(jnp.abs(g).sum()) == 0 for g in teacher)
