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
from typing import NamedTuple

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


class Piece(NamedTuple):
    """A run of an episode's tokens: one action turn as sampled, or one observation.

    ``turn`` is the action's index, -1 for an observation (whose log-probs are zeros); the
    log-probs are the sampler's (sampled distribution, untruncated at the sampling temperature,
    untruncated at temperature 1); ``search`` the turn's search-query token mask (None: the task
    has none)."""
    ids: np.ndarray
    policy_logprobs: np.ndarray
    logprobs: np.ndarray
    raw_logprobs: np.ndarray
    turn: int
    search: np.ndarray | None = None


@dataclasses.dataclass
class Episode:
    """One row's episode as it is played (host side).

    Attributes:
      key: ``(example k, row g)``.
      prompt: ``[n]`` the first turn's ids (instructions + first observation); first_turn: its text.
      pieces: the episode's :class:`Piece` s in order.
      rewards: per action turn, the environment's step reward.
      actions, observations: the parsed actions and the observations (text).
      status: one of :data:`STATUSES` once finished, else None. feedback: the environment's last
        feedback (or the failure's message).
      source: ``(Rollouts, row)`` holding the row's cache after its last turn.
      turns: with ``keep_turns``, ``(Rollouts, row)`` of every turn of an episode played from
        its first prompt (what a branch inside the episode continues from); empty for a branch
        of another episode (never branched again: its own history is in its cache) and once the
        episode's branches are submitted (the tree clears it).
      branchable: whether a branch may start inside this episode (with ``keep_turns``, its turns'
        caches are kept): a tree's roots; not its continuations or fresh episodes.
      branch_position: response position from which this row was sampled (a branch of another
        episode: the resampled token's; 0 for an episode played from its first prompt).
      phase: what the episode's environment request in flight is for: ``"reset"`` (first
        observation wanted), ``"replay"`` (a branch's environment catching up with the actions
        before the branched turn, then ``pending`` is stepped) or ``"step"``.
    """
    key: tuple
    prompt: np.ndarray | None = None
    first_turn: str = ""
    pieces: list = dataclasses.field(default_factory=list)
    rewards: list = dataclasses.field(default_factory=list)
    actions: list = dataclasses.field(default_factory=list)
    observations: list = dataclasses.field(default_factory=list)
    status: str | None = None
    feedback: str = ""
    source: tuple | None = None
    ended_turn: bool = False
    turns: list = dataclasses.field(default_factory=list)
    branchable: bool = True
    branch_position: int = 0
    phase: str = "step"
    pending: str | None = None

    @property
    def length(self) -> int:
        return sum(len(p.ids) for p in self.pieces)

    def arrays(self, width: int, num_turns: int) -> dict:
        """The row's ``tokens``, ``mask``, ``turn_id``, ``policy_logprobs``, ``logprobs``,
        ``raw_logprobs``, ``search_mask`` ``[width]`` and ``turn_rewards [num_turns]``. ``mask`` is 1 on the action
        tokens at or after :attr:`branch_position` (all of them for an episode played from its
        first prompt), 0 everywhere for a failed environment."""
        out = dict(tokens=np.zeros(width, np.int32), mask=np.zeros(width, bool),
                   turn_id=np.full(width, -1, np.int32), search_mask=np.zeros(width, bool),
                   **{k: np.zeros(width, np.float32)
                      for k in ("policy_logprobs", "logprobs", "raw_logprobs")})
        at = 0
        for p in self.pieces:
            n = len(p.ids)
            out["tokens"][at:at + n] = p.ids
            if p.search is not None:
                out["search_mask"][at:at + n] = p.search
            if p.turn >= 0 and self.status not in ("error", "timeout", "crashed"):
                out["mask"][at:at + n] = True
                out["turn_id"][at:at + n] = p.turn
            for k in ("policy_logprobs", "logprobs", "raw_logprobs"):
                out[k][at:at + n] = getattr(p, k)
            at += n
        out["mask"][:self.branch_position] = False
        rewards = np.zeros(num_turns, np.float32)
        rewards[:len(self.rewards)] = self.rewards
        out["turn_rewards"] = rewards
        return out

    def locate(self, position: int) -> tuple[int, int]:
        """``(turn, offset)``: the action turn holding response ``position`` and the position's
        offset in it. Raises ValueError for a position on an observation or past the end."""
        at = 0
        for p in self.pieces:
            if at <= position < at + len(p.ids):
                if p.turn < 0:
                    raise ValueError(f"position {position} is an observation token of episode "
                                     f"{self.key}, not an action's")
                return p.turn, position - at
            at += len(p.ids)
        raise ValueError(f"position {position} is past episode {self.key}'s {at} tokens")

    def prefix(self, turn: int) -> "Episode":
        """A new episode's history up to (not including) action ``turn``: what a branch inside
        that turn shares with this one."""
        cut = next(i for i, p in enumerate(self.pieces) if p.turn == turn)
        return Episode(key=None, prompt=self.prompt, first_turn=self.first_turn,
                       pieces=list(self.pieces[:cut]), rewards=list(self.rewards[:turn]),
                       actions=list(self.actions[:turn]),
                       observations=list(self.observations[:turn + 1]), feedback=self.feedback)


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


