"""Verification off the decode path: responses are checked in worker threads while the engines
keep decoding.

A rollout shape hands each finished request's rows to :meth:`Verifier.submit` with a callback;
:meth:`hindsight.rollout.runtime.PhaseClock.run` steps the engines and, between steps, runs the
callbacks of the checks that have finished (in the main thread, so a callback may submit more
engine work, e.g. HDL's reflections). Only when every engine is idle and checks are still out does
the main thread wait for them: that wait is the ``verify_wait`` phase, the time decoding waited
for verification. The checking itself (worker seconds, overlapping decode) is reported as
``verify_worker_s``.

Threads, not processes: the checkers that are slow run their work outside the interpreter lock
(code runs in sandbox processes, :mod:`hindsight.tasks.sandbox`; the engine's decode steps run in
XLA), and a thread needs no pickling of tasks or examples. math-verify's signal-based timeouts do
not work in threads, so :mod:`hindsight.tasks.math` turns them off and bounds its inputs instead.

Callbacks run in submission order (a finished check waits for the ones submitted before it), so
the engine's work is submitted in the same order whatever the workers' timing. Which engine step
a callback runs after can vary; a request's samples do not depend on it (per-request keys, and a
row's decode does not read the other slots), which ``tests/rollout/test_verification.py`` checks
against ``workers=0`` (checks run inline, at submission).
"""
from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from hindsight.tasks import Example, Verdict, reward_range


@dataclasses.dataclass(frozen=True)
class Checked:
    """The verdicts on one request's rows.

    Attributes:
      rewards: ``[n]`` float32.
      feedback: ``n`` one-line feedback strings.
      texts: ``n`` decoded responses.
      errors: verifier calls that raised (each such row: reward 0, the exception as feedback).
      seconds: worker seconds spent checking.
    """
    rewards: np.ndarray
    feedback: list[str]
    texts: list[str]
    errors: int
    seconds: float


def safe_verify(task, example: Example, text: str) -> tuple[Verdict, bool]:
    """``task.verify(example, text)``, or, when the verifier raises (a degenerate response, a bug
    in the checker), reward 0 with the exception's first line as feedback: one response never ends
    a run. Returns ``(verdict, failed)``."""
    try:
        return task.verify(example, text), False
    except Exception as e:  # noqa: BLE001 - any verifier failure is that row's failure
        line = (str(e).strip().splitlines() or [""])[0][:200]
        return Verdict(0.0, f"verifier error: {type(e).__name__}: {line}"), True


def check_texts(task, example: Example, texts: Sequence[str]) -> Checked:
    """Verify ``texts`` (answers to ``example``) one by one with :func:`safe_verify`.

    Raises:
      ValueError when a reward is outside the task's ``reward_range`` (default [0, 1]).
    """
    start = time.perf_counter()
    checked = [safe_verify(task, example, t) for t in texts]
    rewards = np.array([v.reward for v, _ in checked], np.float32)
    low, high = reward_range(task)
    bad = np.nonzero(~((rewards >= low) & (rewards <= high)))[0]
    if bad.size:
        raise ValueError(f"task {getattr(task, 'name', task)!r} returned reward {rewards[bad[0]]} "
                         f"outside its reward_range [{low}, {high}]")
    return Checked(rewards=rewards, feedback=[v.feedback for v, _ in checked], texts=list(texts),
                   errors=sum(failed for _, failed in checked),
                   seconds=time.perf_counter() - start)


def decode(tokenizer, tokens: np.ndarray, length: int) -> str:
    """Text of ``tokens[:length]`` without special tokens."""
    return tokenizer.decode([int(t) for t in tokens[:length]], skip_special_tokens=True)


def decode_rows(tokenizer, tokens: np.ndarray, lengths: np.ndarray) -> list[str]:
    """Text of each row ``tokens[i, :lengths[i]]``."""
    return [decode(tokenizer, tokens[i], int(lengths[i])) for i in range(len(lengths))]


class Verifier:
    """Checks requests' rows in ``workers`` threads (0: inline, at submission) and hands each
    :class:`Checked` to its callback from :meth:`deliver`, in submission order.

    Totals over its life: ``errors`` (verifier calls that raised), ``worker_seconds``.
    """

    def __init__(self, task, tokenizer, *, workers: int):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise ValueError(f"`workers` must be a non-negative int, got {workers!r}")
        self.task, self.tokenizer, self.workers = task, tokenizer, workers
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="verify") if workers else None
        self._queue: collections.deque[tuple[Future, Callable[[Checked], None]]] = \
            collections.deque()
        self.errors = 0
        self.worker_seconds = 0.0

    def submit(self, example: Example, tokens: np.ndarray, lengths: np.ndarray,
               then: Callable[[Checked], None]) -> None:
        """Check rows ``tokens [n, T]`` (``lengths [n]``) as answers to ``example``; ``then(checked)``
        runs in the caller's thread from :meth:`deliver`. Decoding to text happens here (the
        tokenizer is not shared with the workers)."""
        texts = decode_rows(self.tokenizer, tokens, lengths)
        future: Future = Future()
        if self._pool is None:
            try:
                future.set_result(check_texts(self.task, example, texts))
            except Exception as e:  # noqa: BLE001 - re-raised from deliver(), like a worker's
                future.set_exception(e)
        else:
            future = self._pool.submit(check_texts, self.task, example, texts)
        self._queue.append((future, then))

    @property
    def pending(self) -> int:
        """Submitted checks whose callback has not run yet."""
        return len(self._queue)

    def wait(self) -> float:
        """Block until the oldest pending check has finished; returns the seconds waited."""
        if not self._queue or self._queue[0][0].done():
            return 0.0
        start = time.perf_counter()
        futures.wait([self._queue[0][0]])
        return time.perf_counter() - start

    def deliver(self) -> int:
        """Run the callbacks of the finished checks at the head of the queue; returns how many
        ran. A check that raised (e.g. a reward outside the task's range) raises here."""
        ran = 0
        while self._queue and self._queue[0][0].done():
            future, then = self._queue.popleft()
            checked = future.result()
            self.errors += checked.errors
            self.worker_seconds += checked.seconds
            then(checked)
            ran += 1
        return ran

    def close(self) -> None:
        """Stop the workers (pending checks are abandoned)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
