"""Packed training rows (:mod:`hindsight.packing`): the packer's layout, the decoder's segments,
and every method's train-step loss and gradient on packed rows equal to those on padded rows
(one device here; sharded and micro-batched layouts in a child process with 8 CPU devices)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hindsight.train as ht
from hindsight.batch import CONTEXT_NAMES, check_batch, context_key
from hindsight.methods import REGISTRY
from hindsight.methods.forward import context_hidden
from hindsight.packing import (bucket_rows, first_fit, pack_batch, pack_context, packed_fraction,
                               packed_rows, shared_prefixes, with_packed_rows)
from hindsight.testing import make_batch, tiny_model
from tests.train.helpers import flat, max_rel_err, run_script
from tests.train.run_layout import GROUP, configured, step_for

TOL = 1e-5


@pytest.fixture(scope="module")
def model():
    return tiny_model(0)


@pytest.fixture(scope="module")
def batch(model):
    return {k: np.asarray(v) for k, v in make_batch(model, groups=2, group_size=GROUP,
                                                     seed=3).items()}


def test_first_fit_places_every_sequence_without_overlap():
    rng = np.random.default_rng(0)
    for shared in (False, True):
        for _ in range(50):
            lengths = rng.integers(0, 13, rng.integers(1, 20))
            group = np.where(shared & (lengths > 2), rng.integers(-1, 3, len(lengths)), -1)
            prefix = np.where(group >= 0, 2 + group % 2, 0)   # one prefix length per group
            bins, offsets, copy, n = first_fit(lengths, 12, prefix=prefix, group=group)
            used = np.zeros((n, 12), int)
            owner = {}   # (group, bin) -> its copy's offset: one copy per group and bin
            for i, (b, o, m) in enumerate(zip(bins, offsets, lengths)):
                p = prefix[i] if m else 0
                used[b, o:o + m - p] += 1
                if group[i] >= 0 and m:
                    assert copy[i] >= 0 and owner.setdefault((group[i], b), copy[i]) == copy[i]
                else:
                    assert copy[i] == -1
            for (g, b), o in owner.items():
                used[b, o:o + 2 + g % 2] += 1
            assert used.max() <= 1
            assert n <= max(1, len(lengths)) and n >= -(-used.sum() // 12)
            # a closed bin holds more than capacity - max(lengths) tokens (the dry run's bound)
            assert (used[:-1].sum(axis=1) > 12 - lengths.max()).all()
            if not shared:
                assert used.sum() == lengths.sum()
    with pytest.raises(ValueError, match="13 tokens does not fit rows of 12"):
        first_fit(np.array([13]), 12)


def test_shared_prefixes_are_the_prompts_a_chunk_has_in_common():
    # chunk 0: rows 0 and 2 share a prompt, row 1 trains from its third response token on (an
    # HDL continuation: its prefix reaches into the response); chunk 1: rows 4 and 5 share the
    # same prompt again (a prefix is shared within a chunk), row 3 has another
    tokens = np.array([[5, 6, 7, 1, 2, 0], [5, 6, 7, 1, 2, 3], [5, 6, 7, 4, 0, 0],
                       [5, 6, 8, 1, 0, 0], [5, 6, 7, 1, 0, 0], [5, 6, 7, 2, 0, 0]], np.int32)
    real = tokens > 0
    positions = np.broadcast_to(np.arange(6, dtype=np.int32), tokens.shape)
    target = np.broadcast_to(np.arange(2, 5, dtype=np.int32), (6, 3))
    mask = np.array([[1, 1, 0], [0, 0, 1], [1, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 0]])
    prefix, group = shared_prefixes(tokens, positions, real, target, mask, chunks=2)
    np.testing.assert_array_equal(group, [0, -1, 0, -1, 0, 0])
    np.testing.assert_array_equal(prefix, [3, 0, 3, 0, 3, 3])
    # the same prompt at other positions is another prefix
    shifted = positions.copy()
    shifted[2] += 1
    prefix, group = shared_prefixes(tokens, shifted, real, target, mask, chunks=1)
    np.testing.assert_array_equal(group, [0, -1, -1, -1, 0, 0])


def test_bucket_rows():
    assert [bucket_rows(n, 16) for n in (1, 2, 3, 15, 16)] == [2, 2, 4, 16, 16]
    assert [bucket_rows(n, 5) for n in (1, 5)] == [1, 5]


@pytest.mark.parametrize("row_multiple", [1, 2])
def test_pack_context_keeps_every_token_and_target(batch, row_multiple):
    for chunks in (1, 2, 4):
        p = pack_context(*(batch[k] for k in ("tokens", "positions", "attention_mask",
                                              "target_index")), chunks=chunks,
                         row_multiple=row_multiple)
        c, r, length = p["packed_tokens"].shape
        assert c == chunks and length == row_multiple * batch["tokens"].shape[1]
        # every row but the last of k * S positions holds at least k sequences of <= S tokens:
        # the dry run's worst case
        assert r <= bucket_rows(-(-16 // chunks // row_multiple), 16 // chunks)
        per = 16 // chunks
        shared = 0
        for i in range(16):
            c = i // per
            seg = p["packed_segments"][c] == i % per + 1
            real = batch["attention_mask"][i] > 0
            # the row's own tokens, after the copy of its shared prefix in the same packed row
            prefix = np.unique(p["packed_prefixes"][c][seg])
            assert len(prefix) <= 1
            head = (p["packed_segments"][c] == prefix[0]) & seg.any(axis=1)[:, None] \
                if len(prefix) and prefix[0] != i % per + 1 else np.zeros_like(seg)
            shared += head.sum()
            for key in ("packed_tokens", "packed_positions"):
                np.testing.assert_array_equal(
                    np.concatenate([p[key][c][head], p[key][c][seg]]),
                    batch[key.removeprefix("packed_")][i][real])
            got = p["packed_tokens"][i // per].reshape(-1)[p["target_index"][i]]
            want = batch["tokens"][i][batch["target_index"][i]]
            keep = batch["mask"][i] > 0
            np.testing.assert_array_equal(got[keep], want[keep])
        assert shared > 0   # the groups' prompts are laid once per packed row
    with pytest.raises(ValueError, match="must be a positive divisor of the rows"):
        pack_context(*(batch[k] for k in ("tokens", "positions", "attention_mask",
                                          "target_index")), chunks=3)
    with pytest.raises(ValueError, match="`row_multiple` must be an int >= 1, got 0"):
        pack_batch(batch, chunks=1, row_multiple=0)


def test_rows_of_twice_the_width_hold_sequences_longer_than_half_of_it():
    """Sequences of 0.6 S tokens take a row each at k = 1 (0.6 real tokens per position) and
    share rows of 2 S at k = 2 (three to a row: 0.9); the dry run's abstract shape is the worst
    case."""
    n, s = 12, 20
    tokens = np.arange(n * s, dtype=np.int32).reshape(n, s) + 1   # no two rows share a prefix
    mask = (np.arange(s)[None, :] < 12).repeat(n, axis=0).astype(np.int32)
    positions = np.broadcast_to(np.arange(s, dtype=np.int32), (n, s))
    target = np.broadcast_to(np.arange(4, 12, dtype=np.int32), (n, 8))
    one = pack_context(tokens, positions, mask, target, chunks=1)
    two = pack_context(tokens, positions, mask, target, chunks=1, row_multiple=2)
    assert one["packed_tokens"].shape == (1, 12, 20) and two["packed_tokens"].shape == (1, 4, 40)
    assert packed_fraction({"packed_segments": one["packed_segments"]}) == pytest.approx(0.6)
    assert packed_fraction({"packed_segments": two["packed_segments"]}) == pytest.approx(0.9)
    np.testing.assert_array_equal(two["packed_tokens"].reshape(-1)[two["target_index"]],
                                  np.take_along_axis(tokens, target, axis=1))
    abstract = pack_batch({"tokens": jax.ShapeDtypeStruct((n, s), np.int32),
                           "positions": jax.ShapeDtypeStruct((n, s), np.int32),
                           "attention_mask": jax.ShapeDtypeStruct((n, s), np.int32),
                           "target_index": jax.ShapeDtypeStruct((n, 8), np.int32)},
                          chunks=1, row_multiple=2)
    assert abstract["packed_tokens"].shape == (1, 6, 40)  # ceil(12 / 2) rows, bucketed


def test_packed_batch_passes_the_contract_and_saves_positions(batch):
    packed = pack_batch(batch, chunks=1)
    for ctx in (None, *CONTEXT_NAMES):
        assert context_key(ctx, "tokens") not in packed
        assert context_key(ctx, "packed_tokens") in packed
    check_batch(packed, method="test", contexts=CONTEXT_NAMES, fields=("logp_old",))
    assert packed_fraction(packed) > float(np.mean(batch["attention_mask"]))
    with pytest.raises(ValueError, match="packed already"):
        pack_batch(packed, chunks=1)


@pytest.mark.parametrize("row_multiple", [1, 2])
def test_packed_hidden_states_equal_padded(model, batch, row_multiple):
    rows = jax.jit(lambda b: {ctx or "policy": context_hidden(model, b, ctx).rows()
                              for ctx in (None, *CONTEXT_NAMES)})
    want, got = rows(batch), rows(pack_batch(batch, chunks=2, row_multiple=row_multiple))
    keep = batch["mask"] > 0
    for ctx in want:
        np.testing.assert_allclose(np.asarray(got[ctx])[keep], np.asarray(want[ctx])[keep],
                                   rtol=1e-5, atol=1e-5)


def test_padding_to_more_packed_rows_changes_no_state(model, batch):
    # Multi-process runs pad every process's packed contexts to the largest R of any process.
    packed = pack_batch(batch, chunks=2)
    rows = packed_rows(packed)
    assert list(rows) == [None, *CONTEXT_NAMES]
    wider = with_packed_rows(packed, {k: r + 3 for k, r in rows.items()})
    assert packed_rows(wider) == {k: r + 3 for k, r in rows.items()}
    assert packed_fraction(wider) < packed_fraction(packed)
    check_batch(wider, method="test", contexts=CONTEXT_NAMES)
    keep = batch["mask"] > 0
    rows_of = jax.jit(lambda b: context_hidden(model, b, "teacher").rows())
    np.testing.assert_allclose(np.asarray(rows_of(wider))[keep], np.asarray(rows_of(packed))[keep],
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="cannot shrink"):
        with_packed_rows(packed, {k: 0 for k in rows})


def test_segments_need_a_forward_without_cache(model):
    tokens = jnp.zeros((1, 4), jnp.int32)
    with pytest.raises(ValueError, match="without a cache"):
        model(tokens, tokens, segment_ids=tokens, cache=model.init_cache(1, 8))
    with pytest.raises(ValueError, match="`prefix_ids` name segments: they need `segment_ids`"):
        model(tokens, tokens, prefix_ids=tokens)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_method_trains_the_same_on_packed_rows(name, model, batch):
    method = configured(name)
    mesh = ht.make_mesh(ht.MeshConfig(data=1), devices=jax.devices()[:1])
    # gkd's default teacher is an external checkpoint: another random model here
    external = tiny_model(1) if getattr(method.config, "teacher", None) == "external" else None
    out = []
    for packing in (False, True):
        state, step = step_for(method, model, mesh, 16, 1, packing, external)
        grads, metrics = step.grads(state, batch)
        out.append((float(metrics["loss"]), flat(grads)))
    (loss, grads), (packed_loss, packed_grads) = out
    assert abs(packed_loss - loss) <= TOL * max(abs(loss), 1e-30), (loss, packed_loss)
    assert max_rel_err(packed_grads, grads) < TOL
    assert any(np.any(g != 0) for g in grads.values())


@pytest.mark.slow
def test_packed_rows_on_sharded_and_micro_batched_layouts():
    # One method per way a context reaches the model: grpo (policy + frozen reference), craft
    # (rows coupled by group), opsd_pmi (teacher, probe and base contexts).
    out = run_script("tests.train.run_layout", "grpo", "craft", "opsd_pmi", "--packed",
                     num_devices=8, timeout=900)
    for name, combos in out.items():
        for label, r in combos.items():
            if label == "credit" or (name == "craft" and label == "d8-k2-m4"):
                continue   # craft's groups of 8 do not fit 4 rows (test_layout checks the refusal)
            assert r["loss_rel"] < TOL and r["grads_rel"] < TOL, (name, label, r)
        assert sorted(combos) == ["credit", "d1-k1-m1", "d2-k1-m2", "d8-k2-m4"]


def test_a_run_with_packing_trains_like_one_without(tmp_path):
    import importlib
    import json

    from hindsight.train.loop import run

    out = {}
    for packing in (False, True):
        config = importlib.import_module("configs.grpo").get_config("tiny")
        config.train.update(num_steps=1, ppo_minibatches=2, packing=packing)
        config.eval.num_examples = 0
        workdir = tmp_path / str(packing)
        run(config, str(workdir), progress=False)
        with open(workdir / "updates.jsonl", encoding="utf-8") as f:
            out[packing] = [json.loads(line) for line in f]
        with open(workdir / "config.json", encoding="utf-8") as f:
            assert json.load(f)["train"]["packing"] is packing
    assert len(out[True]) == len(out[False]) == 2
    for padded, packed in zip(out[False], out[True]):
        assert 0 < packed["packed_fraction"] <= 1 and "packed_fraction" not in padded
        # the tiny config's groups share their prompt: its copies leave real tokens out
        assert 0 < packed["shared_tokens_saved"] < 1 and "shared_tokens_saved" not in padded
        for key in ("loss", "grad_norm", "ratio"):
            np.testing.assert_allclose(packed[key], padded[key], rtol=1e-5, atol=1e-7)
