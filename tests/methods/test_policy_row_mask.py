"""Per-row policy weights (``policy_row_mask [B]``): a row marked 0 is trained without the policy
term (OVCSD's suffix rows) but keeps the method's other terms. On both surrogate paths the policy
term, its count and its gradient equal those of the batch whose loss mask is cleared on those rows;
PCSD's distillation term is untouched; through the train step with micro-batches the counts follow
and the update equals the one with one micro-batch."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hindsight.train as ht
from hindsight.batch import check_batch
from hindsight.methods import LMHead, RolloutShape, get_method
from hindsight.methods.grpo import GRPOConfig
from hindsight.methods.policy_gradient import surrogate_loss
from hindsight.testing import make_batch, tiny_model

ROWS = np.array([1, 1, 0, 1, 0, 1, 1, 1], np.float32)


@pytest.fixture(scope="module")
def setup():
    model = tiny_model(0)
    batch = jax.tree.map(jnp.asarray, make_batch(model, logp_noise=0.3))
    return model, batch


def _cleared(batch):
    out = dict(batch)
    out["mask"] = batch["mask"] * ROWS[:, None]
    return out


def _marked(batch):
    return {**batch, "policy_row_mask": jnp.asarray(ROWS)}


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_a_marked_row_leaves_the_policy_term(setup, ratio_level):
    """``ratio_level="token"`` forms the objective inside the LM head (``surrogate_loss``'s own
    path); ``"sequence"`` goes through ``surrogate_terms(policy_rows(...))``: both paths."""
    model, batch = setup
    config = GRPOConfig(ratio_level=ratio_level)
    head = LMHead(backend="fused", chunk_size=5)
    graph, params = nnx.split(model)

    @jax.jit
    def grad(p, b):
        def value(p):
            out = surrogate_loss(nnx.merge(graph, p), b, config, head=head)
            return out.value(), out.terms["policy"].count
        return jax.value_and_grad(value, has_aux=True)(p)

    (v_marked, n_marked), g_marked = grad(params, _marked(batch))
    (v_clear, n_clear), g_clear = grad(params, _cleared(batch))
    (v_all, _), _ = grad(params, batch)
    assert float(n_marked) == float(n_clear) < float(batch["mask"].sum())
    np.testing.assert_allclose(float(v_marked), float(v_clear), rtol=1e-6, atol=1e-7)
    assert abs(float(v_marked) - float(v_all)) > 1e-6  # the marked rows did count before
    for a, b in zip(jax.tree.leaves(g_marked), jax.tree.leaves(g_clear)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_pcsd_keeps_its_distillation_on_marked_rows(setup):
    model, batch = setup
    pcsd = get_method("pcsd").configure(rollout=RolloutShape(group_size=4))
    head = LMHead(backend="fused", chunk_size=5)
    loss = nnx.jit(lambda m, b: pcsd.loss_fn(m, b, config=pcsd.config, head=head))
    marked, plain, cleared = (loss(model, b) for b in (_marked(batch), batch, _cleared(batch)))
    policy = lambda loss: (float(loss.terms["policy"].sum), float(loss.terms["policy"].count))
    np.testing.assert_allclose(policy(marked), policy(cleared), rtol=1e-6)
    for name in set(marked.terms) - {"policy"}:
        np.testing.assert_allclose(float(marked.terms[name].sum), float(plain.terms[name].sum),
                                   rtol=1e-6, atol=1e-7)
        assert float(marked.terms[name].count) == float(plain.terms[name].count)


def test_check_batch_names_a_misshapen_row_mask(setup):
    _, batch = setup
    bad = {**batch, "policy_row_mask": jnp.ones((3,))}
    with pytest.raises(ValueError, match="policy_row_mask"):
        check_batch(bad, method="grpo", fields=("logp_old", "advantages"))


def test_the_train_step_counts_follow_the_row_mask(setup):
    model, batch = setup
    grpo = get_method("grpo").configure(rollout=RolloutShape(group_size=4))
    mesh = ht.make_mesh(ht.MeshConfig(data=-1))
    tx = ht.make_optimizer(ht.OptimConfig(name="sgd", learning_rate=0.1))
    host = {k: np.asarray(v) for k, v in _marked(batch).items()}
    out = {}
    for micro in (1, 2):
        state, shardings, model_def = ht.create_train_state(model, tx, mesh=mesh)
        step = ht.make_train_step(
            grpo.loss_fn, model_def=model_def, optimizer=tx, mesh=mesh, shardings=shardings,
            config=ht.StepConfig(batch_size=8, num_microbatches=micro),
            loss_kwargs={"config": grpo.config})
        new, metrics = step(state, host)
        out[micro] = (jax.tree.leaves(new.params), metrics)
    want = float((np.asarray(batch["mask"]) * ROWS[:, None]).sum())
    for micro in (1, 2):
        assert float(out[micro][1]["count/policy"]) == want
    np.testing.assert_allclose(float(out[1][1]["loss"]), float(out[2][1]["loss"]), rtol=1e-5)
    for a, b in zip(out[1][0], out[2][0]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
