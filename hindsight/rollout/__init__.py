"""Rollout shapes: the training groups each method trains on, as batches of
:mod:`hindsight.batch`.

* :mod:`~hindsight.rollout.group` — GRPO groups (``G`` independent samples per prompt).
* :mod:`~hindsight.rollout.dynamic` — DAPO dynamic sampling (refill until enough mixed groups).
* :mod:`~hindsight.rollout.hdl` / :mod:`~hindsight.rollout.branching` — HDL trees: roots, verifier
  feedback, reflection, hindsight scores, branch points, continuations from the cached prefix.
* :mod:`~hindsight.rollout.recoverability` — counterfactual recoverability: failing rows' error
  states replayed by teacher branches (continue / rollback), labelled, with supervision rows.
* :mod:`~hindsight.rollout.prompts` — chat-templated policy, reflection, hindsight and probe
  contexts; :mod:`~hindsight.rollout.contexts` — teacher contexts from registered parts
  (reference, successful peer, feedback, hints, ...); :mod:`~hindsight.rollout.generated` —
  the parts the policy itself writes about a group during the rollout (SEED's skills).
* :mod:`~hindsight.rollout.assemble` — rows -> batch (``target_index``, bucketed widths, contexts).
* :mod:`~hindsight.rollout.verification` — the :class:`Verifier`: responses checked in worker
  threads while the engine keeps decoding.
* :mod:`~hindsight.rollout.episodes` — multi-turn episodes in environments, each turn continued
  from the row's cache.
* :func:`collect` — the entry point, dispatching on the method's ``rollout`` and ``contexts``.
* :mod:`~hindsight.rollout.prepare` — a method's preparation, run once per run before training
  (:mod:`~hindsight.rollout.neuron_selection`: Neuron-OPSD's data selection and few-shot
  contexts).
"""
from hindsight.rollout.assemble import GroupRows, assemble, context_arrays, context_logprobs
from hindsight.rollout.branching import (TreeLayout, choose_branch_points, tree_advantages,
                                         tree_layout)
from hindsight.rollout.collect import SHAPES, EpisodeOptions, RolloutConfig, RolloutStats, collect
from hindsight.rollout.dynamic import sample_dynamic
from hindsight.rollout.group import sample_groups
from hindsight.rollout.hdl import TreeInfo, TreeOptions, sample_trees
from hindsight.rollout.contexts import CONTEXT_PARTS, GroupView, teacher_context, teacher_contexts
from hindsight.rollout.generated import GENERATORS, GenerationOptions, Generated, PartWriter
from hindsight.rollout.prompts import (Templates, hindsight_context, policy_prompt, probe_context,
                                       reflection_turn)
from hindsight.rollout.verification import Verifier
from hindsight.rollout.prepare import (PREPARATIONS, Preparation, PrepareInputs, TrainSubset,
                                       check_preparation, prepare_task)
from hindsight.rollout import neuron_selection  # noqa: F401  (registers its preparation)

__all__ = [
    "CONTEXT_PARTS", "GENERATORS", "GenerationOptions", "Generated", "GroupView", "PartWriter",
    "PREPARATIONS", "Preparation", "PrepareInputs", "TrainSubset",
    "check_preparation", "prepare_task", "SHAPES", "EpisodeOptions", "GroupRows", "RolloutConfig", "RolloutStats", "Templates", "TreeInfo", "TreeLayout",
    "TreeOptions", "Verifier", "assemble", "choose_branch_points", "collect", "context_arrays",
    "context_logprobs", "hindsight_context", "policy_prompt", "probe_context",
    "reflection_turn", "sample_dynamic", "sample_groups", "sample_trees", "teacher_context",
    "teacher_contexts", "tree_advantages", "tree_layout",
]
