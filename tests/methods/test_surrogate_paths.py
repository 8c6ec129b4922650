"""The GRPO family's two ways through the LM head agree: ``surrogate_loss`` (the objective formed
position by position in one ``vocab_sum``; the fused backend forms its gradient in the forward
pass) vs ``surrogate_terms(policy_rows(...))`` (per-position rows, the objective formed after the
head; the backward pass recomputes the logits): the same terms, metrics, objective and gradient,
for every aggregation mode, with and without the KL term, on every backend; and with the step's
whole-batch ``counts`` the objective uses them."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hindsight.methods import LMHead
from hindsight.methods.grpo import GRPOConfig
from hindsight.methods.policy_gradient import policy_rows, surrogate_loss, surrogate_terms
from hindsight.testing import make_batch, tiny_model
from hindsight.objectives import Loss, objective

CASES = [
    dict(mode="token-mean"),
    dict(mode="seq-mean-token-mean"),
    dict(mode="seq-mean-token-sum"),
    dict(mode="seq-mean-token-sum-norm", norm=6.0),
    dict(mode="token-mean", kl_coef=0.05, kl_estimator="k3"),
    dict(mode="seq-mean-token-mean", kl_coef=0.1, kl_estimator="k1+"),
]


@pytest.fixture(scope="module")
def setup():
    model = tiny_model(0)
    ref = tiny_model(1)
    batch = jax.tree.map(jnp.asarray, make_batch(model, contexts=(), logp_noise=0.3))
    return model, ref, batch


def _both(model, ref, batch, case, backend, counts=None):
    config = GRPOConfig(eps_high=0.28)
    head = LMHead(backend=backend, chunk_size=5)
    graph, params = nnx.split(model)

    def by_sum(p):
        out = surrogate_loss(nnx.merge(graph, p), batch, config, head=head, reference=ref,
                             counts=counts, **case)
        return out.value(), out

    def by_rows(p):
        m = nnx.merge(graph, p)
        rows = policy_rows(m, batch, config, head=head, reference=ref)
        out = Loss(*surrogate_terms(rows, batch, config, **case))
        return objective(out.terms, counts), out

    return [jax.jit(jax.value_and_grad(f, has_aux=True))(params) for f in (by_sum, by_rows)]


def _close(a, b, rtol=2e-5):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * max(1.0, np.abs(y).max()))


@pytest.mark.parametrize("backend", ["fused", "dense"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_sum_path_equals_rows_path(setup, backend, case):
    model, ref, batch = setup
    ((v_s, l_s), g_s), ((v_r, l_r), g_r) = _both(model, ref, batch, case, backend)
    assert l_s.objective is not None and l_r.objective is None
    assert set(l_s.terms) == set(l_r.terms) == ({"policy", "kl"} if case.get("kl_coef") else
                                                {"policy"})
    assert set(l_s.metrics) == set(l_r.metrics)
    _close((v_s, l_s.terms, l_s.metrics), (v_r, l_r.terms, l_r.metrics))
    _close(g_s, g_r)
    assert float(jnp.abs(jnp.concatenate([jnp.ravel(g) for g in jax.tree.leaves(g_s)])).max()) > 0


def test_sum_path_uses_the_given_counts(setup):
    """With the step's whole-batch counts (here 3x and 5x this batch's), the formed objective is
    ``sum_k weight_k * sum_k / counts_k``, gradient included."""
    model, ref, batch = setup
    case = dict(mode="token-mean", kl_coef=0.05)
    (_, own), _ = _both(model, ref, batch, case, "fused")[0]
    counts = {"policy": own.terms["policy"].count * 3.0, "kl": own.terms["kl"].count * 5.0}
    ((v_s, l_s), g_s), ((v_r, _), g_r) = _both(model, ref, batch, case, "fused", counts=counts)
    _close(v_s, objective(l_s.terms, counts))
    _close((v_s, g_s), (v_r, g_r))


def test_sequence_ratios_take_the_rows_path(setup):
    model, ref, batch = setup
    out = surrogate_loss(model, batch, GRPOConfig(ratio_level="sequence"), mode="seq-mean-token-mean")
    assert out.objective is None
