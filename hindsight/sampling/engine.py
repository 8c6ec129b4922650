"""The sampler: a slot batch decoded in jitted chunks, refilled (and resized) between chunks.

Every sampling call runs here. Rows decode with their own positions, so any mix of work shares one
batch: the G rows of a prompt (prefilled once, then copied into G slots), branch continuations of
earlier results (their cache rows copied from the result, no prefix recomputation), and follow-up
turns after a finished result (its cache rows copied, only the new turn computed:
``submit_extend``). A host-side scheduler runs between chunks of ``chunk_steps`` decode steps: it
harvests finished rows, completes requests whose rows are all done, and refills free slots from the
queue (branches and follow-ups first, so that trees finish and free their caches early, the
rows that may decode the most tokens first among them; then prompts in submission order:
:mod:`hindsight.sampling.requests`). This turns the tokens an HDL tree saves into saved wall-clock:
continuations of prompt k share the batch with the roots of prompt k+1 instead of running as a
half-empty lock-step batch as long as their earliest branch. When fewer rows need decoding than
half the batch holds (a tree's roots, a group's last rows), the batch shrinks to the power of two
that holds them, and grows back when work arrives (``min_slots``): a decode step costs about the
same however many of its slots are active, so idle slots are not carried through a phase.

:func:`hindsight.sampling.generate` and :func:`hindsight.sampling.branch` are one engine each, sized
to hold their rows and run to completion in one chunk (one ``while_loop`` dispatch); their result
takes over the slot batch's cache rather than copying it.

Compiles: one decode chunk per (slot batch width, max_len, params, attention window: a power of
two from 128 up to max_len, :func:`hindsight.sampling.decode.kv_window`), one prefill per (prompt
batch bucket, prompt length bucket up to 128), one extension per (rows bucket, piece width: a
bucket up to 128, window): prompts and turns longer than 128 tokens are fed in pieces of at most
128 (:func:`hindsight.sampling.decode.extend_in_chunks`), so no length compiles a width anew, one row
move per (rows-moved bucket, source batch), one gather of a fresh slot batch per source batch,
one resize per (old width, new width).
"""
from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from hindsight.sampling import cache_rows, inputs, requests
from hindsight.sampling.buckets import pow2_bucket
from hindsight.sampling.decode import (DecodeState, decode_steps, extend_in_chunks,
                                      graph_and_weights, kv_window, prefill_in_chunks)
from hindsight.sampling.params import SamplingParams
from hindsight.sampling.requests import Request


@dataclasses.dataclass(frozen=True)
class Rollouts:
    """Sampled responses of B rows (rows of a group are contiguous), host-side numpy plus the device
    decode state for branching.

    Attributes:
      tokens: ``[B,T]`` int32 response tokens (0 after the length), T = the call's max new tokens.
      mask: ``[B,T]`` bool, True on real response tokens (the stop token included).
      lengths: ``[B]`` int32 response lengths.
      logprobs: ``[B,T]`` f32 log-probs under the sampled (temperature + truncation) distribution
        (0 where masked; 0 everywhere for greedy).
      policy_logprobs: ``[B,T]`` f32 untruncated log-probs at the sampling temperature (0 where masked).
      raw_logprobs: ``[B,T]`` f32 untruncated log-probs at temperature 1 (0 where masked): a
        teacher-forced re-score at temperature 1 without the re-score.
      prompt_lengths: ``[B]`` int32.
      stopped: ``[B]`` bool, the row ended on a stop token (else it hit its max new tokens).
      branch_positions: ``[B]`` int32, first response position this call sampled (0 for fresh rows;
        for a branch, the resampled position: positions before it are the parent's tokens, so an
        HDL loss mask is ``mask & (t >= branch_positions[:, None])``).
      parents: ``[B]`` int32, the source row of a branch in the parent `Rollouts`, -1 for fresh rows.
      max_new_tokens: ``[B]`` int32 per-row cap the rows were sampled with.
      keys: ``[B]`` typed PRNG keys, one per row.
      params: the `SamplingParams` used.
      state: device `DecodeState` (rows ``>= B`` are bucket padding; ``cache`` is None unless the
        result was kept for branching).
      cache_dtype: the KV-cache dtype the rows were sampled with (None: the model's compute dtype).
    """

    tokens: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray
    logprobs: np.ndarray
    policy_logprobs: np.ndarray
    raw_logprobs: np.ndarray
    prompt_lengths: np.ndarray
    stopped: np.ndarray
    branch_positions: np.ndarray
    parents: np.ndarray
    max_new_tokens: np.ndarray
    keys: jax.Array
    params: SamplingParams
    state: DecodeState = dataclasses.field(repr=False)
    cache_dtype: object = dataclasses.field(default=None, repr=False)

    @property
    def num_rows(self) -> int:
        return int(self.lengths.shape[0])

    def sequence(self, row: int) -> np.ndarray:
        """Prompt + response token ids of ``row``."""
        end = int(self.prompt_lengths[row] + self.lengths[row])
        return np.asarray(jax.device_get(self.state.tokens[row, :end]))

    def prompt(self, row: int) -> np.ndarray:
        return np.asarray(jax.device_get(self.state.tokens[row, : int(self.prompt_lengths[row])]))


