"""Every registered method's loss under non-finite inputs (issue 15, finding 5).

The properties, for every method of the registry and every LM-head backend:

* a NaN or +inf logit at valid positions gives a non-finite loss, never a finite loss with a
  NaN gradient (the step's non-finite guard then skips the update);
* a banned token (a logit of -1e30 for one vocabulary entry in every distribution, no
  ``vocab_mask``) gives a finite loss and finite gradients;
* NaN in the hidden states of an all-masked row, or in ``logp_old`` / the advantages at masked
  positions, changes nothing: same loss, finite gradients;
* whenever the loss is finite, so is every gradient;
* the clean loss and gradient are the same under every backend.

The corruptions are made by a wrapper model (:class:`Corrupted`) around the tiny decoder, so they
reach the losses through the same path as real logits (``context_hidden`` and the LM head).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hindsight.methods import REGISTRY, LMHead, get_method

from tests.methods.test_losses import CASES

BANNED = 5  # a vocabulary id no target of the test batch uses (checked below)


class Corruption(nnx.Variable):
    """Arrays of the corruption: not parameters, so no gradient is taken for them."""


class Corrupted(nnx.Module):
    """The decoder interface around ``model``, with a constant feature appended to every hidden
    state and a matching row, ``bias [V]``, appended to the unembedding: every logit of entry v is
    the model's plus ``bias[v]`` (0, NaN, +-inf, -1e30); rows where ``nan_rows [B]`` is set get
    NaN in every hidden state. Both are traced values, so one compiled program serves every
    corruption."""

    def __init__(self, model, batch_size: int):
        self.model = model
        self.config = model.config
        self.bias = Corruption(jnp.zeros((model.config.vocab_size,), jnp.float32))
        self.nan_rows = Corruption(jnp.zeros((batch_size,), bool))

    def __call__(self, tokens, positions, *, attention_mask=None, return_hidden=False,
                 cache=None):
        hidden, _ = self.model(tokens, positions, attention_mask=attention_mask,
                               return_hidden=True)
        hidden = jnp.concatenate([hidden, jnp.ones(hidden.shape[:-1] + (1,), hidden.dtype)], -1)
        # the reference model sees the policy context too: rows past the policy batch stay clean
        rows = self.nan_rows[...][:hidden.shape[0], None, None]
        hidden = jnp.where(rows, jnp.nan, hidden)
        return (hidden if return_hidden else hidden @ self.unembedding()), None

    def unembedding(self):
        w = self.model.unembedding()
        return jnp.concatenate([w, self.bias[...][None].astype(w.dtype)], 0)

    def corrupt(self, *, column=None, nan_row=None):
        bias = np.zeros(self.config.vocab_size, np.float32)
        if column is not None:
            bias[column[0]] = column[1]
        rows = np.zeros(self.nan_rows[...].shape, bool)
        if nan_row is not None:
            rows[nan_row] = True
        self.bias[...] = jnp.asarray(bias)
        self.nan_rows[...] = jnp.asarray(rows)
        return self


def _program(name, head):
    method = get_method(name)
    config = method.make_config(**CASES[name])
    state = method.init_state(config) if method.init_state else None

    @nnx.jit
    def program(model, reference, batch):
        def value(m):
            return method.loss_fn(m, batch, config=config, head=head, reference=reference,
                                  method_state=state).value()
        return nnx.value_and_grad(value)(model)

    def run(model, reference, batch):
        value, grads = program(model, reference, batch)
        return float(value), [np.asarray(g) for g in jax.tree.leaves(nnx.state(grads, nnx.Param))]
    return run


def _finite(grads) -> bool:
    return all(np.all(np.isfinite(g)) for g in grads)


def test_every_method_is_covered():
    assert set(CASES) == set(REGISTRY)


BACKENDS = ("scan", "fused", "dense")


@pytest.mark.parametrize("name", list(CASES))
def test_non_finite_logits(name, models, batch):
    """Under every LM-head backend (``train.lm_head``), and the three give the same clean loss and
    gradient (three schedules of one computation; one test, so that each compiled program serves
    both checks)."""
    assert BANNED not in set(np.asarray(batch["targets"])[np.asarray(batch["mask"]) > 0])
    assert np.asarray(batch["mask"])[0].sum() == 0  # row 0 is all-masked
    model = Corrupted(models[0], np.asarray(batch["mask"]).shape[0])
    first = None
    for backend in BACKENDS:
        run = _program(name, LMHead(backend=backend, chunk_size=20))
        clean, clean_grads = run(model.corrupt(), models[1], batch)
        assert np.isfinite(clean) and _finite(clean_grads), backend
        if first is None:
            first = clean, clean_grads
        else:
            np.testing.assert_allclose(clean, first[0], rtol=2e-6, atol=1e-7, err_msg=backend)
            for a, b in zip(clean_grads, first[1], strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=backend)

        # NaN or +inf logits at valid positions: a non-finite loss
        for value in (np.nan, np.inf):
            loss, _ = run(model.corrupt(column=(BANNED, value)), models[1], batch)
            assert not np.isfinite(loss), (backend, value, loss)

        # A token no distribution can produce: through the LM head (a finite matmul) that is a
        # huge negative logit, not -inf (the -inf case of the loss functions themselves is in
        # tests/objectives/test_nonfinite.py; an infinite unembedding entry would meet the zeroed
        # hidden states of masked positions as 0 * inf).
        loss, grads = run(model.corrupt(column=(BANNED, -1e30)), models[1], batch)
        assert np.isfinite(loss) and _finite(grads), (backend, loss)
        assert loss != clean or name == "drgrpo"  # the banned entry's mass moved elsewhere

        # NaN in every hidden state of the all-masked row: nothing changes
        loss, grads = run(model.corrupt(nan_row=0), models[1], batch)
        np.testing.assert_allclose(loss, clean, rtol=2e-6, atol=1e-7, err_msg=backend)
        assert _finite(grads), backend


@pytest.mark.parametrize("name", list(CASES))
def test_non_finite_rollout_values(name, models, batch):
    """NaN in ``logp_old`` / the advantages: at masked positions (and the all-masked row) nothing
    changes; at a valid position the loss is not finite or the gradient is finite."""
    run = _program(name, LMHead(chunk_size=20))
    model = Corrupted(models[0], np.asarray(batch["mask"]).shape[0]).corrupt()
    clean, _ = run(model, models[1], batch)
    mask = np.asarray(batch["mask"]) > 0
    masked = dict(batch, logp_old=jnp.where(mask, batch["logp_old"], jnp.nan),
                  advantages=jnp.asarray(batch["advantages"]).at[0].set(jnp.nan))
    loss, grads = run(model, models[1], masked)
    np.testing.assert_allclose(loss, clean, rtol=2e-6, atol=1e-7)
    assert _finite(grads)

    first = tuple(np.argwhere(mask)[0])
    valid = dict(batch, logp_old=jnp.asarray(batch["logp_old"]).at[first].set(jnp.nan),
                 advantages=jnp.asarray(batch["advantages"]).at[first[0]].set(jnp.nan))
    loss, grads = run(model, models[1], valid)
    assert not np.isfinite(loss) or _finite(grads)