class EpisodePlayer:
    """Plays episodes in one engine and one environment pool: episodes from their first prompt,
    and (for trees) branches of a played episode inside any of its turns.

    Every engine request's tag is ``("turn" | "branch", (episode keys...))``; other tags go to
    ``on_other(tag, result)`` (e.g. HDL's reflections, submitted to :attr:`engine`). An episode
    that ends calls ``on_finish(episode)``. Rows of a turn draw with
    ``fold_in(fold_in(fold_in(key, first_index + k), g), turn)`` for episode key ``(k, g)``, so an
    episode does not depend on its batch, slot or the order environments answer in.

    Args:
      task: an :class:`hindsight.tasks.episodic.EpisodeTask`; pool: environments of ``task.env``.
      params: sampling parameters (stop tokens included); ``max_new_tokens`` caps one turn.
      max_turns, episode_tokens: actions per episode at most; the response width ``T``.
      keep_turns: keep every turn's cache (:attr:`Episode.turns`) so episodes can be branched.
    """

    def __init__(self, model, tokenizer, task, pool: EnvPool, examples: Sequence[Example], *, key,
                 params: SamplingParams, max_turns: int, episode_tokens: int,
                 clock: PhaseClock, first_index: int = 0, keep_turns: bool = False,
                 on_finish=None, on_other=None):
        if max_turns < 1 or episode_tokens <= params.max_new_tokens:
            raise ValueError(f"need max_turns >= 1 and episode_tokens > the turn cap "
                             f"({params.max_new_tokens}); got {max_turns}, {episode_tokens}")
        self.model, self.tokenizer, self.task, self.pool = model, tokenizer, task, pool
        self.examples, self.key, self.params, self.clock = examples, key, params, clock
        self.max_turns, self.width, self.cap = max_turns, int(episode_tokens), params.max_new_tokens
        self.first_index, self.keep_turns = first_index, keep_turns
        self.on_finish, self.on_other = on_finish, on_other
        self.stop = StopStrings(tokenizer, task.stop_strings) if task.stop_strings else None
        self.eos = getattr(tokenizer, "eos_token_id", None)
        self.episodes: dict[tuple, Episode] = {}
        self.engine = None
        self._extends: dict[int, tuple] = {}  # id(rollouts) -> (rollouts, [(row, episode, ids)])

    # ------------------------------------------------------------------ starting episodes
    def reset(self, keys) -> None:
        """Reset the environments of episodes ``keys`` and wait for every first observation (the
        engine is sized after them: :meth:`make_engine`)."""
        with self.clock.host_phase("env_reset"):
            for k, g in keys:
                self.episodes[(k, g)] = Episode(key=(k, g))
                self.pool.reset((k, g), self.task.setup(self.examples[k]))
            first = {}
            while len(first) < len(keys):
                for reply in self.pool.poll(None):
                    first[reply.episode] = reply
        for ek, reply in first.items():
            self._first_observation(self.episodes[ek], reply)

    def _first_observation(self, ep: Episode, reply: Reply) -> None:
        ep.observations.append(reply.step.observation if reply.ok else "")
        ep.first_turn = self.task.first_turn(self.examples[ep.key[0]], ep.observations[0])
        ep.prompt = np.asarray(encode_prompt(self.tokenizer, ep.first_turn), np.int32)
        if not reply.ok:
            self.finish(ep, reply.status, _first_line(reply.message))

    def make_engine(self, *, slots: int | None, chunk_steps: int, extra_len: int = 0):
        """The engine, sized for the longest first prompt so far, the width and ``extra_len``
        more tokens (e.g. a reflection after the last turn)."""
        longest = max(ep.prompt.size for ep in self.episodes.values())
        self.engine = make_engine(self.model, self.params, longest_prompt=longest,
                                  max_new_tokens=self.width, rows=len(self.episodes), slots=slots,
                                  chunk_steps=chunk_steps, name="main",
                                  min_len=longest + self.width + extra_len)
        self._room = self.engine.max_len - self.width - extra_len  # first-prompt room
        return self.engine

    def start(self, keys) -> None:
        """Submit the first turn of reset episodes ``keys``; rows with the same first prompt are
        prefilled once (a deterministic environment shows every row of a group the same one)."""
        by_prompt: dict[bytes, list[Episode]] = {}
        for ek in keys:
            ep = self.episodes[ek]
            if ep.status is None:
                by_prompt.setdefault(ep.prompt.tobytes(), []).append(ep)
        for rows in by_prompt.values():
            self.engine.submit(rows[0].prompt, num_samples=len(rows),
                               row_keys=jnp.stack([self._turn_key(ep, 0) for ep in rows]),
                               stop_check=self.stop, keep_cache=True,
                               tag=("turn", tuple(ep.key for ep in rows)))

    def start_later(self, keys) -> None:
        """Reset episodes ``keys`` while the engine runs; each starts when its observation comes."""
        for k, g in keys:
            self.episodes[(k, g)] = Episode(key=(k, g), phase="reset", branchable=False)
            self.pool.reset((k, g), self.task.setup(self.examples[k]))

    def branch(self, parent: Episode, position: int, keys) -> None:
        """Continue ``parent`` from response ``position`` (an action token; it is resampled) as
        episodes ``keys``: their history is the parent's up to that turn, reused from its cache,
        and each one's environment replays the parent's earlier actions before its new action."""
        turn, offset = parent.locate(position)
        res, row = parent.turns[turn]
        for ek in keys:
            child = parent.prefix(turn)
            child.key, child.branch_position, child.phase = ek, int(position), "branch"
            child.turns, child.branchable = [], False   # not branched again: no turn caches
            self.episodes[ek] = child
        self.engine.submit_branch(res, [row], [offset], [len(keys)],
                                  row_keys=jnp.stack([self._turn_key(self.episodes[ek], turn)
                                                      for ek in keys]),
                                  stop_check=self.stop, keep_cache=True, tag=("branch", tuple(keys)))

    # ------------------------------------------------------------------ playing
    def _turn_key(self, ep: Episode, turn: int):
        return request_key(self.key, self.first_index + ep.key[0], ep.key[1], turn)

    def finish(self, ep: Episode, status: str, feedback: str = "") -> None:
        ep.status, ep.feedback = status, feedback or ep.feedback
        self.pool.release(ep.key)
        if self.on_finish is not None:
            self.on_finish(ep)

    def on_result(self, tag, res) -> None:
        if not (isinstance(tag, tuple) and tag and tag[0] in ("turn", "branch")):
            return self.on_other(tag, res)
        self.clock.tokens["turns"] += int((res.lengths - res.branch_positions).sum())
        for i, ek in enumerate(tag[1]):
            ep, n = self.episodes[ek], int(res.lengths[i])
            ids = res.tokens[i, :n]
            turn = len(ep.actions)
            ep.pieces.append(Piece(ids, res.policy_logprobs[i, :n], res.logprobs[i, :n],
                                   res.raw_logprobs[i, :n], turn,
                                   self.task.search_mask(self.tokenizer, ids)))
            ep.source = (res, i)
            if self.keep_turns and ep.branchable:
                ep.turns.append((res, i))
            ep.ended_turn = bool(n and self.eos is not None and ids[-1] == self.eos)
            action = self.task.parse_action(_decode(self.tokenizer, ids))
            ep.actions.append(action)
            if ep.phase == "branch":  # its environment first replays the actions before this turn
                ep.phase, ep.pending = "replay", action
                self.pool.replay(ek, self.task.setup(self.examples[ek[0]]), ep.actions[:-1])
            else:
                self.pool.step(ek, action)

    def on_reply(self, reply: Reply) -> None:
        ep = self.episodes[reply.episode]
        if not reply.ok:
            return self.finish(ep, reply.status, _first_line(reply.message))
        if ep.phase == "reset":
            ep.phase = "step"
            self._first_observation(ep, reply)
            if ep.prompt.size > self._room:
                return self.finish(ep, "context", f"first prompt ({ep.prompt.size} tokens) "
                                                  f"longer than the engine was sized for")
            return self.start([ep.key])
        if ep.phase == "replay":
            ep.phase, action, ep.pending = "step", ep.pending, None
            return self.pool.step(ep.key, action)
        step = reply.step
        ep.rewards.append(float(step.reward))
        ep.feedback = str(step.info.get("feedback", "")) or ep.feedback
        if step.done:
            return self.finish(ep, "done")
        if len(ep.actions) >= self.max_turns:
            return self.finish(ep, "turns")
        ids = followup_turn(self.tokenizer, self.task.observation_turn(step.observation))
        if ep.ended_turn and ids and ids[0] == ep.pieces[-1].ids[-1]:
            ids = ids[1:]  # the turn ended itself: its end-of-turn token is already there
        if ep.length + len(ids) + self.cap > self.width:
            return self.finish(ep, "context", f"episode token budget ({self.width}) reached "
                                              f"after {len(ep.actions)} turns")
        ep.observations.append(step.observation)
        res, row = ep.source
        self._extends.setdefault(id(res), (res, []))[1].append(
            (row, ep, np.asarray(ids, np.int32)))

    def flush(self) -> None:
        """Submit the observations that came back since the last flush, one extension per cached
        result they continue."""
        for res, items in self._extends.values():
            rows = [row for row, _, _ in items]
            for _, ep, ids in items:
                zeros = np.zeros(len(ids), np.float32)
                ep.pieces.append(Piece(ids, zeros, zeros, zeros, -1))
            self.engine.submit_extend(
                res, rows, [ids for _, _, ids in items],
                row_keys=jnp.stack([self._turn_key(ep, len(ep.actions)) for _, ep, _ in items]),
                stop_check=self.stop, keep_cache=True, tag=("turn", tuple(ep.key for _, ep, _ in items)))
        self._extends.clear()

    def run(self) -> None:
        """Decode and step environments until every episode has ended; then the caches are
        released."""
        self.clock.run([self.engine], self.on_result, _Replies(self.pool, self.on_reply, self.flush))
        for ep in self.episodes.values():
            ep.source, ep.turns = None, []

    def group(self, k: int, keys, *, hindsight=None) -> GroupRows:
        """Example ``k``'s episodes ``keys`` (in row order) as one group."""
        eps = [self.episodes[ek] for ek in keys]
        low, high = reward_range(self.task)
        rows = [ep.arrays(self.width, self.max_turns) for ep in eps]
        stack = lambda name: np.stack([r[name] for r in rows])
        returns = np.clip([sum(ep.rewards) for ep in eps], low, high).astype(np.float32)
        generated = sum(int(p.ids.size) for ep in eps for p in ep.pieces if p.turn >= 0) - sum(
            self._shared(ep) for ep in eps)
        return GroupRows(
            example=self.examples[k], example_index=self.first_index + k, prompt=eps[0].prompt,
            row_prompts=[ep.prompt for ep in eps],
            tokens=stack("tokens"), lengths=np.array([ep.length for ep in eps], np.int32),
            logprobs=stack("logprobs"), policy_logprobs=stack("policy_logprobs"),
            loss_mask=stack("mask"), rewards=returns,
            branch_positions=np.array([ep.branch_position for ep in eps], np.int32),
            texts=[render(self.tokenizer, ep) for ep in eps], feedback=[ep.feedback for ep in eps],
            generated_tokens=generated, turn_ids=stack("turn_id"),
            turn_rewards=stack("turn_rewards"),
            search_mask=stack("search_mask") if self.task.searches else None,
            num_turns=np.array([len(ep.actions) for ep in eps], np.int32),
            statuses=[ep.status for ep in eps], hindsight=hindsight)

    @staticmethod
    def _shared(ep: Episode) -> int:
        """Action tokens a branched episode took over from its parent (not generated for it)."""
        at, shared = 0, 0
        for p in ep.pieces:
            if p.turn >= 0:
                shared += max(0, min(len(p.ids), ep.branch_position - at))
            at += len(p.ids)
        return shared


