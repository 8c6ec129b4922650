"""Every loss function of ``hindsight.objectives`` and ``hindsight.signals`` under non-finite
inputs (issue 15, finding 5), from dense logits ``[B, T, V]``:

* NaN or +inf in the student's logits at a valid position: the loss is not finite (a finite
  loss with a NaN gradient would hide the problem from the step's guard and from the logs);
* a banned token, -inf at one vocabulary entry of every distribution, without a ``vocab_mask``:
  finite loss, finite gradient;
* NaN in every input at masked positions (logits, rollout log-probs): the loss of the clean
  inputs and a finite gradient;
* whenever the loss is finite, so is the gradient.

Losses over sampled-token log-probs take them from the same logits (``token_logprobs``), so a
corrupted logit reaches them as it would in a method.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.objectives import (distillation_loss, kl_penalty, policy_loss,
                                  sampled_distillation_loss)
from hindsight.ops import token_logprobs
from hindsight.signals import (barycenter_loss, controller_init, craft_loss_terms, cti_loss,
                               pcsd_loss, persistence_loss, pmi_loss, polarised_kl, reverse_k3)

B, T, V, G = 4, 5, 16, 2
BANNED = 3
rng = np.random.default_rng(0)
TOKENS = jnp.asarray(rng.integers(BANNED + 1, V, (B, T)), jnp.int32)  # never the banned id
MASK = jnp.asarray(np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 1, 0, 0, 0]],
                            np.float32))
ADV = jnp.asarray([1.0, -1.0, 0.5, -0.5], jnp.float32)
OTHERS = ("teacher", "probe", "base", "ref")


def _logp(x, tokens=TOKENS):
    """Realised-token log-probs as a method's LM head gives them: masked positions' logits are
    selected away first (``methods.vocab_rows``), and the log-prob there is then whatever the
    padding holds (the first logit: NaN in the masked test), which the loss must ignore."""
    valid = (MASK > 0)[..., None]
    lp = token_logprobs(jnp.where(valid, x, 0.0), tokens)
    return jnp.where(valid[..., 0], lp, x[..., 0])


def _ratio(total, count):
    return total / jnp.maximum(count, 1.0)


def _sampled(student, other, mask, rollout):
    """Sampled-token losses: the student's realised-token log-probs, the others' constants."""
    return _logp(student), {k: jax.lax.stop_gradient(_logp(v)) for k, v in other.items()}


def _policy(student, other, mask, rollout, **kw):
    ls, lo = _sampled(student, other, mask, rollout)
    return _ratio(*policy_loss(ls, rollout["logp_old"], rollout["adv"], mask, **kw)[:2])


def _kl(estimator):
    def fn(student, other, mask, rollout):
        ls, lo = _sampled(student, other, mask, rollout)
        return jnp.sum(kl_penalty(ls, lo["ref"], mask, estimator=estimator))
    return fn


def _craft(student, other, mask, rollout):
    ls, lo = _sampled(student, other, mask, rollout)
    total, count, _ = craft_loss_terms(ls, lo["ref"], lo["teacher"] - ls, mask, rollout["adv"],
                                       G, controller_init())
    return _ratio(total, count)


LOSSES = {
    **{f"distill-{d}{'-top4' if k else ''}": (
        lambda s, o, m, r, d=d, k=k: _ratio(*distillation_loss(s, o["teacher"], m, divergence=d,
                                                               top_k=k)[:2]))
       for d in ("forward_kl", "reverse_kl", "jsd") for k in (None, 4)},
    "sampled_distill": lambda s, o, m, r: _ratio(*sampled_distillation_loss(
        _logp(s), jax.lax.stop_gradient(_logp(o["teacher"])), m, logp_old=r["logp_old"])[:2]),
    "policy": _policy,
    "policy-kl": lambda s, o, m, r: _policy(s, o, m, r, logp_ref=_logp(o["ref"]), kl_coef=0.1),
    "policy-gspo": lambda s, o, m, r: _policy(s, o, m, r, ratio_level="sequence",
                                              mode="seq-mean-token-mean", dual_clip=None),
    **{f"kl-{e}": _kl(e) for e in ("k1", "k2", "k3", "k1+", "k3+", "abs")},
    "pmi": lambda s, o, m, r: _ratio(*pmi_loss(o["teacher"], o["probe"], o["base"], s, m)),
    "barycenter": lambda s, o, m, r: _ratio(*barycenter_loss(o["teacher"], s, m)),
    **{f"persistence-{k}": (lambda s, o, m, r, k=k: _ratio(*persistence_loss(
        o["teacher"], s, TOKENS, m, loss=k))) for k in ("nll", "rkl", "rkl_sampled")},
    "pcsd": lambda s, o, m, r: _ratio(*pcsd_loss(jnp.full((B, T), 0.5), _logp(s), m)),
    "cti": lambda s, o, m, r: _ratio(*cti_loss(jnp.full((B, T), 0.7),
                                               jax.lax.stop_gradient(_logp(o["teacher"]) - _logp(s)),
                                               _logp(s), m)),
    "polarised_kl": lambda s, o, m, r: jnp.sum(polarised_kl(
        _logp(s), jax.lax.stop_gradient(_logp(o["ref"])), jnp.asarray(
            np.tile([0.5, -0.5, 0.0, 0.3, -0.3], (B, 1)), jnp.float32), m)),
    "reverse_k3": lambda s, o, m, r: jnp.sum(reverse_k3(
        _logp(s), jax.lax.stop_gradient(_logp(o["ref"])), m)),
    "craft": _craft,
}


def _inputs():
    keys = jax.random.split(jax.random.key(0), 1 + len(OTHERS))
    student = 2.0 * jax.random.normal(keys[0], (B, T, V))
    other = {k: 2.0 * jax.random.normal(kk, (B, T, V)) for k, kk in zip(OTHERS, keys[1:])}
    logp_old = jax.lax.stop_gradient(_logp(student)) + 0.1
    return student, other, {"logp_old": logp_old, "adv": ADV}


def _run(name, student, other, rollout):
    value, grad = jax.jit(jax.value_and_grad(
        lambda s: LOSSES[name](s, other, MASK, rollout)))(student)
    return float(value), np.asarray(grad)


@pytest.fixture(scope="module")
def clean():
    return {name: _run(name, *_inputs()) for name in LOSSES}


def test_clean_inputs_give_finite_losses_and_gradients(clean):
    for name, (value, grad) in clean.items():
        assert np.isfinite(value) and np.all(np.isfinite(grad)), name


@pytest.mark.parametrize("value", [np.nan, np.inf], ids=["nan", "posinf"])
@pytest.mark.parametrize("name", list(LOSSES))
def test_non_finite_student_logit_at_a_valid_position_is_not_hidden(name, value):
    student, other, rollout = _inputs()
    student = student.at[1, 2, 7].set(value)        # row 1 is fully valid
    loss, grad = _run(name, student, other, rollout)
    assert not np.isfinite(loss), loss


@pytest.mark.parametrize("name", list(LOSSES))
def test_a_banned_token_in_every_distribution_needs_no_vocab_mask(name, clean):
    student, other, rollout = _inputs()
    student = student.at[..., BANNED].set(-jnp.inf)
    other = {k: v.at[..., BANNED].set(-jnp.inf) for k, v in other.items()}
    loss, grad = _run(name, student, other, rollout)
    assert np.isfinite(loss) and np.all(np.isfinite(grad)), (loss, name)


@pytest.mark.parametrize("name", list(LOSSES))
def test_nan_at_masked_positions_changes_nothing(name, clean):
    student, other, rollout = _inputs()
    masked = (MASK == 0)[..., None]
    student = jnp.where(masked, jnp.nan, student)
    other = {k: jnp.where(masked, jnp.nan, v) for k, v in other.items()}
    rollout = {"logp_old": jnp.where(MASK == 0, jnp.nan, rollout["logp_old"]),
               "adv": rollout["adv"].at[2].set(jnp.nan)}   # row 2 is all-masked
    loss, grad = _run(name, student, other, rollout)
    np.testing.assert_allclose(loss, clean[name][0], rtol=1e-6, atol=1e-7)
    assert np.all(np.isfinite(grad))
    np.testing.assert_allclose(grad, clean[name][1], rtol=1e-5, atol=1e-7)
