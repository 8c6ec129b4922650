"""HDL trees on episodes (spec §2 with §0's turn conventions): roots are episodes, branch points
fall on the action tokens of any turn, a continuation is a new episode that shares its root's
history up to the branch point (reused from the root's cache of that turn) and whose environment
replays the root's earlier actions before it steps the continuation's own.

Per example: ``num_roots`` root episodes -> when all have ended, one reflection per root,
continuing the root's conversation after its last turn (the episode's outcome as feedback:
"verified correct" for a return at the task's maximum, else the environment's last feedback or
why the episode ended; :func:`hindsight.rollout.prompts.reflection_turn`) -> each root's whole
response (actions and observations) scored by teacher forcing under its hindsight context ``h``
(the episode's first turn, the feedback and the reflection;
:func:`hindsight.rollout.prompts.hindsight_context`), continuing a copy of the root's cache row
from the first turn on (:class:`hindsight.sampling.CachedPrefix`), and against the sampler's
policy log-probs
-> ``s_t = |logp_h - logp_orig|`` on action tokens (observations are the environment's: never
scored, never branched) -> branch points (:func:`hindsight.rollout.branching.choose_branch_points`
restricted to action tokens) -> continuations (:meth:`EpisodePlayer.branch`) and fresh episodes
for missing points, in the same engine while other trees decode.

A continuation's loss mask covers its action tokens from the branch point on; the history it
shares with the root is trained through the root's row. Rows come in
:func:`hindsight.rollout.branching.tree_layout`'s order, and row ``i`` of example ``k`` is
episode ``(k, i)`` (its keys: :class:`EpisodePlayer`).
"""
from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from hindsight.envs import EnvPool
from hindsight.methods.hdl import HDLConfig
from hindsight.rollout.assemble import GroupRows
from hindsight.rollout.branching import (TreeLayout, branch_eligibility, choose_branch_points,
                                         tree_layout)
from hindsight.rollout.episodes import Episode, EpisodePlayer
from hindsight.rollout.hdl import TreeInfo, TreeOptions
from hindsight.rollout.prompts import CORRECT_FEEDBACK, hindsight_context, reflection_turn
from hindsight.rollout.runtime import PhaseClock, fit_width, request_key
from hindsight.rollout.verification import decode
from hindsight.sampling import CachedPrefix, SamplingParams, score_logprobs
from hindsight.signals import hindsight_divergence_from_logprobs
from hindsight.tasks import Example
from hindsight.tasks.base import reward_range

_REFLECT = 1  # request-key stage, as in hindsight.rollout.hdl


