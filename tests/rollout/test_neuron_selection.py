"""Neuron-OPSD's data selection (other-methods §8 steps 1-4, the preparation ``neuron_selection``):
``N(x)`` of a teacher-forced response against a float64 reference on the decoder's own
activations, for both layer layouts and any left padding; the pass end to end (pool, greedy
zero-shot responses, bottom-20% selection, K-nearest demonstrations) saved in the run directory
and reloaded, not recomputed; the ``few_shot`` teacher context in a rollout batch."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hindsight.models import Decoder, MLPReduce
from hindsight.models.decoder import unrolled
from hindsight.rollout import (GroupView, PrepareInputs, Templates, TrainSubset, collect,
                               prepare_task)
from hindsight.rollout import neuron_selection
from hindsight.rollout.contexts import row_context
from hindsight.rollout.prepare import result_path
from hindsight.sampling import SamplingParams
from hindsight.tasks import Example, get_task
from hindsight.testing.models import TINY
from tests.rollout.helpers import configured
from tests.signals.test_neurons import ref_neuron_set, ref_scores

OPTIONS = dict(pool_size=10, num_shots=3, neurons_per_layer=16, num_neurons=32, chunk_tokens=4)
WIDTH = 12  # new tokens of the zero-shot responses


def _pairs(seed=0):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, TINY.vocab_size, n).astype(np.int32) for n in (5, 9, 3)]
    responses = rng.integers(3, TINY.vocab_size, (3, 7)).astype(np.int32)
    return prompts, responses, np.array([7, 4, 1], np.int32)


def _reference_sets(model, prompts, responses, lengths, *, per_layer, num_neurons, chunk):
    """Each pair alone, unpadded: the activations from a fold that keeps them all, then the
    scores and the set in float64 NumPy."""
    cfg = model.config
    f = cfg.intermediate_size
    unembed = np.asarray(model.unembedding(), np.float64)  # [D, V]
    out = []
    for prompt, response, n in zip(prompts, responses, lengths):
        seq = np.concatenate([prompt, response[:n]])[None]
        keep = MLPReduce((jnp.zeros((cfg.num_layers, 1, seq.shape[1], f)),
                          jnp.zeros((cfg.num_layers, f, cfg.hidden_size))),
                         lambda acc, k, w, layer: (acc[0].at[layer].set(k),
                                                   acc[1].at[layer].set(w)))
        _, _, (acts, kernels) = model(jnp.asarray(seq), jnp.arange(seq.shape[1])[None],
                                      mlp_reduce=keep)
        start = len(prompt)
        scores = np.stack([ref_scores(np.asarray(acts[layer, 0, start - 1:start - 1 + n]),
                                      np.asarray(kernels[layer]), unembed[:, response[:n]].T)
                           for layer in range(cfg.num_layers)])
        want = ref_neuron_set(scores, np.ones(n, bool), per_layer=per_layer,
                              num_neurons=num_neurons, chunk=chunk)
        row = np.zeros(cfg.num_layers * f, bool)
        row[sorted(want)] = True
        out.append(row)
    return np.stack(out)


@pytest.fixture(scope="module")
def scanned():
    """A tiny decoder with stacked layers (the unrolled view is the same weights)."""
    return Decoder(TINY, scan_layers=True, rngs=nnx.Rngs(3))


def test_response_sets_match_float64_for_both_layouts(scanned):
    prompts, responses, lengths = _pairs()
    kw = dict(neurons_per_layer=20, num_neurons=25, chunk_tokens=3)
    want = _reference_sets(scanned, prompts, responses, lengths, per_layer=20, num_neurons=25,
                           chunk=3)
    for model in (scanned, unrolled(scanned)):
        got = neuron_selection.neuron_sets(model, prompts, responses, lengths, rows=2, **kw)
        np.testing.assert_array_equal(got, want)
    # left padding to a longer pool's prompts and another batch layout change nothing
    longer = prompts + [np.arange(3, 40, dtype=np.int32)]
    more = np.concatenate([responses, responses[:1]])
    got = neuron_selection.neuron_sets(scanned, longer, more, np.append(lengths, 7), rows=3, **kw)
    np.testing.assert_array_equal(got[:3], want)


@pytest.fixture(scope="module")
def prepared(model, tokenizer, tmp_path_factory):
    task = get_task("even_length")
    method = configured("neuron_opsd", group_size=2, max_new_tokens=WIDTH, **OPTIONS)
    inputs = PrepareInputs(seed=0, sampling=SamplingParams(max_new_tokens=WIDTH),
                           prompts_per_step=2)
    workdir = str(tmp_path_factory.mktemp("run"))
    view = prepare_task(method, task, model, tokenizer, inputs=inputs, workdir=workdir)
    return task, method, inputs, workdir, view


def test_selection_keeps_the_bottom_fifth_with_their_nearest_demonstrations(prepared, model,
                                                                            tokenizer):
    import json
    task, method, inputs, workdir, view = prepared
    with open(result_path(workdir, "neuron_selection"), encoding="utf-8") as f:
        result = json.load(f)
    pool = neuron_selection.pool_examples(task, pool_size=10, seed=0)
    assert result["prompts"] == [ex.prompt for ex in pool]
    sizes = np.asarray(result["consensus"])
    assert result["selected"] == np.argsort(sizes, kind="stable")[:math.ceil(0.2 * 10)].tolist()
    # greedy zero-shot responses: what the frozen model answers at temperature 0
    prompts, tokens, lengths = neuron_selection.zero_shot(
        model, tokenizer, pool, params=SamplingParams(temperature=0.0, max_new_tokens=WIDTH,
                                                      stop_tokens=(tokenizer.eos_token_id,)),
        key=jax.random.key(1))
    assert result["responses"] == [tokenizer.decode(list(t[:n]), skip_special_tokens=True)
                                   for t, n in zip(tokens, lengths)]
    # consensus is |N(x)| and the neighbours are the nearest others in Jaccard distance
    sets = neuron_selection.neuron_sets(model, prompts, tokens, lengths, neurons_per_layer=16,
                                        num_neurons=32, chunk_tokens=4)
    np.testing.assert_array_equal(sets.sum(-1), sizes)
    train = view.split_examples("train")
    assert isinstance(view, TrainSubset) and len(train) == 2
    for ex, i, near, dist in zip(train, result["selected"], result["neighbours"],
                                 result["distances"]):
        assert ex.prompt == pool[i].prompt and ex.data == pool[i].data and i not in near
        a = sets[i]
        jac = [1 - (a & sets[j]).sum() / max((a | sets[j]).sum(), 1) for j in range(10)]
        order = [j for j in np.argsort(jac, kind="stable") if j != i][:3]
        assert near == order and np.allclose(dist, [jac[j] for j in near], atol=1e-6)
        shots = ex.extra("few_shot")
        assert [q for q, _ in shots] == [pool[j].prompt for j in near]
        assert [r for _, r in shots] == [result["responses"][j] for j in near]
    # the rest is the task's: evaluation split and verifier
    assert view.examples(split="test", count=3, seed=0) == task.examples(split="test", count=3,
                                                                         seed=0)
    assert view.verify(train[0], "abcd") == task.verify(pool[result["selected"][0]], "abcd")
    assert view.name == task.name


def test_a_resumed_run_reloads_the_selection(prepared, model, tokenizer, monkeypatch):
    task, method, inputs, workdir, view = prepared

    def never(*args, **kwargs):
        raise AssertionError("the selection was computed again")

    monkeypatch.setattr(neuron_selection, "compute", never)
    again = prepare_task(method, task, model, tokenizer, inputs=inputs, workdir=workdir)
    assert again.split_examples("train") == view.split_examples("train")


def test_few_shot_context_reaches_the_batch(prepared, model, tokenizer):
    task, method, inputs, workdir, view = prepared
    train = view.split_examples("train")
    shots = train[0].extra("few_shot")
    group = GroupView(example=train[0], texts=["x"], rewards=np.zeros(1), feedback=[""],
                      templates=Templates(), rng=np.random.default_rng(0))
    context = row_context(group, 0, ("few_shot",))
    t = Templates()
    assert context.startswith(train[0].prompt)
    assert t.few_shot_example.format(question=shots[0][0], response=shots[0][1]) in context
    plain = GroupView(example=Example(prompt="no demonstrations", answer=""), texts=["x"],
                      rewards=np.zeros(1), feedback=[""], templates=t,
                      rng=np.random.default_rng(0))
    assert row_context(plain, 0, ("few_shot",)) is None
    batch, _ = collect(method, model, tokenizer, view, train, key=jax.random.key(0),
                       sampling=SamplingParams(max_new_tokens=WIDTH))
    np.testing.assert_array_equal(batch["teacher_row_mask"], np.ones(4, np.float32))
    first = tokenizer.decode([int(i) for i in batch["teacher_tokens"][0]])
    assert "Here are similar questions" in first and shots[0][0] in first


def test_too_small_a_selection_is_refused(model, tokenizer):
    method = configured("neuron_opsd", group_size=2, max_new_tokens=WIDTH, **OPTIONS)
    inputs = PrepareInputs(seed=0, sampling=SamplingParams(max_new_tokens=WIDTH),
                           prompts_per_step=3)
    with pytest.raises(ValueError, match=r"keeps 2 .*rollout.prompts_per_step=3"):
        prepare_task(method, get_task("even_length"), model, tokenizer, inputs=inputs)


def test_pool_keeps_each_question_once():
    """A repeated question would be its twin's nearest neighbour, its own answer as a shot."""
    class Repeating:
        name = "repeating"

        def examples(self, *, split, count, seed):
            return [Example(prompt=f"q{i % 3}", answer="") for i in range(count)]

    pool = neuron_selection.pool_examples(Repeating(), pool_size=7, seed=0)
    assert [ex.prompt for ex in pool] == ["q0", "q1", "q2"]