def sample_episodes(model, tokenizer, task, pool: EnvPool, examples: Sequence[Example], *, key,
                    params: SamplingParams, group_size: int, max_turns: int, episode_tokens: int,
                    slots: int | None = None, chunk_steps: int = 16,
                    clock: PhaseClock | None = None, first_index: int = 0
                    ) -> tuple[list[GroupRows], list[list[Episode]]]:
    """Play ``group_size`` episodes of each example (:class:`EpisodePlayer`).

    Args:
      task: an :class:`hindsight.tasks.episodic.EpisodeTask` (setup, turn wording, action parsing,
        stop strings); pool: environments of ``task.env``, at least one worker per episode.
      key: PRNG key (:class:`EpisodePlayer`'s keys).
      params: sampling parameters (stop tokens included); ``max_new_tokens`` caps one turn.
      max_turns: actions per episode at most.
      episode_tokens: the response width ``T``: every turn and observation after the first prompt.
      clock: records ``turns`` tokens and seconds, ``env`` / ``env_wait`` (decoding waited for
        environments, every slot idle).
    Returns:
      ``(groups, episodes)``: P :class:`GroupRows` (``loss_mask`` on action tokens only, ``turn_ids``,
      ``turn_rewards``, rewards = episode returns) and the played :class:`Episode` s per group.
    """
    clock = clock if clock is not None else PhaseClock()
    keys = [[(k, g) for g in range(group_size)] for k in range(len(examples))]
    if pool.num_workers < len(examples) * group_size:
        raise ValueError(f"{len(examples) * group_size} episodes ({len(examples)} examples x "
                         f"{group_size}) need as many environment workers; the pool has "
                         f"{pool.num_workers}")
    player = EpisodePlayer(model, tokenizer, task, pool, examples, key=key, params=params,
                           max_turns=max_turns, episode_tokens=episode_tokens, clock=clock,
                           first_index=first_index)
    player.reset([ek for group in keys for ek in group])
    player.make_engine(slots=slots, chunk_steps=chunk_steps)
    for group in keys:
        player.start(group)
    player.run()
    groups = [player.group(k, group) for k, group in enumerate(keys)]
    return groups, [[player.episodes[ek] for ek in group] for group in keys]


