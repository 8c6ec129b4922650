"""The decoder's ``mlp_reduce`` option: a fold over the layers' MLP post-activations inside the
layer loop. Off, the traced program is the plain forward pass; on, the activations it sees are
transformers' (the input of each ``down_proj``), for both layer layouts."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hindsight.models import Decoder, MLPReduce, load_hf_folder
from hindsight.testing.models import TINY

from .helpers import COMMON, padded_batch

LAYOUTS = list(itertools.product((True, False), (False, True)))  # (scan_layers, remat)


def _inputs(batch=2, length=5):
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, TINY.vocab_size, (batch, length)),
                         jnp.int32)
    return tokens, jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))


@pytest.mark.parametrize("scan, remat", LAYOUTS)
def test_a_fold_adds_nothing_but_its_own_work(scan, remat):
    """A fold that carries nothing and computes nothing traces to exactly the plain forward
    pass (the jaxpr text is equal), so the option costs only what its step computes; the plain
    call itself is unchanged code (its jaxpr and HLO were compared before and after the option
    was added)."""
    model = Decoder(TINY, scan_layers=scan, remat=remat, rngs=nnx.Rngs(0))
    tokens, positions = _inputs()
    plain = jax.make_jaxpr(lambda t, p: model(t, p))(tokens, positions)
    noop = MLPReduce((), lambda carry, k, w, layer: carry)
    folded = jax.make_jaxpr(lambda t, p: model(t, p, mlp_reduce=noop)[:2])(tokens, positions)
    assert str(folded) == str(plain)
    out, cache, carry = model(tokens, positions, mlp_reduce=noop)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(model(tokens, positions)[0]))
    assert cache is None and carry == ()


@pytest.mark.parametrize("scan", [True, False])
def test_activations_are_transformers_down_proj_inputs(hf_models, scan):
    """Each layer's activations equal the input of transformers' ``mlp.down_proj`` on the same
    weights, the kernel handed to the fold is that layer's down projection, and the outputs are
    those of the plain pass."""
    import torch

    folder, hf = hf_models["llama"]
    lengths = (9, 6)
    tokens, positions, mask = padded_batch(lengths, 9, COMMON["vocab_size"], seed=7)
    seen = []

    def keep_input(module, args, out):
        seen.append(args[0].detach().numpy())

    hooks = [layer.mlp.down_proj.register_forward_hook(keep_input) for layer in hf.model.layers]
    try:
        with torch.no_grad():
            hf(input_ids=torch.tensor(tokens, dtype=torch.long),
               attention_mask=torch.tensor(mask, dtype=torch.long),
               position_ids=torch.tensor(positions, dtype=torch.long))
    finally:
        for h in hooks:
            h.remove()
    model = load_hf_folder(folder, scan_layers=scan)
    layers, f = COMMON["num_hidden_layers"], COMMON["intermediate_size"]
    fold = MLPReduce((jnp.zeros((layers,) + tokens.shape + (f,), jnp.float32),
                      jnp.zeros((layers, f, COMMON["hidden_size"]), jnp.float32)),
                     lambda acc, k, w, layer: (acc[0].at[layer].set(k.astype(jnp.float32)),
                                               acc[1].at[layer].set(w.astype(jnp.float32))))
    run = nnx.jit(lambda m, t, p, a: m(t, p, attention_mask=a, mlp_reduce=fold))
    logits, _, (acts, kernels) = run(model, tokens, positions, mask)
    plain = nnx.jit(lambda m, t, p, a: m(t, p, attention_mask=a)[0])(model, tokens, positions, mask)
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(plain))
    for layer in range(layers):
        ref = seen[layer]
        scale = np.abs(ref).max()
        for b, n in enumerate(lengths):
            np.testing.assert_allclose(np.asarray(acts[layer, b, :n]), ref[b, :n], rtol=0,
                                       atol=1e-5 * scale, err_msg=f"layer {layer} row {b}")
        down = hf.model.layers[layer].mlp.down_proj.weight.detach().numpy()  # [D, F]
        np.testing.assert_allclose(np.asarray(kernels[layer]), down.T, rtol=0, atol=0)
