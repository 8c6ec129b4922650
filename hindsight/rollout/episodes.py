"""Multi-turn episodes on the engine's cache: ``G`` episodes per example, played in environments
stepped by worker processes while the engine decodes other rows.

A turn decodes until an action stop string (:class:`hindsight.sampling.text.StopStrings`), a stop
token or the per-turn cap (``params.max_new_tokens``); its action goes to the row's environment
(:class:`hindsight.envs.pool.EnvPool`), and the observation comes back as the next user turn,
appended to the row's cached K/V (:meth:`hindsight.sampling.engine.Engine.submit_extend`: only the
observation's tokens are computed, never the history again). The episode ends when the environment
says done, after ``max_turns`` actions, when the next observation and turn would not fit in the
episode's token budget (status ``"context"``: the **context cap ends the episode**, keeping its
rewards so far; old observations are never cut, so every row stays one exact teacher-forced
sequence), or when its environment fails (``"error"``, ``"timeout"``, ``"crashed"``: the row stays
in the batch with loss mask 0, so the run goes on and the group keeps its size).

A row's response is the whole episode after the first prompt: action tokens (loss mask 1,
``turn_id`` = the turn, ``logp_old`` = the sampler's log-probs) and observation tokens (mask 0,
``turn_id`` -1, ``logp_old`` 0), spec §0; a search task's query tokens are its ``search_mask``
(spec ``s_t``). Its reward is the episode's return (the sum of the step
rewards, clipped to the task's range); ``turn_rewards`` keeps each turn's.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from hindsight.envs import EnvPool, Reply
from hindsight.rollout.assemble import GroupRows
from hindsight.rollout.prompts import followup_turn
from hindsight.rollout.runtime import PhaseClock, make_engine, request_key
from hindsight.sampling import SamplingParams
from hindsight.sampling.text import StopStrings, encode_prompt
from hindsight.tasks import Example
from hindsight.tasks.base import reward_range

STATUSES = ("done", "turns", "context", "error", "timeout", "crashed")


@dataclasses.dataclass(frozen=True)
class EpisodeOptions:
    """How episodes are played: ``max_turns`` actions, ``episode_tokens`` the response width ``T``
    (the sampling params' ``max_new_tokens`` caps one turn), the environment pool's timeouts."""
    max_turns: int = 8
    episode_tokens: int = 1024
    step_timeout: float = 60.0
    reset_timeout: float = 300.0


@dataclasses.dataclass
class Episode:
    """One row's episode as it is played (host side).

    Attributes:
      key: ``(example k, row g)``.
      prompt: ``[n]`` the first turn's ids (instructions + first observation).
      pieces: ``(ids, policy_logprobs, logprobs, turn, search)`` in order; ``turn`` is -1 for
        observations; ``search`` the turn's search-query token mask (None: the task has none).
      rewards: per action turn, the environment's step reward.
      actions, observations: the parsed actions and the observations (text).
      status: one of :data:`STATUSES` once finished, else None. feedback: the environment's last
        feedback (or the failure's message).
      source: ``(Rollouts, row)`` holding the row's cache after its last turn.
    """
    key: tuple
    prompt: np.ndarray | None = None
    pieces: list = dataclasses.field(default_factory=list)
    rewards: list = dataclasses.field(default_factory=list)
    actions: list = dataclasses.field(default_factory=list)
    observations: list = dataclasses.field(default_factory=list)
    status: str | None = None
    feedback: str = ""
    source: tuple | None = None
    ended_turn: bool = False

    @property
    def length(self) -> int:
        return sum(len(p[0]) for p in self.pieces)

    def arrays(self, width: int, num_turns: int) -> dict:
        """The row's ``tokens``, ``mask``, ``turn_id``, ``policy_logprobs``, ``logprobs``,
        ``search_mask`` ``[width]`` and ``turn_rewards [num_turns]``."""
        out = dict(tokens=np.zeros(width, np.int32), mask=np.zeros(width, bool),
                   turn_id=np.full(width, -1, np.int32), search_mask=np.zeros(width, bool),
                   policy_logprobs=np.zeros(width, np.float32), logprobs=np.zeros(width, np.float32))
        at = 0
        for ids, plp, lp, turn, search in self.pieces:
            n = len(ids)
            out["tokens"][at:at + n] = ids
            if search is not None:
                out["search_mask"][at:at + n] = search
            if turn >= 0 and self.status not in ("error", "timeout", "crashed"):
                out["mask"][at:at + n] = True
                out["turn_id"][at:at + n] = turn
            out["policy_logprobs"][at:at + n], out["logprobs"][at:at + n] = plp, lp
            at += n
        rewards = np.zeros(num_turns, np.float32)
        rewards[:len(self.rewards)] = self.rewards
        out["turn_rewards"] = rewards
        return out


class _Replies:
    """The pool's replies as :meth:`hindsight.rollout.runtime.PhaseClock.run` waits on them
    (phases ``env`` and ``env_wait``)."""
    phase = "env"

    def __init__(self, pool: EnvPool, on_reply, flush):
        self.pool, self.on_reply, self.flush = pool, on_reply, flush
        self.ready: list[Reply] = []

    @property
    def pending(self) -> int:
        return self.pool.pending + len(self.ready)

    def wait(self) -> float:
        start = time.perf_counter()
        while not self.ready and self.pool.pending:
            self.ready += self.pool.poll(None)
        return time.perf_counter() - start

    def deliver(self) -> None:
        replies, self.ready = self.ready + self.pool.poll(0.0), []
        for reply in replies:
            self.on_reply(reply)
        self.flush()


def sample_episodes(model, tokenizer, task, pool: EnvPool, examples: Sequence[Example], *, key,
                    params: SamplingParams, group_size: int, max_turns: int, episode_tokens: int,
                    slots: int | None = None, chunk_steps: int = 16,
                    clock: PhaseClock | None = None, first_index: int = 0
                    ) -> tuple[list[GroupRows], list[list[Episode]]]:
    """Play ``group_size`` episodes of each example.

    Args:
      task: an :class:`hindsight.tasks.episodic.EpisodeTask` (setup, turn wording, action parsing,
        stop strings); pool: environments of ``task.env``.
      key: PRNG key; turn ``j`` of row ``g`` of example ``k`` draws with
        ``fold_in(fold_in(fold_in(key, first_index + k), g), j)``, so an episode does not depend on
        its batch, slot or the order environments answer in.
      params: sampling parameters (stop tokens included); ``max_new_tokens`` caps one turn.
      max_turns: actions per episode at most.
      episode_tokens: the response width ``T``: every turn and observation after the first prompt.
      clock: records ``turns`` tokens and seconds, ``env`` / ``env_wait`` (decoding waited for
        environments, every slot idle).
    Returns:
      ``(groups, episodes)``: P :class:`GroupRows` (``loss_mask`` on action tokens only, ``turn_ids``,
      ``turn_rewards``, rewards = episode returns) and the played :class:`Episode` s per group.
    """
    if max_turns < 1 or episode_tokens <= params.max_new_tokens:
        raise ValueError(f"need max_turns >= 1 and episode_tokens > the turn cap "
                         f"({params.max_new_tokens}); got {max_turns}, {episode_tokens}")
    clock = clock if clock is not None else PhaseClock()
    low, high = reward_range(task)
    stop = StopStrings(tokenizer, task.stop_strings) if task.stop_strings else None
    eos = getattr(tokenizer, "eos_token_id", None)
    g_size, width, cap = group_size, int(episode_tokens), params.max_new_tokens
    episodes = {(k, g): Episode(key=(k, g)) for k in range(len(examples)) for g in range(g_size)}
    if pool.num_workers < len(episodes):
        raise ValueError(f"{len(episodes)} episodes ({len(examples)} examples x {g_size}) need as "
                         f"many environment workers; the pool has {pool.num_workers}")
    # every first observation is in before the engine is sized for the longest first prompt
    with clock.host_phase("env_reset"):
        for k, ex in enumerate(examples):
            for g in range(g_size):
                pool.reset((k, g), task.setup(ex))
        first = {}
        while len(first) < len(episodes):
            for reply in pool.poll(None):
                first[reply.episode] = reply
    for (k, g), reply in first.items():
        ep = episodes[(k, g)]
        ep.observations.append(reply.step.observation if reply.ok else "")
        ep.prompt = np.asarray(encode_prompt(tokenizer, task.first_turn(examples[k], ep.observations[0])),
                               np.int32)
        if not reply.ok:
            ep.status, ep.feedback = reply.status, _first_line(reply.message)
    engine = make_engine(model, params, longest_prompt=max(ep.prompt.size for ep in episodes.values()),
                         max_new_tokens=width, rows=len(episodes), slots=slots,
                         chunk_steps=chunk_steps, name="main")
    extends: dict[int, tuple] = {}  # id(rollouts) -> (rollouts, [(row, episode, ids)])

    def finish(ep: Episode, status: str, feedback: str = "") -> None:
        ep.status, ep.feedback = status, feedback or ep.feedback
        pool.release(ep.key)

    def turn_key(ep: Episode, turn: int):
        return request_key(key, first_index + ep.key[0], ep.key[1], turn)

    def start_group(k: int) -> None:
        live = [episodes[(k, g)] for g in range(g_size) if episodes[(k, g)].status is None]
        # rows with the same first prompt are prefilled once (a deterministic environment shows
        # every row of a group the same first observation)
        by_prompt: dict[bytes, list[Episode]] = {}
        for ep in live:
            by_prompt.setdefault(ep.prompt.tobytes(), []).append(ep)
        for rows in by_prompt.values():
            engine.submit(rows[0].prompt, num_samples=len(rows),
                          row_keys=jnp.stack([turn_key(ep, 0) for ep in rows]),
                          stop_check=stop, keep_cache=True, tag=tuple(ep.key for ep in rows))

    def on_turn(tag, res) -> None:
        clock.tokens["turns"] += int(res.lengths.sum())
        for i, ek in enumerate(tag):
            ep, n = episodes[ek], int(res.lengths[i])
            ids = res.tokens[i, :n]
            ep.pieces.append((ids, res.policy_logprobs[i, :n], res.logprobs[i, :n], len(ep.actions),
                              task.search_mask(tokenizer, ids)))
            ep.source = (res, i)
            ep.ended_turn = bool(n and eos is not None and ids[-1] == eos)
            action = task.parse_action(tokenizer.decode(ids.tolist(), skip_special_tokens=True))
            ep.actions.append(action)
            pool.step(ek, action)

    def on_reply(reply: Reply) -> None:
        ep = episodes[reply.episode]
        if not reply.ok:
            return finish(ep, reply.status, _first_line(reply.message))
        step = reply.step
        ep.rewards.append(float(step.reward))
        ep.feedback = str(step.info.get("feedback", "")) or ep.feedback
        if step.done:
            return finish(ep, "done")
        if len(ep.actions) >= max_turns:
            return finish(ep, "turns")
        ids = followup_turn(tokenizer, task.observation_turn(step.observation))
        if ep.ended_turn and ids and ids[0] == ep.pieces[-1][0][-1]:
            ids = ids[1:]  # the turn ended itself: its end-of-turn token is already there
        if ep.length + len(ids) + cap > width:
            return finish(ep, "context", f"episode token budget ({width}) reached after "
                                         f"{len(ep.actions)} turns")
        ep.observations.append(step.observation)
        res, row = ep.source
        extends.setdefault(id(res), (res, []))[1].append((row, ep, np.asarray(ids, np.int32)))

    def flush() -> None:
        for res, items in extends.values():
            rows = [row for row, _, _ in items]
            for _, ep, ids in items:
                ep.pieces.append((ids, np.zeros(len(ids), np.float32),
                                  np.zeros(len(ids), np.float32), -1, None))
            engine.submit_extend(res, rows, [ids for _, _, ids in items],
                                 row_keys=jnp.stack([turn_key(ep, len(ep.actions)) for _, ep, _ in items]),
                                 stop_check=stop, keep_cache=True,
                                 tag=tuple(ep.key for _, ep, _ in items))
        extends.clear()

    for k in range(len(examples)):
        start_group(k)
    clock.run([engine], on_turn, _Replies(pool, on_reply, flush))
    for ep in episodes.values():
        ep.source = None  # release the caches
    groups, played = [], []
    for k, ex in enumerate(examples):
        eps = [episodes[(k, g)] for g in range(g_size)]
        rows = [ep.arrays(width, max_turns) for ep in eps]
        stack = lambda name: np.stack([r[name] for r in rows])
        returns = np.clip([sum(ep.rewards) for ep in eps], low, high).astype(np.float32)
        generated = sum(int(p[0].size) for ep in eps for p in ep.pieces if p[3] >= 0)
        groups.append(GroupRows(
            example=ex, example_index=first_index + k, prompt=eps[0].prompt,
            row_prompts=[ep.prompt for ep in eps],
            tokens=stack("tokens"), lengths=np.array([ep.length for ep in eps], np.int32),
            logprobs=stack("logprobs"), policy_logprobs=stack("policy_logprobs"),
            loss_mask=stack("mask"), rewards=returns, branch_positions=np.zeros(g_size, np.int32),
            texts=[render(tokenizer, ep) for ep in eps], feedback=[ep.feedback for ep in eps],
            generated_tokens=generated, turn_ids=stack("turn_id"),
            turn_rewards=stack("turn_rewards"),
            search_mask=stack("search_mask") if task.searches else None,
            num_turns=np.array([len(ep.actions) for ep in eps], np.int32),
            statuses=[ep.status for ep in eps]))
        played.append(eps)
    return groups, played


def play(model, tokenizer, task, examples: Sequence[Example], *, key, params: SamplingParams,
         group_size: int, options: EpisodeOptions, slots: int | None = None,
         chunk_steps: int = 16, clock: PhaseClock | None = None, first_index: int = 0):
    """:func:`sample_episodes` in a pool of one worker per episode, created for the call and
    closed after it (every environment process with it)."""
    with EnvPool(task.env, workers=len(examples) * group_size, step_timeout=options.step_timeout,
                 reset_timeout=options.reset_timeout) as pool:
        return sample_episodes(model, tokenizer, task, pool, examples, key=key, params=params,
                               group_size=group_size, max_turns=options.max_turns,
                               episode_tokens=options.episode_tokens, slots=slots,
                               chunk_steps=chunk_steps, clock=clock, first_index=first_index)


def _first_line(message: str) -> str:
    return message.splitlines()[0] if message else ""


def render(tokenizer, ep: Episode) -> str:
    """The episode turn by turn: the first observation, then each action and what came back."""
    lines = [f"[observation] {ep.observations[0] if ep.observations else ''}"]
    obs = iter(ep.observations[1:])
    for ids, _, _, turn, _ in ep.pieces:
        if turn >= 0:
            reward = ep.rewards[turn] if turn < len(ep.rewards) else None
            text = tokenizer.decode(ids.tolist(), skip_special_tokens=True).strip()
            lines.append(f"[turn {turn}] {text}  -> action {ep.actions[turn]!r}"
                         + (f", reward {reward:g}" if reward is not None else ""))
        else:
            lines.append(f"[observation] {next(obs, '')}")
    lines.append(f"[end] {ep.status}: {ep.feedback}")
    return "\n".join(lines)