def env_pool(task, *, workers: int, options: EpisodeOptions) -> EnvPool:
    """A pool of ``workers`` environments of ``task.env`` with ``options``' timeouts."""
    return EnvPool(task.env, workers=workers, step_timeout=options.step_timeout,
                   reset_timeout=options.reset_timeout)


def play(model, tokenizer, task, examples: Sequence[Example], *, key, params: SamplingParams,
         group_size: int, options: EpisodeOptions, slots: int | None = None,
         chunk_steps: int = 16, clock: PhaseClock | None = None, first_index: int = 0,
         tree=None, tree_options=None, pool: EnvPool | None = None):
    """:func:`sample_episodes`, or with ``tree`` (an HDL method config)
    :func:`hindsight.rollout.episode_trees.sample_episode_trees` under ``tree_options``, in
    ``pool`` (a training run keeps one across steps, so its environment processes start once) or
    in a pool of one worker per row created for the call and closed after it (every environment
    process with it). Returns ``(groups, episodes per group, tree infos or None)``."""
    if pool is None:
        with env_pool(task, workers=len(examples) * group_size, options=options) as own:
            return play(model, tokenizer, task, examples, key=key, params=params,
                        group_size=group_size, options=options, slots=slots,
                        chunk_steps=chunk_steps, clock=clock, first_index=first_index, tree=tree,
                        tree_options=tree_options, pool=own)
    if pool.spec != task.env:
        raise ValueError(f"`pool` runs environment {pool.spec.name!r}, task {task.name!r} plays "
                         f"{task.env.name!r}")
    common = dict(key=key, params=params, max_turns=options.max_turns,
                  episode_tokens=options.episode_tokens, slots=slots, chunk_steps=chunk_steps,
                  clock=clock, first_index=first_index)
    if tree is None:
        groups, played = sample_episodes(model, tokenizer, task, pool, examples,
                                         group_size=group_size, **common)
        return groups, played, None
    from hindsight.rollout.episode_trees import sample_episode_trees  # it builds on this module
    groups, infos, played = sample_episode_trees(model, tokenizer, task, pool, examples,
                                                 config=tree, options=tree_options, **common)
    return groups, played, infos


