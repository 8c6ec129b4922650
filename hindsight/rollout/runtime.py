"""What every rollout shape shares: the sampling engine, per-request keys, and the wall-clock
split by phase while engines decode and a :class:`~hindsight.rollout.verification.Verifier` checks.

All shapes decode through a continuous-batching :class:`hindsight.sampling.engine.Engine`, so rows
of different prompts (and HDL's continuations) share the slot batch and decoding stays
throughput-bound.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from collections.abc import Sequence

import jax
import jax.monitoring
import numpy as np

from hindsight.sampling import SamplingParams
from hindsight.sampling.buckets import cache_len_bucket
from hindsight.sampling.engine import Engine
from hindsight.rollout.verification import Verifier


_COMPILE = {"seconds": 0.0, "listening": False}


def _record_compile(event: str, seconds: float, **_) -> None:
    if event.startswith("/jax/core/compile/"):
        _COMPILE["seconds"] += seconds


def compile_seconds() -> float:
    """Seconds this process has spent tracing, lowering and compiling programs (``jax.monitoring``'s
    ``/jax/core/compile/*`` duration events) since its first call: read it before and after a
    piece of work to learn how much of that work's wall-clock was compiling (shapes seen for the
    first time; a persistent compilation cache shortens but does not remove it)."""
    if not _COMPILE["listening"]:
        jax.monitoring.register_event_duration_secs_listener(_record_compile)
        _COMPILE["listening"] = True
    return _COMPILE["seconds"]


def with_eos(params: SamplingParams, tokenizer) -> SamplingParams:
    """``params`` with the tokenizer's end-of-sequence id added to the stop tokens."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None or eos in params.stop_tokens:
        return params
    return dataclasses.replace(params, stop_tokens=tuple(params.stop_tokens) + (int(eos),))


def make_engine(model, params: SamplingParams, *, longest_prompt: int, max_new_tokens: int,
                rows: int, slots: int | None, chunk_steps: int, min_len: int = 0,
                name: str = "main") -> Engine:
    """An engine whose cache fits ``longest_prompt + max_new_tokens`` (and ``min_len`` tokens: e.g.
    a follow-up turn after a whole response); ``slots`` defaults to ``min(rows, 64)`` (the whole
    first wave when it fits)."""
    max_len = cache_len_bucket(longest_prompt, max_new_tokens, min_len=min_len)
    return Engine(model, params, slots=slots or min(rows, 64), max_len=max_len,
                  chunk_steps=chunk_steps, name=name)


def request_key(key, *path: int):
    """A key for one engine request, folded from ``key`` along ``path`` (e.g. prompt, kind, root):
    a request's draws do not depend on the order the engine schedules it in."""
    for i in path:
        key = jax.random.fold_in(key, i)
    return key


def fit_width(a: np.ndarray, width: int) -> np.ndarray:
    """``a [n, w]`` cut or zero-padded to ``[n, width]``."""
    if a.shape[1] >= width:
        return a[:, :width]
    return np.pad(a, ((0, 0), (0, width - a.shape[1])))


class PhaseClock:
    """Wall-clock and generated tokens by phase.

    Host work done in engine callbacks (verification, hindsight scoring) is timed directly. An
    engine's decode time (its steps, plus untimed callback work) is shared by the phases whose
    tokens it generated, in proportion to their tokens (a decode step costs the same for every
    active slot); tokens counted in a callback belong to the engine whose result it handles. So
    when several engines run (e.g. one with a longer cache for some phase), each one's steps are
    charged to its own phases, not spread over the others'.
    """

    def __init__(self):
        self.host = collections.Counter()
        self.tokens = collections.Counter()
        self.engine_seconds = collections.Counter()  # per engine name
        self.engine_tokens: dict[str, collections.Counter] = {}  # per engine name: tokens by phase
        self.engines: dict[str, collections.Counter] = {}  # per engine name: its stats, summed
        self.compile_seconds = 0.0  # compiling inside the timed phases (part of their seconds)
        self._depth = 0

    @contextlib.contextmanager
    def _measured(self):
        """Count the compile time inside the outermost timed region (phases nest: a host phase
        runs in an engine's result callback)."""
        self._depth += 1
        start = compile_seconds() if self._depth == 1 else 0.0
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.compile_seconds += compile_seconds() - start

    @contextlib.contextmanager
    def host_phase(self, name: str):
        start = time.perf_counter()
        try:
            with self._measured():
                yield
        finally:
            self.host[name] += time.perf_counter() - start

    def run(self, engines: Sequence[Engine], on_result, verifier: Verifier | None = None) -> None:
        """Step ``engines`` in turn (one decode chunk each) until all are idle and ``verifier`` has
        no check out, calling ``on_result(tag, rollouts)`` for each completed request (it may
        submit more work to any engine, or rows to ``verifier``). Between steps the finished
        checks' callbacks run (host time not inside one of their own phases goes to ``verify``);
        when every engine is idle and checks are out, the wait for the oldest is ``verify_wait``.
        Each engine's decode time and statistics are recorded under its ``name``.

        ``verifier`` is anything with ``pending``, ``wait() -> seconds`` and ``deliver()``: a
        :class:`~hindsight.rollout.verification.Verifier`, or the episode runner's environment
        replies, whose ``phase`` attribute (default ``"verify"``) names the two phases
        (``env`` / ``env_wait``)."""
        with self._measured():
            self._run(engines, on_result, verifier)

    def _run(self, engines: Sequence[Engine], on_result, verifier) -> None:
        names = [getattr(e, "name", "engine") for e in engines]
        stats_before = [collections.Counter(getattr(e, "stats", {})) for e in engines]
        while not all(e.idle for e in engines) or (verifier is not None and verifier.pending):
            for engine, name in zip(engines, names):
                if engine.idle:
                    continue
                start, host, tokens = time.perf_counter(), sum(self.host.values()), \
                    collections.Counter(self.tokens)
                for tag, res in engine.step():
                    on_result(tag, res)
                self.engine_seconds[name] += time.perf_counter() - start - (
                    sum(self.host.values()) - host)
                made = collections.Counter(self.tokens)
                made.subtract(tokens)
                self.engine_tokens.setdefault(name, collections.Counter()).update(made)
            if verifier is not None and verifier.pending:
                phase = getattr(verifier, "phase", "verify")
                if all(e.idle for e in engines):
                    self.host[f"{phase}_wait"] += verifier.wait()
                start, host = time.perf_counter(), sum(self.host.values())
                verifier.deliver()
                self.host[phase] += time.perf_counter() - start - (
                    sum(self.host.values()) - host)
        for engine, name, old in zip(engines, names, stats_before):
            new = collections.Counter(getattr(engine, "stats", {}))
            new.subtract(old)
            total = self.engines.setdefault(name, collections.Counter())
            total.update(new)

    def occupancy(self) -> dict[str, float]:
        """Per engine, the fraction of its slot-steps (decode steps x the slot batch's width at the
        time, see ``Engine(min_slots=...)``) that decoded a token of an active row: a decode step
        costs about the same however many of its slots are active."""
        return {name: round(c["row_steps"] / c["slot_steps"], 4)
                for name, c in self.engines.items() if c["slot_steps"]}

    def seconds(self) -> dict[str, float]:
        """Seconds by phase (host phases timed; each engine's decode time split over the phases
        whose tokens it generated, ``decode`` if it recorded none), plus ``total``."""
        out = collections.Counter({k: float(v) for k, v in self.host.items()})
        for name, secs in self.engine_seconds.items():
            made = {k: n for k, n in self.engine_tokens.get(name, {}).items() if n > 0}
            if not made:
                out["decode"] += secs
                continue
            for k, n in made.items():
                out[k] += secs * n / sum(made.values())
        out["total"] = float(sum(self.host.values()) + sum(self.engine_seconds.values()))
        return dict(out)


def longest(prompts: Sequence) -> int:
    return max(len(p) for p in prompts)