def sample_episode_trees(model, tokenizer, task, pool: EnvPool, examples: Sequence[Example], *,
                         key, params: SamplingParams, config: HDLConfig, max_turns: int,
                         episode_tokens: int, options: TreeOptions = TreeOptions(),
                         slots: int | None = None, chunk_steps: int = 16,
                         clock: PhaseClock | None = None, first_index: int = 0
                         ) -> tuple[list[GroupRows], list[TreeInfo], list[list[Episode]]]:
    """One HDL tree of episodes per example.

    Args:
      task: an :class:`hindsight.tasks.episodic.EpisodeTask`; pool: environments of ``task.env``
        (at most ``P * G`` run at once: a root's worker serves a continuation once it ends).
      key: PRNG key; params: sampling parameters (``max_new_tokens`` caps one turn).
      config: the HDL method config (roots, points, counts, guards); options: reflection caps
        and wording (:class:`hindsight.rollout.hdl.TreeOptions`).
      max_turns, episode_tokens: as :func:`hindsight.rollout.episodes.sample_episodes`.
      clock: ``turns`` tokens (roots, continuations' new tokens and fresh episodes),
        ``reflection`` tokens; ``scoring`` / ``reflection`` host time, ``env`` / ``env_wait``.
    Returns:
      ``(groups, infos, episodes)``: P groups of ``config.group_size`` rows in the tree layout
      (``branch_positions`` the continuations' response positions, ``hindsight`` the root's ``h``
      per row), P :class:`TreeInfo` (``scores [R, T]`` over the whole response, 0 on
      observations) and the played episodes per group in row order.
    """
    clock = clock if clock is not None else PhaseClock()
    g_size, n_roots, width = config.group_size, config.num_roots, int(episode_tokens)
    if pool.num_workers < len(examples) * n_roots:
        raise ValueError(f"{len(examples) * n_roots} root episodes ({len(examples)} examples x "
                         f"{n_roots}) start at once and need as many environment workers; the "
                         f"pool has {pool.num_workers}")
    layouts = tree_layout(np.zeros((n_roots, config.num_points), np.int32), config)
    root_rows = [int(i) for i in np.nonzero(layouts.kind == TreeLayout.ROOT)[0]]
    refl_cap, h_cap = options.reflection_cap(params.max_new_tokens), \
        options.hindsight_cap(params.max_new_tokens)
    low, high = reward_range(task)
    reflections: dict[tuple, tuple] = {}
    trees: dict[int, dict] = {k: {} for k in range(len(examples))}
    groups: dict[int, GroupRows] = {}
    infos: dict[int, TreeInfo] = {}

    def on_finish(ep: Episode) -> None:
        k, i = ep.key
        tree = trees[k]
        if i in root_rows and "points" not in tree:
            if all(player.episodes[(k, r)].status is not None for r in root_rows):
                with clock.host_phase("reflection"):
                    reflect(k)
        elif "points" in tree and all(player.episodes.get((k, j)) is not None and
                                      player.episodes[(k, j)].status is not None
                                      for j in range(g_size)):
            finish_tree(k)

    def feedback_of(ep: Episode) -> str:
        ret = float(np.clip(sum(ep.rewards), low, high))
        if ep.status == "done" and ret >= high:
            text = CORRECT_FEEDBACK
        else:
            text = f"episode ended ({ep.status}) with return {ret:g}" + (
                f": {ep.feedback}" if ep.feedback else "")
        return options.clip_feedback(tokenizer, text)

    def reflect(k: int) -> None:
        tree, ex = trees[k], examples[k]
        tree["points"] = None  # reflection under way: the roots are final
        tree["feedback"] = {r: feedback_of(player.episodes[(k, r)]) for r in root_rows}
        tree["waiting"] = 0
        for r in root_rows:
            ep = player.episodes[(k, r)]
            if ep.source is None:  # the environment failed before the first turn
                reflections[(k, r)] = (np.zeros(0, np.int32), "")
                continue
            res, row = ep.source
            ids = reflection_turn(tokenizer, ex, tree["feedback"][r], templates=options.templates)
            if ep.ended_turn and ids and ids[0] == ep.pieces[-1].ids[-1]:
                ids = ids[1:]
            room = engine.max_len - int(res.prompt_lengths[row] + res.lengths[row]) - len(ids)
            if room < 1:
                reflections[(k, r)] = (np.zeros(0, np.int32), "")
                continue
            tree["waiting"] += 1
            engine.submit_extend(res, [row], [ids], max_new_tokens=min(refl_cap, room),
                                 row_keys=jnp.stack([request_key(key, first_index + k, _REFLECT, r)]),
                                 tag=("reflect", k, r))
        if not tree["waiting"]:
            score_and_branch(k)

    def on_other(tag, res) -> None:
        _, k, r = tag
        n = int(res.lengths[0])
        clock.tokens["reflection"] += n
        reflections[(k, r)] = (res.tokens[0, :n], decode(tokenizer, res.tokens[0], n))
        trees[k]["waiting"] -= 1
        if not trees[k]["waiting"]:
            with clock.host_phase("scoring"):
                score_and_branch(k)

    def score_and_branch(k: int) -> None:
        tree, ex = trees[k], examples[k]
        roots = [player.episodes[(k, r)] for r in root_rows]
        arrays = [ep.arrays(width, max_turns) for ep in roots]
        tree["h"] = [np.asarray(hindsight_context(
            tokenizer, ex, tree["feedback"][r], list(reflections[(k, r)][0]),
            max_reflection_tokens=h_cap, templates=options.templates,
            question=ep.first_turn), np.int32) for r, ep in zip(root_rows, roots)]
        lengths = np.array([ep.length for ep in roots], np.int32)
        mask = np.stack([a["mask"] for a in arrays])
        sampled_at = params.policy_temperature
        temp = config.scoring_temp(sampled_at)
        # logp_orig is the sampler's, at the sampling temperature or at 1 (the spec's scoring
        # temperature; the engine records both); at another temperature the episodes are
        # re-scored after their own prompts in the same call
        recorded = {sampled_at: "policy_logprobs", 1.0: "raw_logprobs"}
        rescore = temp not in recorded
        logp_orig = np.stack([a[recorded.get(temp, "policy_logprobs")] for a in arrays])
        logp_hind = np.zeros_like(logp_orig)
        live = [j for j in range(n_roots) if mask[j].any()]
        for j in live:
            # h opens with the episode's first turn, whose K/V the root's cache of its last turn
            # holds (with every later turn): h continues a copy of that row from there
            # (:class:`CachedPrefix`), so only its feedback and reflection are computed before the
            # episode's tokens. Responses are padded to the bucket of the root's length (an episode
            # is mostly far shorter than the episode budget: padding it to the budget made scoring
            # the dearest phase); a root whose h and episode overflow its cache is scored from
            # scratch, its context padded to the bound every tree's h fits in (one compiled shape)
            ep = roots[j]
            contexts = [tree["h"][j]] + ([ep.prompt] if rescore else [])
            response = arrays[j]["tokens"][:lengths[j]]
            prefix = None
            if ep.source is not None:
                res, row = ep.source
                prefix = CachedPrefix.of(res, [row] * len(contexts))
                if any(c.size - 1 + response.size > prefix.tokens.shape[1] for c in contexts):
                    prefix = None
            scored = fit_width(np.asarray(score_logprobs(
                model, contexts, [response] * len(contexts),
                min_context_len=max(h_floor, max(c.size for c in contexts)),
                temperature=temp, prefix=prefix)), width)
            logp_hind[j] = scored[0]
            if rescore:
                logp_orig[j] = scored[1]
        tree["scores"] = np.asarray(hindsight_divergence_from_logprobs(logp_orig, logp_hind, mask))
        picks = [choose_branch_points(tree["scores"][j], int(lengths[j]), config,
                                      eligible=branch_eligibility(
                                          arrays[j]["tokens"], int(lengths[j]),
                                          params.stop_tokens, allowed=mask[j]))
                 for j in range(n_roots)]
        tree["points"] = np.stack([p for p, _ in picks])
        tree["sources"] = [s for _, s in picks]
        layout = tree["layout"] = tree_layout(tree["points"], config)
        for j, (r, ep) in enumerate(zip(root_rows, roots)):
            for p in tree["points"][j]:
                if p < 0:
                    continue
                rows = [(k, int(i)) for i in np.nonzero(
                    (layout.root == j) & (layout.kind == TreeLayout.CONTINUATION)
                    & (layout.position == p))[0]]
                player.branch(ep, int(p), rows)
            ep.turns = []   # its branches hold the caches they continue: the rest can go
        fresh = [(k, int(i)) for i in np.nonzero(layout.kind == TreeLayout.FRESH)[0]]
        if fresh:
            player.start_later(fresh)

    def finish_tree(k: int) -> None:
        tree = trees[k]
        layout = tree["layout"]
        keys = [(k, i) for i in range(g_size)]
        groups[k] = player.group(k, keys, hindsight=[tree["h"][r] for r in layout.root])
        lengths = [len(reflections[(k, r)][0]) for r in root_rows]
        infos[k] = TreeInfo(layout=layout, points=tree["points"], sources=tree["sources"],
                            scores=tree["scores"],
                            reflections=[reflections[(k, r)][1] for r in root_rows],
                            reflection_lengths=np.array(lengths, np.int32),
                            feedback=[tree["feedback"][r] for r in root_rows])
        groups[k].generated_tokens += int(sum(lengths))
        for i in range(g_size):  # the tree's caches are no longer needed
            player.episodes[(k, i)].source, player.episodes[(k, i)].turns = None, []

    player = EpisodePlayer(model, tokenizer, task, pool, examples, key=key, params=params,
                           max_turns=max_turns, episode_tokens=episode_tokens, clock=clock,
                           first_index=first_index, keep_turns=True, on_finish=on_finish,
                           on_other=on_other)
    root_keys = [(k, r) for k in range(len(examples)) for r in root_rows]
    turn = max(len(reflection_turn(tokenizer, ex, "", templates=options.templates))
               for ex in examples)
    player.reset(root_keys)
    first = max(player.episodes[ek].prompt.size for ek in root_keys)
    empty_h = max(len(hindsight_context(tokenizer, ex, "", [], max_reflection_tokens=0,
                                        templates=options.templates,
                                        question=player.episodes[(k, root_rows[0])].first_turn))
                  - player.episodes[(k, root_rows[0])].prompt.size
                  for k, ex in enumerate(examples))
    h_floor = -(-(first + max(empty_h, 0)) // 16) * 16 + h_cap + options.feedback_max_tokens
    engine = player.make_engine(slots=slots, chunk_steps=chunk_steps,
                                extra_len=turn + options.feedback_max_tokens + refl_cap)
    for k in range(len(examples)):
        player.start([(k, r) for r in root_rows])
    # roots whose environment failed at reset have ended already: a tree of only such roots
    for k in range(len(examples)):
        if "points" not in trees[k] and all(player.episodes[(k, r)].status is not None
                                            for r in root_rows):
            reflect(k)
    player.run()
    missing = [k for k in range(len(examples)) if k not in groups]
    if missing:
        raise RuntimeError(f"episode trees {missing} did not finish (an episode never ended)")
    order = range(len(examples))
    return ([groups[k] for k in order], [infos[k] for k in order],
            [[player.episodes[(k, i)] for i in range(g_size)] for k in order])
