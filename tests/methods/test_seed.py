"""SEED's loss (other-methods §11): the spec's numbers through the method's ``L_OPD``, its
gradient ``-g`` on ``l_ord`` and none on ``l_skill``, an independent float64 reference with the
kit's mask patterns, and the whole loss leaving the rows without a skill out of ``distill`` only.
(The loss on a real decoder against a dense float64 reference is in ``test_losses.py``.)"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hindsight.testing as hst
from hindsight.methods import LMHead, get_method
from hindsight.methods.seed import opd_loss


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow


def opd_reference(skill_logprobs, ordinary_logprobs, mask, *, beta):
    """Float64 NumPy: ``g = sigmoid(beta (l_skill - l_ord))``, loss ``sum g (l_skill - l_ord)``
    over the mask and its count; the gate 0 where masked."""
    m = np.asarray(mask) > 0
    delta = np.where(m, skill_logprobs - ordinary_logprobs, 0.0)
    gate = np.where(m, _sigmoid(beta * delta), 0.0)
    return (np.sum(gate * delta), float(m.sum())), gate


def test_the_spec_numbers_and_the_gradient_on_l_ord():
    delta = jnp.array([[0.8, 0.0, -0.6]], jnp.float32)
    ordinary = jnp.array([[-1.3, -0.2, -2.0]], jnp.float32)
    skill = ordinary + delta
    mask = jnp.ones((1, 3))
    (total, count), gate = opd_loss(skill, ordinary, mask, beta=5.0)
    np.testing.assert_allclose(np.asarray(gate)[0], [0.9820, 0.5, 0.0474], atol=5e-5)
    per_token = [float(opd_loss(skill, ordinary, jnp.eye(3)[t][None], beta=5.0)[0][0])
                 for t in range(3)]
    np.testing.assert_allclose(per_token, [0.7856, 0.0, -0.0285], atol=5e-5)
    np.testing.assert_allclose(float(total), 0.7856 - 0.0285, atol=1e-4)
    assert float(count) == 3.0
    grad_ord, grad_skill = jax.grad(lambda o, s: opd_loss(s, o, mask, beta=5.0)[0][0],
                                    argnums=(0, 1))(ordinary, skill)
    np.testing.assert_allclose(np.asarray(grad_ord), -np.asarray(gate), rtol=1e-6)
    assert not np.any(np.asarray(grad_skill))  # the teacher and the gate are stop-gradient


@pytest.mark.parametrize("beta", [5.0, 1.5])
def test_opd_loss_against_a_float64_reference(beta):
    hst.check_signal(opd_loss, opd_reference, kwargs=dict(beta=beta),
                     inputs=dict(skill_logprobs=hst.LOGPROBS, ordinary_logprobs=hst.LOGPROBS,
                                 mask=hst.MASK),
                     stop_gradient=("skill_logprobs",))


def test_rows_without_a_skill_leave_the_distill_term_only(models, batch):
    """``teacher_row_mask`` 0 on a row takes it out of ``distill`` (sum and count) and keeps it in
    ``policy``; with no skill anywhere the term is 0 over a count of 0, and the loss finite."""
    method = get_method("seed")
    config = method.make_config(lambda_opd=1.0)
    head = LMHead(chunk_size=20)
    model, _ = models
    rows = np.asarray(batch["targets"]).shape[0]

    @nnx.jit
    def terms(model, batch):
        out = method.loss_fn(model, batch, config=config, head=head)
        return out.terms, out.value()

    every, _ = terms(model, dict(batch, teacher_row_mask=np.ones(rows, np.float32)))
    some = np.ones(rows, np.float32)
    some[[2, 5]] = 0.0
    partial, _ = terms(model, dict(batch, teacher_row_mask=some))
    none, value = terms(model, dict(batch, teacher_row_mask=np.zeros(rows, np.float32)))
    tokens = (np.asarray(batch["mask"]) > 0).sum(1)
    assert float(every["distill"].count) == tokens.sum()
    assert float(partial["distill"].count) == tokens[some > 0].sum()
    assert float(none["distill"].count) == 0.0 and float(none["distill"].sum) == 0.0
    for t in (partial, none):
        np.testing.assert_allclose(float(t["policy"].sum), float(every["policy"].sum), rtol=1e-6)
        assert float(t["policy"].count) == float(every["policy"].count)
    assert np.isfinite(float(value))
