"""Counterfactual recoverability in on-policy distillation (spec ``other-methods.md`` §10; *Not
Every Divergence Should Be Suppressed*, arXiv 2608.04408, seed ``004``; no public code).

Spec, with each OUR CHOICE marked:

1. **Error states.** On-policy distillation supervises the student's own rows under a teacher
   (``teacher``: the policy under ``stop_gradient`` reading the privileged ``teacher`` context,
   question + reference answer, or an ``"external"`` checkpoint). A row whose reward is below
   :data:`hindsight.tasks.SUCCESS_REWARD` holds one error state (OUR CHOICE: the paper replays
   "each observed error state" and does not say how one is found): the response position ``e``
   where the teacher's log-prob of the sampled token falls furthest below the student's, the
   largest step-wise divergence ``delta_t = l_S(y_t) - l_T(y_t)`` (SOD's own signal, both at the
   sampling temperature), among ``head_guard <= t <= len - 1 - tail_guard``, never a stop token,
   and only where ``delta_t > 0`` (a row the teacher prefers token for token has no error). An
   "action" is one token (OUR CHOICE: the paper's actions are reasoning steps; one token is the
   unit the single-turn rollout branches at, and a span would need a segmentation rule).
   Per group, at most ``states_per_group`` states are replayed (OUR CHOICE, 2): those with the
   largest ``delta_e`` (ties: the lower row), since a large divergence is what SOD would suppress
   hardest and so where the recoverability decision changes training most.
2. **Budget-matched branches** [V]: the teacher samples ``branches`` rows per arm (OUR CHOICE,
   the spec's 4) at the rollout's sampling parameters: **continue** keeps the erroneous token and
   continues after it, **rollback** returns to the pre-error state and resamples it. The budget
   from the pre-error state is ``T - e`` tokens in both arms (the continue arm spends its first on
   the kept token), so every branch is a full response of at most ``T`` tokens.
   ``p_cont`` / ``p_roll`` are the arms' success rates (reward >= ``SUCCESS_REWARD``). The spec's
   split of feature branches from held-out outcome branches belongs to its diagnostics (the proxy's
   AUC) and is not done: the same branches label the state and supply its supervision row.
3. **Labels** [V] (:func:`hindsight.signals.recoverability_labels`): recoverable if ``p_cont >=
   recoverable_min`` (0.5); irreversible-but-avoidable if ``p_cont <= irreversible_max`` (0.25)
   and ``p_roll >= rollback_min`` (0.5); else ambiguous.
4. **Training effect** [V actions, OUR CHOICE weights], per label, through the batch's rows and
   loss masks (:mod:`hindsight.rollout.recoverability`):

   * recoverable: **retain** the prefix: the student's row is trained before ``e`` only (the
     erroneous token is kept, not suppressed, and its failed suffix is replaced), and a
     corrective row (the prefix through ``e`` + the first successful continue branch) is
     supervised after ``e`` by cross-entropy to the teacher's argmax, weight ``retain_weight``
     (the spec's 1);
   * irreversible: **roll back**: the student's row gets weight 0 from ``e`` on (the doomed
     suffix, the spec's "weight 0 after the error"), and the rollback row (the prefix before
     ``e`` + the first successful rollback branch) is supervised from ``e`` on, by the same
     cross-entropy to the teacher's argmax (OUR CHOICE: the spec says only that the rollback
     branch is supervised), weight ``rollback_weight`` (1);
   * ambiguous, and every row without a replayed state (successes included): ordinary **SOD**,
     step-wise divergence-weighted OPD: each sampled token's log-likelihood weighted by its
     step-wise divergence, ``sg(l_S - l_T) l_S`` (:data:`hindsight.methods.distill.DIVERGENCES`'
     ``"sampled"``, the reverse KL's single-sample gradient; OUR CHOICE of form, the paper names
     SOD without its formula), or ``divergence="full"``: the full-vocabulary generalized JSD
     (``beta`` 1.0: ``KL(S || T)``), weight ``sod_weight`` (1).

Loss: three token-mean terms over the batch's ``mask``, routed by ``row_role``
(:mod:`hindsight.batch`; absent: every row is a student row): ``sod`` (role 0), ``retain`` (role
1), ``rollback`` (role 2). The spec's backbone (§10 step 5: candidates scored by normalised
sequence log-probs over a shared admissible action set, for tokenizers that differ) is not
needed: the teacher shares the student's tokenizer (an external teacher's is checked at start).
The teacher ``"reference"`` is refused: the rollout samples the branches with the teacher's
weights, and the training loop hands the rollout the policy and the external teacher only.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from hindsight._validation import check_choice, check_static_float
from hindsight.batch import check_batch
from hindsight.methods.distill import TokenDivergence, check_teacher_context
from hindsight.methods.forward import context_hidden, gather, vocab_rows
from hindsight.methods.method import (LossConfig, Method, require_no_state, resolve_config,
                                      teacher_hidden)
from hindsight.objectives import Loss, aggregate, term
from hindsight.objectives.aggregation import as_mask
from hindsight.ops import entropy_from_logprobs

NAME = "recoverability"
CONTEXTS = ("teacher",)
ROLLOUT = "recoverability"
FIELDS = ()
SAMPLE_TEACHERS = ("self", "external")
"""The teachers whose weights the rollout can sample branches with (see the module doc)."""
ROLES = {"sod": 0, "retain": 1, "rollback": 2}
"""``row_role`` of each term's rows: the student's own samples (and unused supervision slots,
whose mask is empty), retained-prefix corrective rows, rollback rows. The recoverable and
irreversible labels of :func:`hindsight.signals.recoverability_labels` are 1 and 2: a
supervision row's role is its state's label."""


def _count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"`{name}` must be an int >= {minimum}, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class RecoverabilityConfig(LossConfig):
    """Counterfactual recoverability options (spec §10; see the module doc).

    Attributes:
      teacher: ``"self"`` (the policy under ``stop_gradient`` on the teacher context) or
        ``"external"`` (``teacher.model.name``); it samples the branches and is distilled from.
      teacher_context: the teacher-context recipe; parts that read only the example
        (:data:`hindsight.rollout.contexts.EXAMPLE_PARTS`: the branches are sampled under it
        before the batch's contexts exist). Default question + reference answer.
      branches: teacher branches per arm (4, OUR CHOICE in the spec).
      states_per_group: error states replayed per group, each with one supervision row in the
        batch (2, OUR CHOICE): a group holds ``rollout.group_size + states_per_group`` rows.
      head_guard, tail_guard: an error position is ``head_guard <= t <= len - 1 - tail_guard``
        (1 and 4, OUR CHOICE: not the opening token, and room left to recover before the end).
      recoverable_min, irreversible_max, rollback_min: the label thresholds (0.5, 0.25, 0.5).
      divergence, beta: SOD's per-token divergence, ``"sampled"`` (``sg(l_S - l_T) l_S``) or
        ``"full"`` (generalized JSD, ``beta`` 1.0 = ``KL(S || T)``; unused when sampled).
      sod_weight, retain_weight, rollback_weight: the terms' weights (1.0 each).
    """
    teacher: str = "self"
    teacher_context: tuple = ("reference",)
    branches: int = 4
    states_per_group: int = 2
    head_guard: int = 1
    tail_guard: int = 4
    recoverable_min: float = 0.5
    irreversible_max: float = 0.25
    rollback_min: float = 0.5
    divergence: str = "sampled"
    beta: float = 1.0
    sod_weight: float = 1.0
    retain_weight: float = 1.0
    rollback_weight: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        if self.teacher == "reference":
            raise ValueError("`teacher`='reference' is not available to recoverability: its "
                             "rollout samples the teacher's branches, and the training loop "
                             "hands the rollout the policy and the external teacher only; use "
                             f"one of {list(SAMPLE_TEACHERS)}")
        check_choice("teacher", self.teacher, SAMPLE_TEACHERS)
        object.__setattr__(self, "teacher_context", check_teacher_context(self.teacher_context))
        _count("branches", self.branches, 1)
        _count("states_per_group", self.states_per_group, 1)
        _count("head_guard", self.head_guard, 1)
        _count("tail_guard", self.tail_guard, 0)
        for name in ("recoverable_min", "irreversible_max", "rollback_min"):
            check_static_float(name, getattr(self, name), low=0.0, high=1.0)
        check_choice("divergence", self.divergence, ("sampled", "full"))
        check_static_float("beta", self.beta, low=0.0, high=1.0)
        for name in ("sod_weight", "retain_weight", "rollback_weight"):
            check_static_float(name, getattr(self, name), low=0.0)

    @property
    def token_divergence(self) -> TokenDivergence:
        return TokenDivergence(divergence=self.divergence,
                               alpha=1.0 if self.divergence == "sampled" else self.beta)


def row_roles(batch) -> jax.Array:
    """``[B]`` int32 ``batch["row_role"]``, or zeros (every row a student row) when absent."""
    if "row_role" in batch:
        return jnp.asarray(batch["row_role"]).astype(jnp.int32)
    return jnp.zeros(jnp.shape(batch["mask"])[:1], jnp.int32)


def loss_fn(model, batch, *, config: RecoverabilityConfig | None = None, head=None,
            reference=None, method_state=None, external_teacher=None) -> Loss:
    """Three token-mean terms (see the module doc): ``sod`` (SOD's per-token divergence on role-0
    rows), ``retain`` and ``rollback`` (``-l_S(argmax_v p_T(v))`` on role-1 / role-2 rows), each
    over the batch's ``mask`` restricted to its rows.

    Metrics: ``entropy`` (student) and ``teacher_gap`` (mean ``l_T - l_S`` at the sampled tokens)
    over the SOD tokens; ``teacher_argmax_match`` (the student's argmax is the teacher's) over the
    supervised tokens; ``retain_rows`` / ``rollback_rows``, the fraction of rows in each role.
    """
    config = resolve_config(NAME, config, RecoverabilityConfig())
    require_no_state(NAME, method_state)
    check_batch(batch, method=NAME, contexts=CONTEXTS, fields=FIELDS)
    sides = {"student": context_hidden(model, batch),
             "teacher": teacher_hidden(NAME, config.teacher, model, reference, batch,
                                       external=external_teacher)}
    divergence = config.token_divergence
    sg = jax.lax.stop_gradient

    def row(logp, tokens):
        ls, lt = logp["student"], logp["teacher"]
        target = jnp.argmax(lt, axis=-1)  # the teacher's argmax (ties: the lower id)
        return {"sod": divergence(ls, lt, tokens), "ce": -gather(ls, target),
                "entropy": sg(entropy_from_logprobs(ls)),
                "teacher_gap": sg(gather(lt, tokens) - gather(ls, tokens)),
                "match": sg((jnp.argmax(ls, axis=-1) == target).astype(jnp.float32))}

    mask = batch["mask"]
    rows = vocab_rows(row, sides, batch["targets"], mask, head=head,
                      temperature=config.temperature)
    role = row_roles(batch)
    valid = as_mask(mask)
    masks = {name: valid & (role == r)[:, None] for name, r in ROLES.items()}
    weights = {"sod": config.sod_weight, "retain": config.retain_weight,
               "rollback": config.rollback_weight}
    terms = {"sod": term(rows["sod"], masks["sod"], weight=weights["sod"])}
    for name in ("retain", "rollback"):
        terms[name] = term(rows["ce"], masks[name], weight=weights[name])
    supervised = masks["retain"] | masks["rollback"]
    b = jnp.float32(role.shape[0])
    metrics = {"entropy": aggregate(rows["entropy"], masks["sod"]),
               "teacher_gap": aggregate(rows["teacher_gap"], masks["sod"]),
               "teacher_argmax_match": aggregate(rows["match"], supervised),
               **{f"{name}_rows": (jnp.sum(jnp.any(masks[name], axis=-1).astype(jnp.float32)), b)
                  for name in ("retain", "rollback")}}
    return Loss(terms, metrics)


METHOD = Method(name=NAME, loss_fn=loss_fn, config=RecoverabilityConfig(), contexts=CONTEXTS,
                rollout=ROLLOUT, fields=FIELDS, extra_rows=lambda config: config.states_per_group,
                paper="Counterfactual recoverability in on-policy distillation (arXiv 2608.04408)")
