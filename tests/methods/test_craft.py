"""CRAFT's pillar switches and controller."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hindsight.methods import RolloutShape, context_hidden, get_method
from hindsight.methods.policy_gradient import policy_rows, surrogate_terms
from hindsight.objectives import Loss, Term
from hindsight.signals import reverse_k3

OFF = dict(group_size=4, cti=False, controller=False, polarise=False)


def _value_and_grad(loss, model, reference, batch):
    @nnx.jit
    def program(model, reference, batch):
        def value(m):
            out = loss(m, reference, batch)
            return out.value(), out.value()
        return nnx.value_and_grad(value, has_aux=True)(model)

    (_, total), grads = program(model, reference, batch)
    return np.asarray(total), [np.asarray(g) for g in jax.tree.leaves(nnx.state(grads, nnx.Param))]


def sdar_baseline(config):
    """Spec §4's baseline written out: GRPO + lambda_0 * SDAR's gated distillation
    (``sg(g) (sg(logp_T) - logp_S)``, ``g = sigmoid(beta D)``) + mu_0 * reverse k3 to the
    reference, token means."""
    def loss(model, reference, batch):
        teacher = context_hidden(model, batch, "teacher", frozen=True)
        rows = policy_rows(model, batch, config, reference=reference, teacher=teacher)
        terms, _ = surrogate_terms(rows, batch, config)
        count = terms["policy"].count
        valid = jnp.asarray(batch["mask"]) > 0
        gap = jax.lax.stop_gradient(rows["teacher_logp"] - rows["logp"])
        gate = jax.nn.sigmoid(config.beta_gate * jnp.where(valid, gap, 0.0))
        g = jax.lax.stop_gradient(jnp.where(valid, gate, 0.0))
        ls = jnp.where(valid, rows["logp"], 0.0)
        teacher = jax.lax.stop_gradient(jnp.where(valid, gap, 0.0) + ls)
        distill = jnp.sum(jnp.where(valid, g * (teacher - ls), 0.0))
        kl = jnp.sum(jnp.where(valid, reverse_k3(rows["logp"], rows["ref_logp"], valid), 0.0))
        terms["distill"] = Term(distill, count, config.lambda_0)
        terms["kl"] = Term(kl, count, config.mu_0)
        return Loss(terms)
    return loss


def test_all_pillars_off_is_the_baseline_bit_for_bit(models, batch):
    craft = get_method("craft")
    config = craft.make_config(**OFF)
    got = _value_and_grad(lambda m, r, b: craft.loss_fn(m, b, config=config, reference=r),
                          *models, batch)
    want = _value_and_grad(sdar_baseline(config), *models, batch)
    np.testing.assert_array_equal(got[0], want[0])
    for g, w in zip(got[1], want[1]):
        np.testing.assert_array_equal(g, w)


def test_controller_update_from_metrics():
    craft = get_method("craft")
    config = craft.config
    state = craft.init_state(config)
    np.testing.assert_allclose([state.ema, state.lam, state.mu], [0.5, 0.01, 0.001], rtol=1e-6)
    # Spec §4 test 4: 6 of 7 valid tokens active.
    new = craft.configure(rollout=RolloutShape(group_size=8)).update(
        state, {"credit_activity": jnp.float32(6 / 7)})
    np.testing.assert_allclose([new.ema, new.lam, new.mu], [0.535714, 0.010364, 0.000931],
                               rtol=2e-4)
    off = craft.make_config(controller=False)
    assert craft.update_state(state, {}, off) is state
    assert get_method("grpo").update_state is None