def _first_line(message: str) -> str:
    return message.splitlines()[0] if message else ""


def render(tokenizer, ep: Episode) -> str:
    """The episode turn by turn: the first observation, then each action and what came back; a
    branched episode marks where it left its parent with ``[branch]`` (tokens before it are the
    parent's)."""
    lines = [f"[observation] {ep.observations[0] if ep.observations else ''}"]
    obs = iter(ep.observations[1:])
    at = 0
    for ids, turn in ((p.ids, p.turn) for p in ep.pieces):
        if turn >= 0:
            reward = ep.rewards[turn] if turn < len(ep.rewards) else None
            text = _decode(tokenizer, ids).strip()
            if at < ep.branch_position < at + len(ids) or (ep.branch_position == at and at):
                cut = ep.branch_position - at
                text = (_decode(tokenizer, ids[:cut]) + " [branch] "
                        + _decode(tokenizer, ids[cut:])).strip()
            lines.append(f"[turn {turn}] {text}  -> action {ep.actions[turn]!r}"
                         + (f", reward {reward:g}" if reward is not None else ""))
        else:
            lines.append(f"[observation] {next(obs, '')}")
        at += len(ids)
    lines.append(f"[end] {ep.status}: {ep.feedback}")
    return "\n".join(lines)


def _decode(tokenizer, ids) -> str:
    return tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)
