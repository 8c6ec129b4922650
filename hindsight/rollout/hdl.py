"""HDL trees (spec §2), several prompts at once through one continuous-batching engine.

Per prompt: ``num_roots`` roots (one request, kept with their caches) -> verify -> one reflection
per root (same sampling params, so the rollout temperature; no grad; length-capped) -> score
each root under its hindsight context ``h`` by teacher forcing
(:func:`hindsight.sampling.score_logprobs`; ``h`` opens with the policy prompt's system turn and
question, so it continues a copy of the root's cache from there: :class:`CachedPrefix`) and under
the original context (the sampler's untruncated log-probs, which it records at the sampling
temperature and at 1, the spec's scoring temperature; at another one, a re-score), both at the
method's scoring temperature -> ``s_t = |logp_h - logp_orig|`` -> branch points
(:func:`hindsight.rollout.branching.choose_branch_points`) -> continuations branched from the
roots' cached prefixes (the token at ``b`` resampled, from the *original* context) plus fresh
rollouts for missing points -> verify the full sequences. Each stage is submitted from the
engine's result callback, so prompt ``k``'s continuations decode in the same slot batch as prompt
``k+1``'s roots.

A reflection continues its root's conversation (question, attempt, then a user turn with the
verifier feedback asking for the reflection: :func:`hindsight.rollout.prompts.reflection_turn`),
so it is sampled from the root's cached K/V in the same engine
(:meth:`hindsight.sampling.engine.Engine.submit_extend`): only the request turn is computed, and
the reflection rows fill free slots beside other trees' rows. (A separate reflection prompt that
pastes the attempt would prefill the whole attempt again, in an engine of its own with a longer
cache: on SmolLM2 that cost HDL a third of the decode time it saves.)

Shapes are fixed per call so that a training run compiles each once: hindsight scoring pads every
root to ``T`` and every ``h`` to at least the bucket of its expected length
(:func:`hindsight.sampling.score_logprobs`'s ``min_response_len`` / ``min_context_len``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from hindsight.methods.hdl import HDLConfig
from hindsight.rollout.assemble import GroupRows
from hindsight.rollout.branching import (TreeLayout, branch_eligibility, choose_branch_points,
                                         tree_layout)
from hindsight.rollout.prompts import (CORRECT_FEEDBACK, Templates, clip_tokens,
                                       hindsight_context, policy_prompt, reflection_turn)
from hindsight.rollout.runtime import PhaseClock, fit_width, make_engine, request_key
from hindsight.rollout.verification import Checked, Verifier, decode
from hindsight.sampling import CachedPrefix, SamplingParams, score_logprobs
from hindsight.sampling.buckets import round16
from hindsight.signals import hindsight_divergence_from_logprobs
from hindsight.tasks import Example

_ROOTS, _REFLECT, _BRANCH, _FRESH = range(4)
# Typical verifier feedback length (count_letters' "expected 3, got 5" is 7 SmolLM2 tokens): sizes
# the cache room for the reflection turn and the scoring shape of ``h``. Longer feedback cuts a
# reflection after a root that ran to the cap to the room left, and scores ``h`` at the next bucket.


REFLECTION_FRACTION = 8  # default reflection cap: T // 8


@dataclasses.dataclass(frozen=True)
class TreeOptions:
    """HDL rollout settings not held by the method config (OUR CHOICE).

    Attributes:
      reflection_max_tokens: cap on each reflection's length. Default (None): an eighth of the
        response cap ``T`` (at least 8). The spec's "max ~1k" is for long-CoT responses capped
        at ~8k tokens: the same eighth. Reflections are generated tokens (the token economics
        count them), two per 16-row group, so a cap of ``T/8`` bounds them at ``T/4`` per group,
        1/64 of a GRPO group whose rows run to the cap. A small model rambles to whatever cap it
        gets (SmolLM2's reflections nearly always reach it), and the verifier feedback, not the
        reflection, carries most of what ``h`` knows. A reflection whose conversation would
        overflow the engine's cache (feedback longer than expected after a root that ran to the
        cap) is cut to the room left; its length is recorded in :class:`TreeInfo`.
      hindsight_reflection_tokens: the reflection is left-truncated to this many tokens in ``h``
        (default: the reflection cap, i.e. no truncation).
      feedback_max_tokens: the verifier feedback is cut to this many tokens (an ellipsis marks the
        cut) before it enters the reflection turn and ``h``: the engine's cache and the scoring
        shape are sized for it, so a task with long feedback cannot overflow them (16: the
        synthetic tasks' feedback on SmolLM2's tokenizer is 5-12 tokens).
      rescore_original: score ``logp_orig`` by teacher forcing the roots after the prompt instead of
        reusing the sampler's log-probs (same weights; only rounding differs).
      templates: wording of the reflection turn and ``h``.
    """
    reflection_max_tokens: int | None = None
    hindsight_reflection_tokens: int | None = None
    feedback_max_tokens: int = 16
    rescore_original: bool = False
    templates: Templates = Templates()

    def __post_init__(self):
        for name in ("reflection_max_tokens", "hindsight_reflection_tokens",
                     "feedback_max_tokens"):
            v = getattr(self, name)
            if (v is not None or name == "feedback_max_tokens") and (
                    isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"`{name}` must be a positive int or None, got {v!r}")

    def clip_feedback(self, tokenizer, text: str) -> str:
        """``text`` cut to :attr:`feedback_max_tokens` tokens of ``tokenizer`` (the last one an
        ellipsis when cut)."""
        return clip_tokens(tokenizer, text, self.feedback_max_tokens)

    def reflection_cap(self, max_new_tokens: int) -> int:
        """The reflection cap for responses of at most ``max_new_tokens`` tokens."""
        if self.reflection_max_tokens is not None:
            return self.reflection_max_tokens
        return max(8, int(max_new_tokens) // REFLECTION_FRACTION)

    def hindsight_cap(self, max_new_tokens: int) -> int:
        """Reflection tokens kept in ``h``."""
        if self.hindsight_reflection_tokens is not None:
            return self.hindsight_reflection_tokens
        return self.reflection_cap(max_new_tokens)


@dataclasses.dataclass
class TreeInfo:
    """What a tree records besides its rows.

    Attributes:
      layout: row layout (:class:`hindsight.rollout.branching.TreeLayout`).
      points: ``[R, K]`` branch points, best first (-1: replaced by fresh rollouts).
      sources: per root, the selection step used (``"nms"``, ``"relaxed"``,
        ``"fresh"``).
      scores: ``[R, T]`` HDL scores.
      reflections: reflection texts; reflection_lengths: ``[R]`` their token counts.
      feedback: verifier feedback per root.
    """
    layout: TreeLayout
    points: np.ndarray
    sources: list[str]
    scores: np.ndarray
    reflections: list[str]
    reflection_lengths: np.ndarray
    feedback: list[str]


@dataclasses.dataclass
class _Tree:
    prompt: np.ndarray
    roots: object = None
    root_rewards: np.ndarray | None = None
    root_texts: list | None = None
    feedback: list | None = None
    reflections: dict = dataclasses.field(default_factory=dict)
    h: list | None = None
    points: np.ndarray | None = None
    sources: list | None = None
    scores: np.ndarray | None = None
    parts: dict = dataclasses.field(default_factory=dict)
    waiting: int = 0


def _template_overhead(examples, trees, build) -> int:
    """Tokens a template adds around the question (the most over ``examples``), rounded up to a
    multiple of 16 so that tokenisation differences at the seams do not change it."""
    return round16(max(len(build(ex)) - len(t.prompt) for ex, t in zip(examples, trees)))


def sample_trees(model, tokenizer, verifier: Verifier, examples: Sequence[Example], *, key,
                 params: SamplingParams, config: HDLConfig, options: TreeOptions = TreeOptions(),
                 slots: int | None = None, chunk_steps: int = 16,
                 clock: PhaseClock | None = None,
                 first_index: int = 0) -> tuple[list[GroupRows], list[TreeInfo]]:
    """Sample one HDL tree per example.

    Args:
      verifier: checks roots (their verdicts feed the reflections) and the finished trees' rows
        while other trees decode.
      examples: P examples.
      key: PRNG key; every request's key is folded from it along ``(prompt, stage, root)``, the
        prompt numbered from ``first_index`` (the offset of ``examples[0]`` in the caller's
        numbering), so a tree does not depend on which batch or process samples it.
      params: sampling parameters of roots, reflections and continuations (stop tokens included);
        ``T = params.max_new_tokens``.
      config: the HDL method config (roots, points, counts, tail guard, ``d_min`` rule).
      options: :class:`TreeOptions`.
      clock: records ``roots`` / ``reflection`` / ``continuations`` / ``fresh`` tokens and decode
        time, ``scoring`` / ``reflection`` / ``verify`` host time and ``verify_wait``.
    Returns:
      ``(groups, infos)``: P groups of ``config.group_size`` rows in the layout of
      :mod:`hindsight.rollout.branching`, with ``hindsight`` contexts per row, and P
      :class:`TreeInfo`.
    """
    clock = clock if clock is not None else PhaseClock()
    width, n_roots = params.max_new_tokens, config.num_roots
    branch_mask = getattr(verifier.task, "branch_mask", None)
    refl_cap, h_cap = options.reflection_cap(width), options.hindsight_cap(width)
    trees = [_Tree(prompt=np.asarray(policy_prompt(tokenizer, ex), np.int32)) for ex in examples]
    # The scoring shape is sized from the longest policy prompt and the template's overhead, each
    # rounded up to a multiple of 16: calls whose questions differ by a few tokens then share one
    # compiled shape.
    question = round16(max(len(t.prompt) for t in trees))
    h_floor = question + h_cap + options.feedback_max_tokens + _template_overhead(
        examples, trees, lambda ex: hindsight_context(
            tokenizer, ex, "", [], max_reflection_tokens=0, templates=options.templates))
    turn = max(len(reflection_turn(tokenizer, ex, "", templates=options.templates))
               for ex in examples)
    longest = max(len(t.prompt) for t in trees)
    # cache room for a root run to the cap, the reflection turn and the reflection, and for the
    # root scored after ``h`` in a copy of its own cache (``h`` is at most ``h_floor`` tokens but for
    # tokenisation seams; a pair that does not fit is scored from scratch)
    engine = make_engine(model, params, longest_prompt=longest, max_new_tokens=width,
                         rows=len(trees) * config.group_size, slots=slots, chunk_steps=chunk_steps,
                         min_len=max(longest + width + turn + options.feedback_max_tokens + refl_cap,
                                     h_floor + width))
    groups: dict[int, GroupRows] = {}
    infos: dict[int, TreeInfo] = {}

    def on_roots(k, res):
        clock.tokens["roots"] += int(res.lengths.sum())
        trees[k].roots = res
        with clock.host_phase("verify"):
            verifier.submit(examples[k], res.tokens, res.lengths,
                            lambda checked: reflect(k, checked))

    def reflect(k, checked: Checked):
        tree, ex, res = trees[k], examples[k], trees[k].roots
        tree.root_rewards, tree.feedback, tree.root_texts = \
            checked.rewards, checked.feedback, checked.texts
        with clock.host_phase("reflection"):
            turns, caps = [], []
            for r in range(n_roots):
                feedback = CORRECT_FEEDBACK if tree.root_rewards[r] >= 1.0 else tree.feedback[r]
                feedback = tree.feedback[r] = options.clip_feedback(tokenizer, feedback)
                ids = reflection_turn(tokenizer, ex, feedback, templates=options.templates)
                n = int(res.lengths[r])
                if n and res.tokens[r, n - 1] == ids[0]:
                    ids = ids[1:]  # the root ended its turn itself
                room = engine.max_len - int(res.prompt_lengths[r]) - n - len(ids)
                if room < 1:
                    raise ValueError(f"root {r} of example {k} and its reflection turn "
                                     f"({len(ids)} tokens) leave no room in the cache "
                                     f"({engine.max_len}) for a reflection")
                turns.append(ids), caps.append(min(refl_cap, room))
            engine.submit_extend(res, np.arange(n_roots), turns, max_new_tokens=caps,
                                 row_keys=jnp.stack([request_key(key, first_index + k, _REFLECT, r)
                                                     for r in range(n_roots)]),
                                 tag=(_REFLECT, k))

    def on_reflection(k, res):
        tree = trees[k]
        clock.tokens["reflection"] += int(res.lengths.sum())
        for r in range(n_roots):
            n = int(res.lengths[r])
            tree.reflections[r] = (res.tokens[r, :n], decode(tokenizer, res.tokens[r], n))
        with clock.host_phase("scoring"):
            _score_and_branch(k)

    def _score_and_branch(k):
        tree, ex, roots = trees[k], examples[k], trees[k].roots
        tree.h = [np.asarray(hindsight_context(
            tokenizer, ex, tree.feedback[r], list(tree.reflections[r][0]),
            max_reflection_tokens=h_cap,
            templates=options.templates), np.int32) for r in range(n_roots)]
        lengths = roots.lengths
        live = [r for r in range(n_roots) if lengths[r] > 0]
        sampled_at = params.policy_temperature
        temp = config.scoring_temp(sampled_at)

        def task_mask(r):  # the task's own rule (e.g. never inside the final answer), if any
            if branch_mask is None:
                return None
            n = int(lengths[r])
            return np.asarray(branch_mask(ex, [tokenizer.decode([int(t)])
                                               for t in roots.tokens[r, :n]]), bool)

        # logp_orig is the sampler's, at the sampling temperature or at 1 (the spec's scoring
        # temperature, which the engine records too: ``raw_logprobs``); at any other temperature,
        # or when a re-score is asked for, both sides are scored in one call
        recorded = {sampled_at: roots.policy_logprobs, 1.0: roots.raw_logprobs}
        rescore = options.rescore_original or temp not in recorded
        # a copy: rows are re-scored in place
        logp_orig = np.array(fit_width(recorded.get(temp, roots.policy_logprobs), width))
        logp_hind = np.zeros_like(logp_orig)
        if live:
            resp = [roots.tokens[r, :lengths[r]] for r in live]
            contexts = [tree.h[r] for r in live] + ([tree.prompt] * len(live) if rescore else [])
            rows = live * (2 if rescore else 1)
            # h opens with the policy prompt's system turn and question, whose K/V the root's
            # cache holds: each context continues a copy of its root's cache from there
            fits = all(c.size - 1 + int(lengths[r]) <= engine.max_len
                       for c, r in zip(contexts, rows))
            prefix = CachedPrefix.of(roots, rows) if fits else None
            scored = fit_width(np.asarray(score_logprobs(
                model, contexts, resp * (2 if rescore else 1), min_response_len=width,
                min_context_len=h_floor, temperature=temp, prefix=prefix)), width)
            logp_hind[live] = scored[:len(live)]
            if rescore:
                logp_orig[live] = scored[len(live):]
        mask = np.arange(width)[None, :] < lengths[:, None]
        tree.scores = np.asarray(hindsight_divergence_from_logprobs(logp_orig, logp_hind, mask))
        picks = [choose_branch_points(tree.scores[r], int(lengths[r]), config,
                                      eligible=branch_eligibility(
                                          fit_width(roots.tokens, width)[r], int(lengths[r]),
                                          params.stop_tokens, task_mask(r)))
                 for r in range(n_roots)]
        tree.points = np.stack([p for p, _ in picks])
        tree.sources = [s for _, s in picks]
        rows, positions, counts = [], [], []
        for r in range(n_roots):
            for p, c in zip(tree.points[r], config.counts):
                if p >= 0:
                    rows.append(r), positions.append(int(p)), counts.append(c)
        fresh = config.group_size - n_roots - sum(counts)
        if rows:
            tree.waiting += 1
            engine.submit_branch(roots, np.array(rows), np.array(positions), np.array(counts),
                                 key=request_key(key, first_index + k, _BRANCH), tag=(_BRANCH, k))
        if fresh:
            tree.waiting += 1
            engine.submit(tree.prompt, num_samples=fresh,
                          key=request_key(key, first_index + k, _FRESH),
                          tag=(_FRESH, k))

    def on_part(stage, k, res):
        tree = trees[k]
        tree.parts[stage] = res
        if stage == _BRANCH:
            clock.tokens["continuations"] += int((res.lengths - res.branch_positions).sum())
        else:
            clock.tokens["fresh"] += int(res.lengths.sum())
        if len(tree.parts) == tree.waiting:
            with clock.host_phase("verify"):
                _finish(k)

    def _finish(k):
        tree = trees[k]
        layout = tree_layout(tree.points, config)
        g = config.group_size
        tokens = np.zeros((g, width), np.int32)
        logprobs, policy_lp = np.zeros((g, width), np.float32), np.zeros((g, width), np.float32)
        lengths = np.zeros(g, np.int32)
        cursor = {_BRANCH: 0, _FRESH: 0}
        sources = {TreeLayout.CONTINUATION: _BRANCH, TreeLayout.FRESH: _FRESH}
        for i, (kind, r) in enumerate(zip(layout.kind, layout.root)):
            if kind == TreeLayout.ROOT:
                src, j = tree.roots, r
            else:
                stage = sources[int(kind)]
                src, j = tree.parts[stage], cursor[stage]
                cursor[stage] += 1
            tokens[i] = fit_width(src.tokens[j:j + 1], width)[0]
            logprobs[i] = fit_width(src.logprobs[j:j + 1], width)[0]
            policy_lp[i] = fit_width(src.policy_logprobs[j:j + 1], width)[0]
            lengths[i] = src.lengths[j]
        t = np.arange(width)[None, :]
        loss_mask = (t < lengths[:, None]) & (t >= layout.position[:, None])
        verifier.submit(examples[k], tokens, lengths, lambda checked: _store(
            k, layout, tokens, lengths, logprobs, policy_lp, loss_mask, checked))
        tree.roots = tree.parts = None  # release the cached prefixes

    def _store(k, layout, tokens, lengths, logprobs, policy_lp, loss_mask, checked: Checked):
        tree = trees[k]
        rewards, texts = checked.rewards, checked.texts
        refl_len = np.array([len(tree.reflections[r][0]) for r in range(n_roots)], np.int32)
        generated = int((lengths - layout.position).sum() + refl_len.sum())
        row = GroupRows(example=examples[k], example_index=first_index + k, prompt=tree.prompt, tokens=tokens,
                        lengths=lengths, logprobs=logprobs, policy_logprobs=policy_lp, loss_mask=loss_mask,
                        rewards=rewards, branch_positions=layout.position, texts=texts,
                        feedback=checked.feedback, generated_tokens=generated, hindsight=[tree.h[r] for r in layout.root])
        info = TreeInfo(layout=layout, points=tree.points, sources=tree.sources,
                        scores=tree.scores, reflections=[tree.reflections[r][1]
                                                         for r in range(n_roots)],
                        reflection_lengths=refl_len, feedback=tree.feedback)
        groups[k], infos[k] = row, info

    def on_result(tag, res):
        if tag[0] == _ROOTS:
            on_roots(tag[1], res)
        elif tag[0] == _REFLECT:
            on_reflection(tag[1], res)
        else:
            on_part(tag[0], tag[1], res)

    for k, tree in enumerate(trees):
        engine.submit(tree.prompt, num_samples=n_roots, key=request_key(key, first_index + k, _ROOTS),
                      keep_cache=True, tag=(_ROOTS, k))
    clock.run([engine], on_result, verifier)
    return [groups[k] for k in range(len(trees))], [infos[k] for k in range(len(trees))]