class Engine:
    """Continuous-batching sampler over one model and one `SamplingParams`.

    Args:
      model: NNX decoder obeying ``model(tokens, positions, *, cache, return_hidden)`` and
        ``model.init_cache(batch, max_len, *, dtype)``.
      params: sampling parameters shared by all requests (static: compiled once).
      slots: most rows decoded together (bucketed to a power of two).
      min_slots: narrowest slot batch (a power of two, default ``max(1, slots // 8)``): between
        chunks the batch is resized to the power of two that holds the rows decoding and queued
        (at least this, at most ``slots``), so a phase with few rows (an HDL tree's roots, the
        last rows of a group) does not pay for idle slots. Why: a decode step's cost grows with
        the slot batch, active or not (SmolLM2-135M on 2 AMD EPYC cores, float32, cache 256:
        109 / 142 / 224 / 392 ms per step at 4 / 8 / 16 / 32 slots). Each width compiles its own
        decode chunk once; ``min_slots=slots`` keeps one width.
      max_len: cache length of every slot; prompt + max new tokens must fit.
      chunk_steps: most decode steps between scheduling points.
      refill_at: while work is queued, a chunk also ends as soon as this many slots have finished
        (default an eighth of the current slot batch, at least 1), so freed slots idle for few
        steps without a host round trip per finished row.
      cache_dtype: KV-cache dtype (default the model's compute dtype).
      name: label for statistics (e.g. ``"main"``).

    Use: `submit` / `submit_branch` / `submit_extend` requests, then `run` (optionally with a
    callback that submits follow-up work, e.g. branches of a finished group) or `step` manually.
    """

    def __init__(self, model, params: SamplingParams, *, slots: int, max_len: int, chunk_steps: int = 16,
                 min_slots: int | None = None, refill_at: int | None = None, cache_dtype=None,
                 name: str = "engine"):
        if slots < 1 or chunk_steps < 1 or max_len < 2:
            raise ValueError(f"need slots >= 1, chunk_steps >= 1, max_len >= 2; got {slots}, {chunk_steps}, {max_len}")
        if min_slots is not None and not 1 <= min_slots <= slots:
            raise ValueError(f"`min_slots` must be in [1, slots={slots}], got {min_slots}")
        self.vocab = model.config.vocab_size
        params.check_vocab(self.vocab)
        self.model, self.params, self.name = model, params, name
        self._trace_params = params.for_trace()
        self.slots, self.max_len, self.chunk_steps = pow2_bucket(slots), int(max_len), int(chunk_steps)
        self.min_slots = pow2_bucket(max(1, self.slots // 8) if min_slots is None else min_slots)
        self._refill_at = refill_at
        self.cache_dtype = cache_dtype
        self.axes = cache_rows.static_axes(model, self.max_len, cache_dtype)
        self.graphdef, self.weights = graph_and_weights(model, unroll=True)
        self._next_id = 0
        self._prompts: collections.deque[Request] = collections.deque()
        self._branches: collections.deque[Request] = collections.deque()
        self._owner = []  # (request, row) per slot of the current slot batch
        self._state = None
        # chunks, prefills, moves, extends, resizes; prefill_tokens / extend_tokens (prompt and
        # follow-up turn tokens computed: the cache reuse shows as few of them); steps (decode
        # steps run), row_steps (tokens kept: steps x active rows), slot_steps (steps x slot batch
        # width: what was computed), stop_dropped_tokens (decoded past a stop string within a
        # chunk); refill_s / decode_s / harvest_s / extend_s
        self.stats = collections.Counter()

    # ----------------------------------------------------------------------------- submission
    def submit(self, prompt, *, num_samples: int = 1, key=None, row_keys=None, max_new_tokens=None,
               stop_tokens=None, stop_check: Callable | None = None, keep_cache: bool = False,
               tag=None) -> int:
        """Queue ``num_samples`` rows of one prompt (prefilled once when first scheduled).

        ``keep_cache=True`` keeps the rows' caches in the result so it can be branched or extended.
        ``stop_check(response_ids) -> int | None`` ends a row at a stop *string*
        (:class:`hindsight.sampling.text.StopStrings`): called on each decoding row's response
        after every chunk, it returns the length to cut the response to (the tokens up to the one
        that completes the string) or None; the result's ``stopped`` is True for such rows. Tokens
        decoded past the cut in the same chunk are dropped (their cache slots are rewritten before
        they are ever read). Returns the request id (also on the result as ``tag`` if none is
        given).
        """
        (seq,) = inputs.token_lists("prompt", [prompt], vocab_size=self.vocab)
        n = int(num_samples)
        if n < 1:
            raise ValueError(f"`num_samples` must be >= 1, got {num_samples}")
        max_new = inputs.per_row_ints("max_new_tokens", self.params.max_new_tokens if max_new_tokens is None
                                      else max_new_tokens, n, minimum=1)
        if seq.size + max_new.max() > self.max_len:
            raise ValueError(f"prompt ({seq.size} tokens) plus max_new_tokens ({max_new.max()}) exceeds the "
                             f"engine's max_len={self.max_len}")
        keys = inputs.row_keys(key, row_keys, n)
        stops = inputs.stop_table(stop_tokens, n, default=self.params.stop_tokens, vocab_size=self.vocab)
        return self._submit_prompts([seq], n, max_new=max_new, keys=keys, stops=stops,
                                    keep_cache=keep_cache, tag=tag, stop_check=stop_check)

    def _submit_prompts(self, seqs, num_samples: int, *, max_new, keys, stops, keep_cache, tag=None,
                        stop_check=None) -> int:
        """Queue one request of ``num_samples`` rows per prompt of ``seqs`` (validated int32 arrays
        that fit with their ``max_new [P*G]``; ``keys [P*G]`` typed, ``stops [P*G, K]``); rows
        ``[p*G, (p+1)*G)`` are prompt p's, each prompt prefilled once. `submit` is the one-prompt
        case; :func:`hindsight.sampling.generate` submits all its prompts as one request."""
        index = np.repeat(np.arange(len(seqs)), num_samples)
        plen = np.array([seqs[i].size for i in index], np.int32)
        req = self._request(index.size, tag, seqs=inputs.pad_rows([seqs[i] for i in index], rows=index.size,
                                                                  width=self.max_len),
                            plen=plen, starts=plen - 1, max_new=max_new, keys=keys, stops=stops,
                            keep_cache=keep_cache)
        req.prompts, req.prompt_of = list(seqs), index
        req.stop_check = requests.checked_stop(stop_check)
        self._prompts.append(req)
        return req.rid

    def submit_branch(self, rollouts: Rollouts, rows, positions, counts=1, *, key=None, row_keys=None,
                      max_new_tokens=None, stop_check: Callable | None = None,
                      keep_cache: bool = False, tag=None) -> int:
        """Queue ``counts[i]`` continuations of ``rollouts`` row ``rows[i]`` from response position
        ``positions[i]`` (that token is resampled; see :func:`hindsight.sampling.branch`).

        ``rollouts`` must carry its cache (e.g. ``submit(..., keep_cache=True)``, or any `generate`
        / `branch` result) and have this engine's ``max_len``. ``max_new_tokens``: per-new-row cap
        on the *total* response length (default: the source row's); it must exceed the branch
        position. ``stop_check``: as in :meth:`submit`, on the whole response (the kept prefix
        before the branch position included), e.g. to end a branched episode turn at its action's
        closing tag.
        """
        if rollouts.state.tokens.shape[1] != self.max_len:
            raise ValueError(f"rollouts have cache length {rollouts.state.tokens.shape[1]}, engine {self.max_len}")
        src, pos = requests.branch_requests(rollouts, rows, positions, counts)
        if rollouts.state.cache is None:
            raise ValueError("these rollouts carry no cache: submit them with keep_cache=True to branch them")
        n = src.size
        max_new = (rollouts.max_new_tokens[src] if max_new_tokens is None else
                   inputs.per_row_ints("max_new_tokens", max_new_tokens, n, minimum=1))
        plen = rollouts.prompt_lengths[src]
        if np.any(plen + max_new > self.max_len):
            raise ValueError(f"prompt + max_new_tokens exceeds the source cache length {self.max_len}")
        if np.any(max_new <= pos):
            raise ValueError("`max_new_tokens` must exceed each branch position")
        keys = inputs.row_keys(key, row_keys, n)
        host = jax.device_get((rollouts.state.tokens, rollouts.state.logprobs,
                               rollouts.state.policy_logprobs, rollouts.state.raw_logprobs,
                               rollouts.state.stops))
        seq, lp, plp, raw, stops = (np.asarray(x)[src] for x in host)
        start = plen + pos - 1
        keep = np.arange(self.max_len)[None, :] <= start[:, None]
        req = self._request(n, tag, seqs=np.where(keep, seq, 0), plen=plen, starts=start,
                            max_new=max_new, keys=keys, stops=stops, keep_cache=keep_cache)
        req.logprobs, req.policy_logprobs, req.raw_logprobs = (np.where(keep, a, 0)
                                                               for a in (lp, plp, raw))
        req.parents, req.branch_positions = src, pos
        req.stop_check = requests.checked_stop(stop_check)
        req.caches, req.cache_of, req.source_rows = [rollouts.state.cache], np.zeros(n, np.int32), src
        self._branches.append(req)
        return req.rid

    def submit_extend(self, rollouts: Rollouts, rows, suffixes, *, max_new_tokens=None, key=None,
                      row_keys=None, stop_tokens=None, stop_check: Callable | None = None,
                      keep_cache: bool = False, tag=None) -> int:
        """Queue one row per ``rows[i]`` whose prompt is that row's whole sequence in ``rollouts``
        (prompt + response) followed by ``suffixes[i]``: a follow-up turn after a sampled answer,
        e.g. a request to reflect on it. The row's cached K/V are reused (copied, as a branch's
        are) and only the suffix is computed, in one forward pass over the new rows at submission.

        Token for token, a row samples what ``submit(sequence + suffix, row_keys=...)`` samples.

        Args:
          rollouts: a result with its cache (``keep_cache=True``) from this engine.
          rows: ``[N]`` rows of ``rollouts``; suffixes: N non-empty token sequences.
          max_new_tokens: int or ``[N]`` (default: the params' cap); sequence + suffix + it must
            fit in ``max_len``.
          stop_check: as in :meth:`submit`, on the new turn's tokens.
        The result's ``prompt_lengths`` count the sequence and the suffix; ``parents`` are ``rows``.
        """
        if rollouts.state.tokens.shape[1] != self.max_len:
            raise ValueError(f"rollouts have cache length {rollouts.state.tokens.shape[1]}, engine {self.max_len}")
        if rollouts.state.cache is None:
            raise ValueError("these rollouts carry no cache: submit them with keep_cache=True to extend them")
        src = inputs.row_indices("rows", rows, rollouts.num_rows)
        suffix = inputs.token_lists("suffixes", suffixes, vocab_size=self.vocab)
        n = src.size
        if len(suffix) != n:
            raise ValueError(f"{n} rows but {len(suffix)} suffixes")
        max_new = inputs.per_row_ints("max_new_tokens", self.params.max_new_tokens if max_new_tokens is None
                                      else max_new_tokens, n, minimum=1)
        length = rollouts.prompt_lengths[src] + rollouts.lengths[src]  # the sequence so far
        plen = (length + np.array([s.size for s in suffix])).astype(np.int32)
        over = np.nonzero(plen + max_new > self.max_len)[0]
        if over.size:
            i = over[0]
            raise ValueError(f"row {src[i]}'s sequence ({length[i]} tokens) plus its suffix "
                             f"({suffix[i].size}) plus max_new_tokens ({max_new[i]}) exceeds the "
                             f"engine's max_len={self.max_len}")
        keys = inputs.row_keys(key, row_keys, n)
        stops = inputs.stop_table(stop_tokens, n, default=self.params.stop_tokens, vocab_size=self.vocab)
        seqs = np.array(jax.device_get(rollouts.state.tokens))[src]
        for i, s in enumerate(suffix):
            seqs[i, length[i]:] = 0
            seqs[i, length[i]:plen[i]] = s
        # the forward feeds the sequence's last token (its K/V may not be cached: a row stops
        # before feeding its last sample) and all but the suffix's last token, which the first
        # decode step feeds, as after a prefill; in pieces of fixed widths (`extend_in_chunks`)
        width = int((plen - length).max())
        bb = pow2_bucket(n)
        feed = np.zeros((bb, width), np.int32)
        positions = np.zeros((bb, width), np.int32)
        feed_mask = np.zeros((bb, width), bool)  # the real tokens fed (padding rows: none)
        for i in range(n):
            s = plen[i] - length[i]
            feed[i, :s] = seqs[i, length[i] - 1:plen[i] - 1]
            feed_mask[i, :s] = True
            positions[i] = length[i] - 1 + np.arange(width)
        t0 = time.perf_counter()
        cache = cache_rows.take_rows(rollouts.state.cache, np.pad(src, (0, bb - n), mode="edge"), self.axes)
        cache = extend_in_chunks(self.graphdef, self.weights, cache, feed, positions, feed_mask,
                                 max_len=self.max_len)
        jax.block_until_ready(cache)
        self.stats["extends"] += 1
        self.stats["extend_tokens"] += int((plen - length).sum())
        self.stats["extend_s"] += time.perf_counter() - t0
        req = self._request(n, tag, seqs=seqs, plen=plen, starts=plen - 1, max_new=max_new, keys=keys,
                            stops=stops, keep_cache=keep_cache)
        req.stop_check = requests.checked_stop(stop_check)
        req.parents = src
        req.caches, req.cache_of, req.source_rows = [cache], np.zeros(n, np.int32), np.arange(n, dtype=np.int32)
        self._branches.append(req)  # like branches: they finish trees, and hold a cache
        return req.rid

    def _request(self, n, tag, *, seqs, plen, starts, max_new, keys, stops, keep_cache):
        rid, self._next_id = self._next_id, self._next_id + 1
        zeros = np.zeros((n, self.max_len), np.float32)
        starts = starts.astype(np.int32)
        return Request(rid=rid, tag=rid if tag is None else tag, n=n, seqs=seqs, prompt_lengths=plen,
                        starts=starts, max_new=max_new,
                        keys=np.asarray(jax.random.key_data(keys)), stops=stops, logprobs=zeros,
                        policy_logprobs=zeros, raw_logprobs=zeros, parents=np.full(n, -1, np.int32),
                        branch_positions=np.zeros(n, np.int32), keep_cache=keep_cache,
                        order=np.argsort(-requests.budgets(plen, max_new, starts), kind="stable"))

    # ----------------------------------------------------------------------------- scheduling
    @property
    def idle(self) -> bool:
        """No queued rows and no row decoding."""
        return not self._prompts and not self._branches and all(o is None for o in self._owner)

    def run(self, on_result: Callable[[object, Rollouts], None] | None = None) -> dict:
        """Step until idle. ``on_result(tag, rollouts)`` is called for each completed request (it may
        submit more work); returns ``{tag: Rollouts}`` of all requests completed during the run."""
        out = {}
        while not self.idle:
            for tag, res in self.step():
                out[tag] = res
                if on_result is not None:
                    on_result(tag, res)
        return out

    def step(self) -> list[tuple[object, Rollouts]]:
        """Refill free slots, decode one chunk, harvest. Returns ``[(tag, Rollouts)]`` completed."""
        t0 = time.perf_counter()
        host = self._host_state()
        self._refill(host)
        pos0, active0 = host["pos"].copy(), host["active"].copy()
        self._state = self._push(host)
        t1 = time.perf_counter()
        width = len(self._owner)
        busy = sum(o is not None for o in self._owner)
        refill_at = max(1, width // 8) if self._refill_at is None else self._refill_at
        min_active = max(0, busy - refill_at) if (self._prompts or self._branches) else 0
        # attention reads the cache's live front only: every row's position stays below the
        # window for the whole chunk (finished and padding rows keep feeding their own `pos`).
        # A chunk that would cross into a larger window stops at the crossing instead: its steps
        # before it then read the smaller one (a one-chunk `generate` crosses log2(M / 128) times)
        max_pos = int(host["pos"].max(initial=0))
        steps, window = self.chunk_steps, kv_window(max_pos, self.chunk_steps, self.max_len)
        front = kv_window(max_pos, 1, self.max_len)
        if front < window:
            steps, window = front - max_pos, front
        self.stats["window_slots"] += window  # per chunk; / chunks = the mean window
        self._state = decode_steps(self.graphdef, self.weights, self._state, jnp.int32(steps),
                                   jnp.int32(min_active), params=self._trace_params, window=window)
        jax.block_until_ready(self._state.active)
        t2 = time.perf_counter()
        self.stats["chunks"] += 1
        done = self._harvest()
        # the row active longest advanced once per step, so the largest advance is the step count
        advance = self._host["pos"] - pos0
        steps = int(advance[active0].max(initial=0))
        self.stats["steps"] += steps
        self.stats["slot_steps"] += steps * width
        self.stats["row_steps"] += int(advance.sum())
        self.stats["refill_s"] += t1 - t0
        self.stats["decode_s"] += t2 - t1
        self.stats["harvest_s"] += time.perf_counter() - t2
        return done

    def _width(self, busy: int) -> int:
        """Slot batch for ``busy`` decoding rows plus the queued ones (see ``min_slots``)."""
        queued = sum(r.n - r.placed for q in (self._prompts, self._branches) for r in q)
        return min(self.slots, pow2_bucket(busy + queued, self.min_slots))

    def _host_state(self) -> dict:
        """The host-side slot batch the next chunk starts from, resized (`_width`) when it would
        hold twice the rows it needs or fewer than it needs. A resize gathers the decoding rows
        (moved to the front when the batch shrinks) and their cache rows into the new width; the
        other slots are free, so nothing decoding changes but its slot index."""
        busy = [s for s, o in enumerate(self._owner) if o is not None]
        width = self._width(len(busy))
        if self._state is None or (not busy and width != len(self._owner)):
            # a fresh batch: its cache is built by the first refill
            b, m = width, self.max_len
            self._state, self._state_cache, self._owner = None, None, [None] * b
            return dict(tokens=np.zeros((b, m), np.int32), logprobs=np.zeros((b, m), np.float32),
                        policy_logprobs=np.zeros((b, m), np.float32),
                        raw_logprobs=np.zeros((b, m), np.float32), last=np.zeros(b, np.int32),
                        pos=np.zeros(b, np.int32), end=np.ones(b, np.int32), active=np.zeros(b, bool),
                        keys=np.zeros((b, 2), np.uint32), stops=np.full((b, 1), -1, np.int32))
        self._state_cache = self._state.cache
        if width == len(self._owner):
            return self._host
        keep = list(range(len(self._owner))) if width > len(self._owner) else busy
        rows = np.array(keep + [keep[0]] * (width - len(keep)), np.int32)
        host = {k: v[rows] for k, v in self._host.items()}
        host["active"][len(keep):] = False
        self._state_cache = cache_rows.take_rows(self._state_cache, rows, self.axes)
        self._owner = [self._owner[s] for s in keep] + [None] * (width - len(keep))
        self.stats["resizes"] += 1
        return host

    def _push(self, host: dict) -> DecodeState:
        if self._state_cache is None:  # stepped with nothing to decode
            self._state_cache = self.model.init_cache(len(self._owner), self.max_len, dtype=self.cache_dtype)
        fields = {k: jnp.asarray(v) for k, v in host.items()}
        fields["keys"] = jax.random.wrap_key_data(fields["keys"])
        return DecodeState(cache=self._state_cache, **fields)

    def _refill(self, host: dict) -> None:
        free = [s for s, o in enumerate(self._owner) if o is None]
        plan = []  # (request, slots [k], rows [k]): a request gets at most one run of rows per refill
        takes = requests.longest_first(self._branches, len(free))
        takes += requests.in_turn(self._prompts, len(free) - sum(k for _, k in takes))
        for req, k in takes:
            # which rows matters, not which slot each takes: in row order, a request placed
            # whole keeps rows == slots (`generate` / `branch` then take the batch over)
            rows = np.sort(req.order[req.placed:req.placed + k]).astype(np.int32)
            plan.append((req, np.array(free[:k], np.int32), rows))
            free, req.placed = free[k:], req.placed + k
        for queue in (self._branches, self._prompts):
            if any(req.placed == req.n for req in queue):
                kept = [req for req in queue if req.placed < req.n]
                queue.clear()
                queue.extend(kept)
        if not plan:
            return
        self._prefill_sources([req for req, _, _ in plan if req.caches is None])
        moves = {}  # id(source cache) -> (cache, [slot arrays], [source row arrays])
        for req, slots, rows in plan:
            which = req.cache_of[rows]
            for c in np.unique(which):
                sel = which == c
                cache = req.caches[c]
                _, dst, src = moves.setdefault(id(cache), (cache, [], []))
                dst.append(slots[sel]), src.append(req.source_rows[rows[sel]])
        for cache, dst, src in moves.values():
            dst, src = np.concatenate(dst), np.concatenate(src)
            if self._state_cache is None and [x.dtype for x in jax.tree.leaves(cache)] == self.axes.dtypes:
                # a fresh batch is gathered from its first source (free slots get a copy of a row)
                rows = np.full(len(self._owner), src[0], np.int32)
                rows[dst] = src
                self._state_cache = cache_rows.take_rows(cache, rows, self.axes)
            else:
                if self._state_cache is None:
                    self._state_cache = self.model.init_cache(len(self._owner), self.max_len,
                                                              dtype=self.cache_dtype)
                self._state_cache = cache_rows.move_rows(self._state_cache, dst, cache, src, self.axes)
            self.stats["moves"] += 1
        k = max(host["stops"].shape[1], max(req.stops.shape[1] for req, _, _ in plan))
        if k > host["stops"].shape[1]:
            host["stops"] = np.pad(host["stops"], ((0, 0), (0, k - host["stops"].shape[1])), constant_values=-1)
        for req, slots, rows in plan:
            start = req.starts[rows]
            host["tokens"][slots] = req.seqs[rows]
            host["logprobs"][slots] = req.logprobs[rows]
            host["policy_logprobs"][slots] = req.policy_logprobs[rows]
            host["raw_logprobs"][slots] = req.raw_logprobs[rows]
            host["last"][slots], host["pos"][slots] = req.seqs[rows, start], start
            host["end"][slots] = req.prompt_lengths[rows] + req.max_new[rows]
            host["active"][slots] = True
            host["keys"][slots] = req.keys[rows]
            host["stops"][slots] = -1
            host["stops"][slots, : req.stops.shape[1]] = req.stops[rows]
            for slot, row in zip(slots.tolist(), rows.tolist()):
                self._owner[slot] = (req, row)

    def _prefill_sources(self, reqs) -> None:
        """Prefill the prompts of every request about to get its first slot, in batches of
        power-of-two sizes that add up to their number (6 -> 4 + 2): a prefill is compute-bound, so
        padding 6 prompts to 8 rows would cost a third more; each batch is as wide as its longest
        prompt's bucket (longest first, so that short prompts share narrow batches), past 128
        tokens in pieces (:func:`hindsight.sampling.decode.prefill_in_chunks`)."""
        units = sorted(((r, i, p) for r in reqs for i, p in enumerate(r.prompts)), key=lambda u: -u[2].size)
        for r in reqs:
            r.caches, r.cache_of, r.source_rows = [], np.zeros(r.n, np.int32), np.zeros(r.n, np.int32)
        while units:
            size = 1 << (len(units).bit_length() - 1)  # the largest power of two <= len(units)
            batch, units = units[:size], units[size:]
            cache = prefill_in_chunks(self.graphdef, self.weights, [p for _, _, p in batch],
                                      max_len=self.max_len, cache_dtype=self.cache_dtype)
            self.stats["prefills"] += 1
            self.stats["prefill_tokens"] += sum(p.size for _, _, p in batch)
            for j, (r, i, _) in enumerate(batch):
                rows = r.prompt_of == i
                if not r.caches or r.caches[-1] is not cache:
                    r.caches.append(cache)
                r.cache_of[rows], r.source_rows[rows] = len(r.caches) - 1, j
        for r in reqs:
            r.prompts = None

    def _harvest(self) -> list[tuple[object, Rollouts]]:
        st = self._state
        host = jax.device_get(st._replace(cache=None, keys=jax.random.key_data(st.keys)))
        self._host = {k: np.array(v) for k, v in host._asdict().items() if k != "cache"}
        seq, lp, plp = self._host["tokens"], self._host["logprobs"], self._host["policy_logprobs"]
        raw = self._host["raw_logprobs"]
        pos, active = self._host["pos"], self._host["active"]
        self._check_stops(seq, pos, active)
        finished = collections.defaultdict(list)
        for slot, owner in enumerate(self._owner):
            if owner is not None and not active[slot]:
                finished[id(owner[0])].append((slot, *owner))
                self._owner[slot] = None
        # a kept request that held the whole batch alone (row i in slot i, nothing else decoding)
        # takes the final slot batch over (cache included) instead of copying its rows out; the
        # next step starts a fresh batch
        alone = len(finished) == 1 and all(o is None for o in self._owner)
        done = []
        for group in finished.values():
            req = group[0][1]
            slots = [s for s, _, _ in group]
            rows = [row for _, _, row in group]
            if req.out_seq is None:
                req.out_seq, req.out_lp, req.out_plp, req.out_raw = (
                    np.zeros_like(a) for a in (req.seqs, req.logprobs, req.logprobs, req.logprobs))
                req.out_pos = np.zeros(req.n, np.int32)
            req.out_seq[rows], req.out_lp[rows], req.out_plp[rows] = seq[slots], lp[slots], plp[slots]
            req.out_raw[rows] = raw[slots]
            req.out_pos[rows] = pos[slots]
            if req.keep_cache:
                if (alone and len(group) == req.n and slots == rows == list(range(req.n))
                        and len(self._owner) == pow2_bucket(req.n)):
                    req.final, self._state = self._state, None
                else:
                    if req.archive is None:
                        req.archive = self.model.init_cache(pow2_bucket(req.n), self.max_len,
                                                            dtype=self.cache_dtype)
                    req.archive = cache_rows.move_rows(req.archive, rows, self._state.cache, slots, self.axes)
            req.done += len(group)
            if req.done == req.n:
                done.append((req.tag, self._result(req)))
        return done

    def _check_stops(self, seq, pos, active) -> None:
        """End rows whose request's ``stop_check`` finds a stop string in this chunk's tokens
        (rows that finished inside the chunk included: the string may come before their stop
        token), cutting ``pos`` back to the token that completes it."""
        for slot, owner in enumerate(self._owner):
            if owner is None or owner[0].stop_check is None:
                continue
            req, row = owner
            start = int(req.prompt_lengths[row])
            if req.stop_hit is not None and req.stop_hit[row]:
                continue
            cut = req.stop_check(seq[slot, start:pos[slot] + 1])
            if cut is None:
                continue
            if not 1 <= cut <= pos[slot] + 1 - start:
                raise ValueError(f"stop_check returned {cut} for a response of "
                                 f"{pos[slot] + 1 - start} tokens")
            if req.stop_hit is None:
                req.stop_hit = np.zeros(req.n, bool)
            req.stop_hit[row] = True
            self.stats["stop_dropped_tokens"] += int(pos[slot] - (start + cut - 1))
            pos[slot], active[slot] = start + cut - 1, False
            self._host["last"][slot] = seq[slot, pos[slot]]

    def _result(self, req: Request) -> Rollouts:
        """The finished request's rows as a `Rollouts` (responses cut out of the sequences)."""
        n, seq, pos, plen = req.n, req.out_seq, req.out_pos, req.prompt_lengths
        t_max = int(req.max_new.max())
        lengths = (pos - plen + 1).astype(np.int32)
        idx = np.minimum(plen[:, None] + np.arange(t_max)[None, :], self.max_len - 1)
        mask = np.arange(t_max)[None, :] < lengths[:, None]
        take = lambda a, dtype: np.where(mask, np.take_along_axis(a, idx, axis=1), 0).astype(dtype)
        stopped = np.any(seq[np.arange(n), pos][:, None] == req.stops, axis=-1)
        if req.stop_hit is not None:
            stopped |= req.stop_hit
        state = req.final
        if state is None:
            bb = pow2_bucket(n)
            pad = lambda a: jnp.asarray(np.concatenate([a, np.repeat(a[:1], bb - n, axis=0)]) if bb > n else a)
            state = DecodeState(
                cache=req.archive, tokens=pad(seq), logprobs=pad(req.out_lp), policy_logprobs=pad(req.out_plp),
                raw_logprobs=pad(req.out_raw),
                last=pad(seq[np.arange(n), pos]), pos=pad(pos), end=pad(plen + req.max_new),
                active=jnp.zeros(bb, bool), keys=jax.random.wrap_key_data(pad(req.keys)), stops=pad(req.stops))
        req.caches = req.seqs = req.final = None  # release the prefill / parent cache references
        return Rollouts(tokens=take(seq, np.int32), mask=mask, lengths=lengths,
                        logprobs=take(req.out_lp, np.float32), policy_logprobs=take(req.out_plp, np.float32),
                        raw_logprobs=take(req.out_raw, np.float32),
                        prompt_lengths=np.asarray(plen, np.int32), stopped=stopped,
                        branch_positions=np.asarray(req.branch_positions, np.int32),
                        parents=np.asarray(req.parents, np.int32), max_new_tokens=np.asarray(req.max_new, np.int32),
                        keys=jax.random.wrap_key_data(jnp.asarray(req.keys)), params=self.params, state=state,
                        cache_dtype=self.cache_dtype)

