"""Parameter and optimizer-state dtypes: bfloat16 params with a float32 master copy, a bfloat16
first moment, a bfloat16 frozen reference; their config keys; checkpoint round trip."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hindsight.train as ht
from configs.base import method_file
from hindsight.train.experiment import ConfigError, resolve
from hindsight.train.optim import MasterState
from hindsight.testing import tiny_model  # layers unrolled: 2 layers compile faster than a scan
from tests.train.helpers import grpo_loss, make_batch, model_rules

# SGD + momentum keeps the update Lipschitz in the gradient, so the bf16 run's updates can be
# compared with the fp32 run's (Adam's first steps, about lr * sign(g), flip wherever bf16
# rounding flips the sign of a near-zero gradient: 20-30% apart here, for any dtype change).
SGD = ht.OptimConfig(name="sgd", learning_rate=0.1, momentum=0.9)
STEPS = 3


def _cast(model, dtype):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return nnx.merge(graphdef, jax.tree.map(lambda p: p.astype(dtype), params), rest)


def _start():
    """The tiny decoder with weights exactly representable in bf16: both runs start from the same
    point, so they differ only by what the dtypes do during training."""
    return _cast(tiny_model(0), jnp.bfloat16)


def _train(param_dtype, optim=SGD, *, reference=None, reference_dtype=None):
    """``(state, shardings, tx, losses)`` after STEPS GRPO steps of the tiny decoder."""
    mesh = ht.make_mesh(ht.MeshConfig())
    tx = ht.make_optimizer(optim, param_dtype=param_dtype)
    state, shardings, model_def = ht.create_train_state(
        _cast(_start(), param_dtype), tx, mesh=mesh, rules=model_rules(mesh),
        reference=reference, reference_dtype=reference_dtype)
    step = ht.make_train_step(grpo_loss, model_def=model_def, optimizer=tx, mesh=mesh,
                              shardings=shardings,
                              config=ht.StepConfig(batch_size=8, reference=reference))
    batch, losses = make_batch(8, seed=1), []
    for _ in range(STEPS):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    return state, shardings, tx, losses


def _leaves(tree):
    return jax.tree.leaves(tree)


@pytest.fixture(scope="module")
def runs():
    """The fp32 run, and the run with every option: bf16 params on a float32 master copy, a
    bf16 first moment and a bf16 frozen reference (the loss here does not read it)."""
    low = ht.OptimConfig(name="sgd", learning_rate=0.1, momentum=0.9, mu_dtype="bfloat16")
    return {"fp32": _train("float32"),
            "bf16": _train("bfloat16", low, reference="frozen", reference_dtype="bfloat16")}


@pytest.mark.slow  # the two runs compile in about 15 s
def test_bf16_params_train_on_a_float32_master(runs):
    ref, _, _, ref_losses = runs["fp32"]
    state, _, _, losses = runs["bf16"]
    assert {x.dtype for x in _leaves(state.params)} == {jnp.dtype(jnp.bfloat16)}
    master = state.opt_state
    assert isinstance(master, MasterState)
    assert {x.dtype for x in _leaves(master.master)} == {jnp.dtype(jnp.float32)}
    # the params are the master rounded: no rounding error accumulates in them
    for p, m in zip(_leaves(state.params), _leaves(master.master)):
        np.testing.assert_array_equal(np.asarray(p), np.asarray(m.astype(jnp.bfloat16)))
    # The bf16 run follows the fp32 one from the same start: the first loss is equal, every loss
    # within 2e-3 relative (measured 8.4e-4: the forward passes see bf16-rounded weights after
    # the first update), and each parameter's update within 2% of the fp32 one (measured 0.75%:
    # bf16 gradients and momentum).
    assert losses[0] == ref_losses[0]
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-3)
    start = _leaves(nnx.state(_start(), nnx.Param))
    for m, r, p0 in zip(_leaves(master.master), _leaves(ref.params), start):
        ours = np.asarray(m) - np.asarray(p0, np.float32)
        theirs = np.asarray(r) - np.asarray(p0, np.float32)
        assert np.linalg.norm(ours - theirs) <= 0.02 * np.linalg.norm(theirs)
    assert {x.dtype for x in _leaves(master.inner[1][0].trace)} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in _leaves(state.reference)} == {jnp.dtype(jnp.bfloat16)}


def test_bf16_first_moment_and_fp32_second():
    tx = ht.make_optimizer(ht.OptimConfig(name="adamw", mu_dtype="bfloat16", max_grad_norm=None),
                           param_dtype="bfloat16")
    params = {"w": jnp.ones((2, 2), jnp.bfloat16), "scale": jnp.ones((2,), jnp.bfloat16)}
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
    _, state = tx.update(grads, tx.init(params), params)
    adam = state.inner[0]  # master(adamw); adamw = chain(scale_by_adam, weight decay, lr)
    assert {x.dtype for x in _leaves(adam.mu)} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in _leaves(adam.nu)} == {jnp.dtype(jnp.float32)}
    np.testing.assert_allclose(np.asarray(adam.mu["w"], np.float32), 0.05, rtol=2**-8)  # bf16(0.05)


def test_bf16_params_without_master_weights_keep_no_copy():
    optim = ht.OptimConfig(name="adamw", learning_rate=1e-3, master_weights=False)
    tx = ht.make_optimizer(optim, param_dtype="bfloat16")
    params = {"w": jnp.ones((2, 2), jnp.bfloat16)}
    assert not isinstance(tx.init(params), MasterState)
    assert isinstance(ht.make_optimizer(optim.__class__(), param_dtype="bfloat16").init(params),
                      MasterState)


@pytest.mark.slow
def test_checkpoint_round_trip_keeps_the_dtypes(runs, tmp_path):
    state, shardings, _, _ = runs["bf16"]
    ckpt = ht.Checkpointer(ht.CheckpointConfig(directory=str(tmp_path), save_every=1))
    ckpt.save(STEPS, state)
    ckpt.wait()
    restored, _ = ckpt.restore(jax.eval_shape(lambda s: s, state), shardings)
    ckpt.close()
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    for a, b in zip(_leaves(state), _leaves(restored)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _config(**keys):
    """The tiny GRPO config as plain dicts (any value can be set, as in a config.json)."""
    config = method_file("grpo", "tiny").to_dict()
    for dotted, value in keys.items():
        *parents, last = dotted.split(".")
        node = config
        for p in parents:
            node = node[p]
        node[last] = value
    return config


@pytest.mark.parametrize("key,value", [("model.param_dtype", "float16"),
                                       ("train.optim.mu_dtype", "int8"),
                                       ("train.reference_dtype", "half"),
                                       ("train.optim.master_weights", "yes")])
def test_bad_dtype_keys_name_the_key(key, value):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        resolve(_config(**{key: value}))


def test_reference_dtype_resolves_and_a_bf16_ema_is_refused():
    xp = resolve(_config(**{"model.param_dtype": "bfloat16", "train.reference": "frozen"}))
    assert xp.config.train.reference_dtype == "bfloat16"  # follows the params; config.json shows it
    assert xp.config.to_dict()["model"]["param_dtype"] == "bfloat16"
    xp = resolve(_config(**{"model.param_dtype": "bfloat16", "train.reference": "ema"}))
    assert xp.config.train.reference_dtype == "float32"
    with pytest.raises(ConfigError, match="train.reference_dtype='bfloat16'"):
        resolve(_config(**{"train.reference": "ema", "train.reference_dtype": "bfloat16"}))


def test_auto_compute_dtype_follows_the_machine(tmp_path):
    """``model.dtype="auto"``: bf16 only on a CPU backend whose CPU has bf16 matmul instructions
    (AMX or AVX-512 BF16); resolve() records the result; the dry run (backend "accelerator") sizes
    float32."""
    from hindsight.models import precision

    flags = {"amx": "fpu sse avx512f amx_tile amx_bf16 amx_int8", "zen5": "fpu sse avx2 avx512f avx512_bf16",
             "avx512": "fpu sse avx2 avx512f avx512_vnni", "avx2": "fpu sse avx2"}
    for name, line in flags.items():
        (tmp_path / name).write_text(f"processor\t: 0\nflags\t\t: {line}\n")
    has = {name: precision.cpu_has_bf16_matmul(str(tmp_path / name)) for name in flags}
    assert has == {"amx": True, "zen5": True, "avx512": False, "avx2": False}
    assert not precision.cpu_has_bf16_matmul(str(tmp_path / "missing"))
    assert precision.auto_compute_dtype("gpu") == "float32"
    assert precision.auto_compute_dtype("accelerator") == "float32"
    assert precision.auto_compute_dtype("cpu") == ("bfloat16" if precision.cpu_has_bf16_matmul()
                                                   else "float32")
    config = _config(**{"model.dtype": "auto"})
    assert resolve(config, backend="accelerator").config.model.dtype == "float32"
    assert resolve(config, backend="cpu").config.model.dtype == precision.auto_compute_dtype("cpu")
