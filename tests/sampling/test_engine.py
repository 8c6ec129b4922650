"""Continuous batching gives exactly what `generate` and `branch` give, whatever the slot schedule."""
import jax
import numpy as np
import pytest

from hindsight.sampling import SamplingParams, branch, generate
from hindsight.sampling.engine import Engine

PARAMS = SamplingParams(max_new_tokens=20, stop_tokens=(3,))
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10]]


def test_engine_matches_generate_and_branch(tiny):
    keys = jax.random.split(jax.random.key(1), 9)
    bkeys = jax.random.split(jax.random.key(5), 3)
    ref = generate(tiny, PROMPTS, PARAMS, num_samples=3, row_keys=keys, max_len=64)
    # 4 slots < 9 rows + 9 continuations: rows of different prompts and branches share the batch
    engine = Engine(tiny, PARAMS, slots=4, max_len=64, chunk_steps=4)
    for i, p in enumerate(PROMPTS):
        engine.submit(p, num_samples=3, row_keys=keys[3 * i: 3 * i + 3], keep_cache=True, tag=i)

    def on_result(tag, res):
        if isinstance(tag, int):
            engine.submit_branch(res, [0, 1], [min(2, res.lengths[0] - 1), 0], [2, 1], row_keys=bkeys,
                                 tag=("b", tag))

    out = engine.run(on_result)
    assert engine.idle and len(out) == 6
    for i in range(3):
        rows = slice(3 * i, 3 * i + 3)
        np.testing.assert_array_equal(out[i].tokens, ref.tokens[rows])
        np.testing.assert_allclose(out[i].logprobs, ref.logprobs[rows], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(out[i].lengths, ref.lengths[rows])
        expect = branch(tiny, ref, [3 * i, 3 * i + 1], [min(2, ref.lengths[3 * i] - 1), 0], [2, 1], row_keys=bkeys)
        got = out[("b", i)]
        np.testing.assert_array_equal(got.tokens, expect.tokens)
        np.testing.assert_array_equal(got.branch_positions, expect.branch_positions)
        np.testing.assert_allclose(got.policy_logprobs, expect.policy_logprobs, rtol=1e-5, atol=1e-6)


def test_the_slot_batch_shrinks_and_grows_without_changing_a_row(tiny):
    """Rows that end at different steps leave the batch to shrink (8 -> 4 -> 2 -> 1 slots, the
    decoding rows moved to the front), branches queued afterwards grow it again, and every row
    samples what `generate` and `branch` sample at a fixed width."""
    keys = jax.random.split(jax.random.key(7), 8)
    bkeys = jax.random.split(jax.random.key(8), 6)
    params = SamplingParams(max_new_tokens=24, stop_tokens=())  # rows end at their caps only
    caps = np.array([3, 24, 5, 9, 2, 17, 12, 6])
    ref = generate(tiny, [PROMPTS[1]], params, num_samples=8, row_keys=keys, max_new_tokens=caps,
                   max_len=64)
    engine = Engine(tiny, params, slots=8, min_slots=1, max_len=64, chunk_steps=2)
    widths = []
    step = engine.step
    engine.step = lambda: (widths.append(len(engine._owner)), step())[1]
    engine.submit(PROMPTS[1], num_samples=8, row_keys=keys, max_new_tokens=caps, keep_cache=True,
                  tag="roots")

    def on_result(tag, res):
        if tag == "roots":
            engine.submit_branch(res, [1, 5, 6], [10, 1, 4], [3, 2, 1], row_keys=bkeys, tag="branches")

    out = engine.run(on_result)
    assert engine.stats["resizes"] >= 3 and 1 in widths[:-1] and widths[-1] == 8, widths
    got = out["roots"]
    np.testing.assert_array_equal(got.tokens, ref.tokens)
    np.testing.assert_array_equal(got.lengths, caps)
    np.testing.assert_allclose(got.logprobs, ref.logprobs, rtol=1e-5, atol=1e-6)
    expect = branch(tiny, ref, [1, 5, 6], [10, 1, 4], [3, 2, 1], row_keys=bkeys)
    np.testing.assert_array_equal(out["branches"].tokens, expect.tokens)
    np.testing.assert_allclose(out["branches"].policy_logprobs, expect.policy_logprobs,
                               rtol=1e-5, atol=1e-6)
    assert engine.stats["slot_steps"] < engine.stats["steps"] * 8  # narrower batches were run


def test_queued_branches_take_slots_longest_budget_first_and_sample_the_same(tiny):
    """Two branch requests queued together: the free slots go to the rows that may decode the
    most tokens (early branch points), across requests, ties in submission order; every row then
    samples what `branch` samples at once."""
    keys = jax.random.split(jax.random.key(11), 2)
    params = SamplingParams(max_new_tokens=24, stop_tokens=())  # rows end at their caps only
    ref = generate(tiny, [PROMPTS[1]], params, num_samples=2, row_keys=keys, max_len=64)
    requests = {"late": ([0, 1], [20, 18], [2, 1], jax.random.split(jax.random.key(12), 3)),
                "early": ([1, 0], [2, 9], [1, 2], jax.random.split(jax.random.key(13), 3))}
    engine = Engine(tiny, params, slots=2, min_slots=2, max_len=64, chunk_steps=4)
    engine.submit(PROMPTS[1], num_samples=2, row_keys=keys, keep_cache=True, tag="roots")
    placed = []
    refill = engine._refill

    def record(host):
        before = list(engine._owner)
        refill(host)
        placed.extend((o[0].tag, int(o[1])) for o, b in zip(engine._owner, before)
                      if o is not None and b is None and o[0].tag != "roots")

    engine._refill = record

    def on_result(tag, res):
        if tag == "roots":
            for name, (rows, pos, counts, bkeys) in requests.items():
                engine.submit_branch(res, rows, pos, counts, row_keys=bkeys, tag=name)

    out = engine.run(on_result)
    # budgets (tokens each may decode, max_new - position + 1): early 23 (row 0), 16 (rows 1, 2);
    # late 5, 5 (rows 0, 1), 7 (row 2)
    assert placed[:2] == [("early", 0), ("early", 1)], placed
    assert placed[2] == ("early", 2) and placed[3] == ("late", 2), placed
    for name, (rows, pos, counts, bkeys) in requests.items():
        expect = branch(tiny, ref, rows, pos, counts, row_keys=bkeys)
        np.testing.assert_array_equal(out[name].tokens, expect.tokens)
        np.testing.assert_array_equal(out[name].branch_positions, expect.branch_positions)
        np.testing.assert_allclose(out[name].policy_logprobs, expect.policy_logprobs,
                                   rtol=1e-5, atol=1e-6)


def test_prompts_prefilled_in_power_of_two_batches_without_padding_rows(tiny):
    """Three prompts placed at once prefill as 2 + 1 (not padded to 4) and sample what `generate`
    samples."""
    keys = jax.random.split(jax.random.key(2), 9)
    ref = generate(tiny, PROMPTS, PARAMS, num_samples=3, row_keys=keys, max_len=64)
    engine = Engine(tiny, PARAMS, slots=16, max_len=64)
    for i, p in enumerate(PROMPTS):
        engine.submit(p, num_samples=3, row_keys=keys[3 * i: 3 * i + 3], tag=i)
    out = engine.run()
    assert engine.stats["prefills"] == 2
    assert engine.stats["row_steps"] == int((ref.lengths).sum())  # one decoded token per row-step
    for i in range(3):
        np.testing.assert_array_equal(out[i].tokens, ref.tokens[3 * i: 3 * i + 3])
        np.testing.assert_allclose(out[i].policy_logprobs, ref.policy_logprobs[3 * i: 3 * i + 3],
                                   rtol=1e-5, atol=1e-6)


def test_extension_samples_what_a_prompt_of_the_whole_conversation_samples(tiny):
    """A follow-up turn after sampled answers (a row that stopped and one that hit its cap), from
    their cached K/V, samples exactly what the concatenated sequence sampled as a prompt does,
    and decodes in the slot batch beside other work."""
    keys = jax.random.split(jax.random.key(3), 3)
    params = SamplingParams(max_new_tokens=12, stop_tokens=(7,))
    engine = Engine(tiny, params, slots=4, max_len=64, chunk_steps=3)
    engine.submit(PROMPTS[1], num_samples=3, row_keys=keys, keep_cache=True, tag="first")
    first = engine.run()["first"]
    assert first.stopped.any() and not first.stopped.all()  # both kinds of sequence end
    suffixes = [[7, 8, 9, 10, 11], [12], [13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29]]
    ext_keys = jax.random.split(jax.random.key(4), 3)
    engine.submit(PROMPTS[0], num_samples=4, key=jax.random.key(5), tag="beside")
    engine.submit_extend(first, [2, 0, 1], suffixes, max_new_tokens=[9, 5, 9], row_keys=ext_keys,
                         tag="ext")
    out = engine.run()
    assert engine.stats["extends"] == 1
    got = out["ext"]
    for i, (row, suffix, cap) in enumerate(zip([2, 0, 1], suffixes, [9, 5, 9])):
        whole = list(first.sequence(row)) + suffix
        ref = generate(tiny, [whole], params, row_keys=ext_keys[i:i + 1], max_new_tokens=cap, max_len=64)
        n = int(ref.lengths[0])
        assert got.lengths[i] == n and got.prompt_lengths[i] == len(whole) and got.parents[i] == row
        np.testing.assert_array_equal(got.tokens[i, :n], ref.tokens[0, :n])
        np.testing.assert_allclose(got.policy_logprobs[i, :n], ref.policy_logprobs[0, :n], rtol=1e-5,
                                   atol=1e-5)
        np.testing.assert_array_equal(got.sequence(i), list(whole) + list(ref.tokens[0, :n]))
    with pytest.raises(ValueError, match="exceeds the engine's max_len"):
        engine.submit_extend(first, [0], [list(range(1, 60))])
    with pytest.raises(ValueError, match="outside the 3 rollout rows"):
        engine.submit_extend(first, [3], [[1]])
    with pytest.raises(TypeError, match="integers"):
        engine.submit_extend(first, [0.5], [[1]])
    with pytest.raises(ValueError, match="2 rows but 1 suffixes"):
        engine.submit_extend(first, [0, 1], [[1]])
    with pytest.raises(ValueError, match="keep_cache"):
        engine.submit_extend(out["beside"], [0], [[1]])


def test_long_prompts_and_turns_are_fed_in_pieces(tiny, monkeypatch):
    """A prompt or a follow-up turn longer than ``EXTEND_CHUNK`` is fed in pieces of that many
    positions (programs at the piece widths only, whatever the lengths) and samples what one pass
    over it samples."""
    import hindsight.sampling.decode as decode

    params = SamplingParams(max_new_tokens=6, stop_tokens=(3,))
    prompt, turn = list(range(5, 45)), list(range(50, 73))

    def run():
        engine = Engine(tiny, params, slots=2, max_len=128, chunk_steps=3)
        engine.submit(prompt, num_samples=2, key=jax.random.key(0), keep_cache=True, tag="first")
        first = engine.run()["first"]
        engine.submit_extend(first, [0, 1], [turn, turn[:5]],
                             row_keys=jax.random.split(jax.random.key(1), 2), tag="turn")
        return first, engine.run()["turn"]

    whole = run()
    widths, extend = [], decode.extend

    def spy(graphdef, weights, cache, tokens, positions, **kw):
        widths.append(tokens.shape[1])
        return extend(graphdef, weights, cache, tokens, positions, **kw)

    monkeypatch.setattr(decode, "EXTEND_CHUNK", 8)
    monkeypatch.setattr(decode, "extend", spy)
    pieces = run()
    # the prompt: 16 prefilled, 24 more in 3 pieces; the turn's 24 fed tokens in 3 pieces
    assert widths == [16] * 6
    for got, want in zip(pieces, whole):
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_allclose(got.policy_logprobs, want.policy_logprobs, rtol=1e-5, atol=1e-5)


def test_engine_rejects_bad_input(tiny):
    engine = Engine(tiny, PARAMS, slots=2, max_len=32)
    with pytest.raises(ValueError, match="exceeds the engine's max_len"):
        engine.submit(list(range(1, 20)))
    with pytest.raises(ValueError, match="empty"):
        engine.submit([])
    with pytest.raises(ValueError, match="unknown stop token"):
        engine.submit([1, 2], stop_tokens=[96])
    engine.submit([1, 2], tag="x")
    res = engine.run()["x"]
    with pytest.raises(ValueError, match="keep_cache"):
        engine.submit_branch(res, [0], [1])


def test_a_result_that_takes_over_the_slot_batch_stays_valid(tiny):
    """A kept request that filled the whole slot batch alone takes its cache over (as every
    `generate` does); the engine then decodes more work in a fresh batch, and the result's cache
    is neither donated nor overwritten: branching it still equals `branch` of `generate`."""
    keys = jax.random.split(jax.random.key(6), 4)
    bkeys = jax.random.split(jax.random.key(8), 2)
    engine = Engine(tiny, PARAMS, slots=4, max_len=64, chunk_steps=64)
    engine.submit(PROMPTS[1], num_samples=4, row_keys=keys, keep_cache=True, tag="a")
    first = engine.run()["a"]
    assert engine._state is None  # handed over, not copied
    before = [np.asarray(x) for x in jax.tree.leaves(first.state.cache)]
    positions = [min(1, int(first.lengths[0]) - 1), 0]
    engine.submit(PROMPTS[0], num_samples=4, key=jax.random.key(7), tag="b")
    engine.submit_branch(first, [0, 3], positions, row_keys=bkeys, tag="c")
    out = engine.run()
    for old, now in zip(before, jax.tree.leaves(first.state.cache)):
        np.testing.assert_array_equal(old, np.asarray(now))
    ref = generate(tiny, [PROMPTS[1]], PARAMS, num_samples=4, row_keys=keys, max_len=64)
    np.testing.assert_array_equal(first.tokens, ref.tokens)
    expect = branch(tiny, ref, [0, 3], positions, row_keys=bkeys)
    np.testing.assert_array_equal(out["c"].tokens, expect.tokens)
    np.testing.assert_allclose(out["c"].logprobs, expect.logprobs, rtol=1e-5, atol=1e-6)
    fresh = generate(tiny, [PROMPTS[0]], PARAMS, num_samples=4, key=jax.random.key(7), max_len=64)
    np.testing.assert_array_equal(out["b"].tokens, fresh.tokens)


def test_stop_check_ends_rows_at_the_cut_with_the_uncut_prefix():
    """A stop check ends a row while decoding, at the length it returns; the kept tokens and
    log-probs are the uncut row's prefix, and the row can be extended from there."""
    from hindsight.testing import char_model
    from hindsight.sampling import SamplingParams
    from hindsight.sampling.engine import Engine

    model = char_model(0)
    params = SamplingParams(max_new_tokens=24)

    def run(check):
        engine = Engine(model, params, slots=4, max_len=64, chunk_steps=4)
        engine.submit([1, 5, 6, 7], num_samples=3, key=jax.random.key(3), stop_check=check,
                      keep_cache=True, tag="p")
        return engine, engine.run()["p"]

    _, full = run(None)
    rows = {int(full.tokens[r, 0]): r for r in range(3)}
    assert len(rows) == 3, "the test needs distinct first tokens"
    firsts = sorted(rows)
    cuts = {firsts[0]: 5, firsts[1]: 9}  # by the row's first token; the third row never stops

    def check(ids):
        n = cuts.get(int(ids[0]))
        return n if n is not None and len(ids) >= n else None

    engine, cut = run(check)
    for first, r in rows.items():
        n = cuts.get(first, int(full.lengths[r]))
        assert cut.lengths[r] == n and cut.stopped[r] == (first in firsts[:2])
        np.testing.assert_array_equal(cut.tokens[r, :n], full.tokens[r, :n])
        np.testing.assert_allclose(cut.policy_logprobs[r, :n], full.policy_logprobs[r, :n], atol=1e-6)
    assert engine.stats["stop_dropped_tokens"] >= 0
    # the cut row continues from its cache like any finished row
    r = rows[firsts[0]]
    engine.submit_extend(cut, [r], [[9, 9]], max_new_tokens=4, key=jax.random.key(4), tag="x")
    out = engine.run()["x"]
    assert out.prompt_lengths[0] == 4 + 5 + 2
    with pytest.raises(TypeError, match="stop_check"):
        engine.submit([1, 2], stop_check="</a>")


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_raw_logprobs_equal_a_rescore_at_temperature_one(tiny, temperature):
    """``raw_logprobs`` (kept so that HDL's scoring at temperature 1 needs no re-score) equal a
    teacher-forced score at temperature 1 of fresh rows, of branches (the parent's prefix kept,
    the rest their own) and of an extension's new turn; at temperature 1 they are the policy's."""
    from hindsight.sampling import score_logprobs

    params = SamplingParams(max_new_tokens=12, temperature=temperature, stop_tokens=(3,))
    engine = Engine(tiny, params, slots=4, max_len=64, chunk_steps=4)
    engine.submit(PROMPTS[1], num_samples=2, key=jax.random.key(7), keep_cache=True, tag="roots")
    roots = engine.run()["roots"]
    engine.submit_branch(roots, [0, 1], [min(3, roots.lengths[0] - 1), 0], [1, 1],
                         key=jax.random.key(8), tag="branches")
    engine.submit_extend(roots, [0], [[11, 12, 13]], max_new_tokens=6, key=jax.random.key(9),
                         tag="extended")
    out = engine.run()
    for res, contexts in ((roots, [PROMPTS[1]] * 2),
                          (out["branches"], [PROMPTS[1]] * 2),
                          (out["extended"], [list(roots.sequence(0)) + [11, 12, 13]])):
        responses = [res.tokens[r, :res.lengths[r]] for r in range(res.num_rows)]
        want = np.asarray(score_logprobs(tiny, contexts, responses, temperature=1.0))
        np.testing.assert_allclose(res.raw_logprobs[:, :want.shape[1]], want, rtol=1e-5, atol=1e-5)
        assert (res.raw_logprobs[~res.mask] == 0).all()
        if temperature == 1.0:
            np.testing.assert_array_equal(res.raw_logprobs, res.policy_logprobs)
        else:
            assert not np.allclose(res.raw_logprobs[res.mask], res.policy_logprobs[res.mask])


def test_decode_windows_grow_with_the_rows_and_change_nothing(tiny, monkeypatch):
    """The engine's decode chunks attend over the cache's live front only (128, then 256, then
    all 512 slots as the rows advance) and sample what `generate` samples over the whole cache
    (one chunk: its window is the cache)."""
    from hindsight.sampling import engine as engine_module

    windows, decode_steps = [], engine_module.decode_steps

    def recorded(*args, window, **kw):
        windows.append(window)
        return decode_steps(*args, window=window, **kw)

    monkeypatch.setattr(engine_module, "decode_steps", recorded)
    params = SamplingParams(max_new_tokens=300, stop_tokens=())
    keys = jax.random.split(jax.random.key(3), 2)
    ref = generate(tiny, [PROMPTS[0]], params, num_samples=2, row_keys=keys, max_len=512)
    # generate's one chunk ends where its rows cross into a larger window
    assert windows == [128, 256, 512], windows
    windows.clear()
    engine = Engine(tiny, params, slots=2, max_len=512, chunk_steps=16)
    engine.submit(PROMPTS[0], num_samples=2, row_keys=keys, tag="x")
    got = engine.run()["x"]
    assert windows[0] == 128 and set(windows) == {128, 256, 512}, windows
    assert windows == sorted(windows)
    np.testing.assert_array_equal(got.tokens, ref.tokens)
    np.testing.assert_allclose(got.logprobs, ref.logprobs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.raw_logprobs, ref.raw_logprobs, rtol=1e-5, atol=1e-6)


def test_kv_window_covers_every_position_a_chunk_feeds():
    from hindsight.sampling.decode import kv_window

    assert kv_window(0, 16, 1024) == 128          # the floor
    assert kv_window(112, 16, 1024) == 128        # feeds 112..127
    assert kv_window(113, 16, 1024) == 256        # feeds 128
    assert kv_window(500, 16, 384) == 384         # never past the cache
    for pos, steps in ((0, 1), (127, 1), (200, 16), (1000, 64)):
        w = kv_window(pos, steps, 4096)
        assert pos + steps - 1 < w and w & (w - 1) == 0


def test_extension_and_prefill_windows_leave_the_cache_as_the_whole_cache_does(tiny):
    """A turn appended early in a long cache attends over the window holding its positions only
    (`window_over`: padding positions at or past the cache do not count); the cache it leaves
    equals the whole-cache pass's, and a prefill's (windowed inside) the plain forward's K/V."""
    import jax.numpy as jnp

    from hindsight.sampling.decode import extend, graph_and_weights, prefill, window_over

    assert window_over(np.array([[5, 6, 512], [130, 131, 512]]), 512) == 256
    assert window_over(np.array([[512, 512]]), 512) == 128
    graphdef, weights = graph_and_weights(tiny, unroll=True)
    prompts = jnp.asarray(np.array([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]], np.int32))
    cache = prefill(graphdef, weights, prompts, max_len=512)
    k = np.asarray(cache.k)
    plain = tiny.init_cache(2, 512)
    _, plain = tiny(prompts, jnp.broadcast_to(jnp.arange(6), (2, 6)), cache=plain)
    np.testing.assert_allclose(k, np.asarray(plain.k), rtol=1e-6, atol=1e-6)
    feed = jnp.asarray(np.array([[13, 14, 15, 16], [17, 18, 0, 0]], np.int32))
    positions = np.array([[6, 7, 8, 9], [6, 7, 512, 512]], np.int32)   # row 1 padded
    window = window_over(positions, 512)
    assert window == 128
    copy = lambda c: jax.tree.map(jnp.copy, c)
    whole = extend(graphdef, weights, copy(cache), feed, jnp.asarray(positions))
    part = extend(graphdef, weights, copy(cache), feed, jnp.asarray(positions), window=window)
    np.testing.assert_allclose(np.asarray(part.k), np.asarray(whole.k), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(part.v), np.asarray(whole.v), rtol=1e-6, atol=1e-6)
