"""Decoder options: bf16 compute, remat and the two layer layouts give the same function/gradients."""
import numpy as np

import jax
import jax.numpy as jnp
from flax import nnx

from hindsight.models import load_hf_folder
from .helpers import COMMON, ours, padded_batch

LENGTHS = (12, 7)


def test_bf16_params_and_compute_track_fp32(hf_models):
    folder, _ = hf_models["qwen3"]
    tokens, positions, mask = padded_batch(LENGTHS, 12, COMMON["vocab_size"], seed=2)
    ref = ours(load_hf_folder(folder), tokens, positions, mask)
    model = load_hf_folder(folder, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, scan_layers=False)
    assert model.embed[...].dtype == jnp.bfloat16 and model.init_cache(1, 4).dtype == jnp.bfloat16
    out = ours(model, tokens, positions, mask)
    assert out.dtype == np.float32
    err = max(np.abs(out[b, :n] - ref[b, :n]).max() for b, n in enumerate(LENGTHS)) / np.abs(ref).max()
    assert err < 5e-2


def _loss_and_grads(model, tokens, positions, mask):
    def loss(m):
        logits, _ = m(tokens, positions, attention_mask=mask)
        logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
        nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        return jnp.sum(nll * mask[:, 1:])
    return nnx.jit(nnx.value_and_grad(loss))(model)


def test_remat_and_layouts_give_identical_gradients(hf_models):
    folder, _ = hf_models["qwen2"]
    tokens, positions, mask = (jnp.asarray(x) for x in padded_batch(LENGTHS, 12, COMMON["vocab_size"], seed=4))
    base_loss, base = _loss_and_grads(load_hf_folder(folder), tokens, positions, mask)
    remat_loss, remat = _loss_and_grads(load_hf_folder(folder, remat=True), tokens, positions, mask)
    np.testing.assert_allclose(remat_loss, base_loss, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(remat)):  # same math, summation order may differ
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-5 * np.abs(b).max())
    unrolled_loss, unrolled = _loss_and_grads(load_hf_folder(folder, scan_layers=False), tokens, positions, mask)
    np.testing.assert_allclose(unrolled_loss, base_loss, rtol=1e-5)
    q_stacked = np.asarray(base["layers"]["attn"]["q_proj"]["kernel"][...])
    for i in range(COMMON["num_hidden_layers"]):
        q_layer = np.asarray(unrolled["layers"][i]["attn"]["q_proj"]["kernel"][...])
        np.testing.assert_allclose(q_layer, q_stacked[i], rtol=0, atol=1e-5 * np.abs(q_stacked).max())


def test_unrolled_view_of_a_scanned_model(hf_models):
    """`unrolled` (the decode loops' view) equals loading the same weights unrolled, with a KV cache
    too, and leaves the scanned model as it was."""
    from hindsight.models.decoder import unrolled

    folder, _ = hf_models["qwen2"]
    tokens, positions, mask = padded_batch(LENGTHS, 12, COMMON["vocab_size"], seed=5)
    scanned = load_hf_folder(folder)
    before = [np.asarray(x) for x in jax.tree.leaves(nnx.state(scanned))]
    view = unrolled(scanned)
    assert not view.scan_layers and unrolled(view) is view
    ref = ours(load_hf_folder(folder, scan_layers=False), tokens, positions, mask)
    np.testing.assert_allclose(ours(view, tokens, positions, mask), ref, rtol=0,
                               atol=1e-5 * np.abs(ref).max())
    cache = view.init_cache(2, 16)
    got, _ = view(jnp.asarray(tokens), jnp.asarray(positions), cache=cache,
                  attention_mask=jnp.pad(jnp.asarray(mask), ((0, 0), (0, 4))))
    want, _ = scanned(jnp.asarray(tokens), jnp.asarray(positions), cache=scanned.init_cache(2, 16),
                      attention_mask=jnp.pad(jnp.asarray(mask), ((0, 0), (0, 4))))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0,
                               atol=1e-5 * np.abs(np.asarray(want)).max())
    for a, b in zip(before, jax.tree.leaves(nnx.state(scanned))):
        np.testing.assert_array_equal(a, np.asarray(b))
    # views share one cached skeleton (built once per architecture) but not their weights: a view
    # taken after a weight update has the new weights, and the earlier view keeps the old ones
    q = lambda m: np.asarray(m.layers[0].attn.q_proj.kernel[...])
    old = q(view)
    nnx.update(scanned.layers, jax.tree.map(lambda x: x + 1.0, nnx.state(scanned.layers)))
    np.testing.assert_array_equal(q(unrolled(scanned)), old + 1.0)
    np.testing.assert_array_equal(q(view), old)
