"""Checkpoint round trip: state (params, optimizer, step, RNG, reference, method state), data
iterator position and metadata; keep-last-N."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import hindsight.train as ht

RECORDS = [{"id": i} for i in range(10)]


def _setup(mesh):
    tx = ht.make_optimizer(ht.OptimConfig(learning_rate=0.1))
    model = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
    method_state = {"reward_ema": jnp.float32(0.25), "count": jnp.int32(7)}
    state, shardings, _ = ht.create_train_state(model, tx, mesh=mesh, seed=5, reference="frozen",
                                                method_state=method_state)
    abstract = ht.abstract_train_state(nnx.state(model, nnx.Param), tx, reference="frozen",
                                       method_state=method_state)
    return state, shardings, abstract


def test_round_trip_and_keep_last_n(tmp_path):
    mesh = ht.make_mesh(ht.MeshConfig())
    state, shardings, abstract = _setup(mesh)
    # Make the optimizer state non-trivial and the step non-zero.
    state = state.replace(step=jnp.int32(3),
                          opt_state=jax.tree.map(lambda x: x + 1, state.opt_state))
    it = iter(ht.prompt_dataset(RECORDS, batch_size=2, process_count=1, process_index=0))
    ckpt = ht.Checkpointer(ht.CheckpointConfig(directory=str(tmp_path), save_every=1, max_to_keep=2))
    for step in (1, 2, 3):
        next(it)
        assert ckpt.save(step, state, data_iterator=it, meta={"step": step})
    ckpt.wait()
    assert ckpt.all_steps() == [2, 3]
    expected_next = next(it)

    fresh = iter(ht.prompt_dataset(RECORDS, batch_size=2, process_count=1, process_index=0))
    restored, meta = ckpt.restore(abstract, shardings, data_iterator=fresh)
    ckpt.close()
    assert meta == {"step": 3}
    assert next(fresh) == expected_next
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert a.dtype == b.dtype
    assert jax.tree.structure(state) == jax.tree.structure(restored)
    assert int(restored.method_state["count"]) == 7
