"""Counterfactual recoverability's loss (spec other-methods §10): each named term against an
independent float64 reference from dense logits (SOD on the student's rows, cross-entropy to the
teacher's argmax on the retained and rolled-back rows, routed by ``row_role``), the full-vocabulary
SOD, an external teacher, the row-role contract and the gradient reaching only the student."""
import jax
import numpy as np
import pytest
from flax import nnx

from hindsight.batch import check_batch
from hindsight.methods import LMHead, get_method
from tests.methods.helpers import dense_logits

HEAD = LMHead(chunk_size=20)
ROLES = np.array([0, 0, 1, 0, 0, 2, 2, 1], np.int32)


def _log_softmax(z):
    z = np.asarray(z, np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _reference(student_logits, teacher_logits, batch, config):
    """Float64 NumPy: ``{term: (sum, count)}`` of the three terms."""
    ls = _log_softmax(np.asarray(student_logits) / config.temperature)
    lt = _log_softmax(np.asarray(teacher_logits) / config.temperature)
    y = np.asarray(batch["targets"])[..., None]
    pick = lambda lp, idx: np.take_along_axis(lp, idx, -1)[..., 0]
    if config.divergence == "sampled":
        sod = (pick(ls, y) - pick(lt, y)) * pick(ls, y)
    else:  # generalized JSD, beta = 1: KL(S || T)
        sod = np.sum(np.exp(ls) * (ls - lt), -1)
    ce = -pick(ls, lt.argmax(-1)[..., None])
    mask = np.asarray(batch["mask"]) > 0
    role = np.asarray(batch.get("row_role", np.zeros(len(mask), np.int32)))[:, None]
    out = {}
    for name, value, r in (("sod", sod, 0), ("retain", ce, 1), ("rollback", ce, 2)):
        m = mask & (role == r)
        out[name] = (float(np.sum(np.where(m, value, 0.0))), float(m.sum()))
    return out


def _loss(config, model, reference, batch, external=None):
    method = get_method("recoverability")

    @nnx.jit
    def program(model, external, batch):
        def value(m):
            out = method.loss_fn(m, batch, config=config, head=HEAD, reference=reference,
                                 external_teacher=external)
            return out.value(), out
        return nnx.value_and_grad(value, has_aux=True)(model)

    (value, loss), grads = program(model, external, batch)
    return float(value), loss, grads


@pytest.mark.parametrize("options", [
    dict(sod_weight=0.3, rollback_weight=2.0, temperature=0.8),
    dict(divergence="full", teacher="external", retain_weight=0.5),
])
def test_terms_equal_a_float64_reference(options, models, batch):
    config = get_method("recoverability").make_config(**options)
    batch = dict(batch, row_role=ROLES)
    external = models[1] if config.teacher == "external" else None
    value, loss, grads = _loss(config, models[0], None, batch, external)
    teacher = dense_logits(external or models[0], batch, "teacher")
    want = _reference(dense_logits(models[0], batch), teacher, batch, config)
    weights = {"sod": config.sod_weight, "retain": config.retain_weight,
               "rollback": config.rollback_weight}
    for name, (total, count) in want.items():
        t = loss.terms[name]
        assert float(t.count) == count > 0, name
        np.testing.assert_allclose(float(t.sum), total, rtol=2e-5, atol=1e-6, err_msg=name)
        assert float(t.weight) == np.float32(weights[name])
    np.testing.assert_allclose(value, sum(weights[k] * s / c for k, (s, c) in want.items()),
                               rtol=2e-5)
    # rows 2 and 7 retained, rows 5 and 6 rolled back (row 5 may be empty: its fraction counts
    # rows holding a supervised token)
    mask = np.asarray(batch["mask"]) > 0
    for name, r in (("retain_rows", 1), ("rollback_rows", 2)):
        s, c = loss.metrics[name]
        assert (float(s), float(c)) == (float(np.sum(mask.any(-1) & (ROLES == r))), 8.0)
    leaves = jax.tree.leaves(nnx.state(grads, nnx.Param))
    assert all(np.all(np.isfinite(np.asarray(g))) for g in leaves)


def test_without_row_roles_every_row_is_sod(models, batch):
    config = get_method("recoverability").config
    _, loss, _ = _loss(config, models[0], None, batch)
    assert float(loss.terms["retain"].count) == float(loss.terms["rollback"].count) == 0
    assert float(loss.terms["sod"].count) == float(np.sum(np.asarray(batch["mask"]) > 0))
    assert np.isfinite(float(loss.value()))


def test_the_teacher_gets_no_gradient(models, batch):
    """With ``teacher="self"`` the policy's gradient is the student side's alone: equal to the
    gradient with the teacher context's logits replaced by constants (a second model of the same
    weights that is never differentiated)."""
    config = get_method("recoverability").make_config(teacher="external")
    batch = dict(batch, row_role=ROLES)
    frozen = nnx.clone(models[0])
    _, _, grads_ext = _loss(config, models[0], None, batch, frozen)
    _, _, grads_self = _loss(get_method("recoverability").config, models[0], None, batch)
    for a, b in zip(jax.tree.leaves(nnx.state(grads_self, nnx.Param)),
                    jax.tree.leaves(nnx.state(grads_ext, nnx.Param))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_row_role_contract(batch):
    check_batch(dict(batch, row_role=ROLES), method="recoverability")
    with pytest.raises(ValueError, match="row_role"):
        check_batch(dict(batch, row_role=ROLES[:5]), method="recoverability")
    with pytest.raises(TypeError, match="row_role.*integer"):
        check_batch(dict(batch, row_role=ROLES.astype(np.float32)), method="recoverability")
