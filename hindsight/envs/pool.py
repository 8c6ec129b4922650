"""Environments in worker processes, stepped asynchronously while the engine decodes.

Each worker process holds one environment instance and serves one episode at a time (an episode
*leases* a worker from its ``reset`` to its ``release``; the instance is reused by the next
episode, so a ScienceWorld JVM is started once per worker, not once per episode). Requests are
non-blocking: :meth:`EnvPool.reset` / :meth:`EnvPool.step` / :meth:`EnvPool.replay` send and
return, :meth:`EnvPool.poll` collects the replies that have arrived. Episodes beyond the number of
workers wait in a queue for a free one.

Containment: a worker runs in its own session (process group), so killing it kills what the
environment started (a JVM); it dies with the parent (``PR_SET_PDEATHSIG``); optional address-space
and CPU-time limits. A request that outlives its timeout kills its worker (status ``"timeout"``), a
worker that dies answers ``"crashed"``, an exception in the environment answers ``"error"`` (the
worker survives); each ends that episode only: a fresh worker replaces a dead one, and the run goes
on.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import multiprocessing.connection
import os
import signal
import socket
import subprocess
import sys
import time

from hindsight.envs.base import EnvSpec, Step

STATUSES = ("ok", "error", "timeout", "crashed")


@dataclasses.dataclass(frozen=True)
class Reply:
    """The answer to one request.

    Attributes:
      episode: the caller's episode id. op: ``"reset"``, ``"step"`` or ``"replay"``.
      status: ``"ok"``; ``"error"`` (the environment raised: ``message`` holds the exception),
        ``"timeout"`` (the request ran past its timeout; the worker was killed) or ``"crashed"``
        (the worker died). Any status but ``"ok"`` ends the episode, whose lease is released.
      step: the environment's :class:`Step` (``"reset"``: its observation only; ``"replay"``: the
        last step of the prefix, or the reset's observation for an empty prefix), None unless ok.
      seconds: wall-clock from sending the request to its reply.
      message: what went wrong (empty when ok).
    """
    episode: object
    op: str
    status: str
    step: Step | None
    seconds: float
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclasses.dataclass
class _Worker:
    process: subprocess.Popen
    conn: multiprocessing.connection.Connection
    episode: object = None        # the episode holding the lease
    request: tuple | None = None  # (op, sent at, deadline) of the request in flight


class EnvPool:
    """``workers`` processes each holding one environment of ``spec``.

    Args:
      spec: the environment (:class:`hindsight.envs.base.EnvSpec`).
      workers: processes (episodes stepped at once); more episodes queue for a free worker.
      step_timeout: seconds a ``step`` may take before its worker is killed.
      reset_timeout: seconds a ``reset`` or ``replay`` may take (a worker's first request also
        creates its environment: a ScienceWorld JVM takes about 1.3 s).
      address_space: optional ``RLIMIT_AS`` bytes per worker (not for JVM environments, which
        reserve large virtual ranges).
      cpu_seconds: optional ``RLIMIT_CPU`` per worker over its lifetime.

    Use as a context manager (``close`` kills every worker and what it started).
    """

    def __init__(self, spec: EnvSpec, *, workers: int, step_timeout: float, reset_timeout: float,
                 address_space: int | None = None, cpu_seconds: int | None = None):
        if not isinstance(spec, EnvSpec):
            raise TypeError(f"`spec` must be an EnvSpec, got {type(spec).__name__}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"`workers` must be a positive int, got {workers!r}")
        for name, value in (("step_timeout", step_timeout), ("reset_timeout", reset_timeout)):
            if not value > 0:
                raise ValueError(f"`{name}` must be > 0 seconds, got {value!r}")
        self.spec, self.num_workers = spec, workers
        self.step_timeout, self.reset_timeout = float(step_timeout), float(reset_timeout)
        self._limits = (address_space, cpu_seconds)
        self._workers: list[_Worker] = []
        self._lease: dict[object, _Worker] = {}
        self._waiting: collections.deque = collections.deque()  # (episode, op, payload)
        self._done: list[Reply] = []
        self.stats = collections.Counter()  # workers (started), requests, errors, timeouts, crashes
        self.busy_seconds = 0.0  # summed request wall-clock (overlaps decoding)

    # ------------------------------------------------------------------ requests
    def reset(self, episode, setup: dict) -> None:
        """Start ``episode`` (leasing a worker, or queueing for one) from ``setup``."""
        self._begin(episode, "reset", setup)

    def replay(self, episode, setup: dict, actions) -> None:
        """Start ``episode`` at the state after ``actions`` from ``setup`` (a branch of an episode
        at a turn boundary): reset, then every action in order, in the worker."""
        self._begin(episode, "replay", (setup, list(actions)))

    def step(self, episode, action: str) -> None:
        """Send one action of a started episode (its previous request answered)."""
        worker = self._lease.get(episode)
        if worker is None:
            raise KeyError(f"episode {episode!r} holds no environment (never reset, released, or "
                           f"ended by a failure)")
        if worker.request is not None:
            raise RuntimeError(f"episode {episode!r} has a request in flight")
        self._send(worker, "step", action, self.step_timeout)

    def release(self, episode) -> None:
        """End ``episode``'s lease; its worker serves the next queued episode."""
        worker = self._lease.pop(episode, None)
        if worker is None:
            return
        if worker.request is not None:  # an answer nobody wants: the worker's state is unknown
            self._kill(worker)
            self._workers.remove(worker)
        worker.episode = None
        self._dispatch()

    @property
    def pending(self) -> int:
        """Requests sent or queued and not yet answered through :meth:`poll`."""
        return (sum(w.request is not None for w in self._workers) + len(self._waiting)
                + len(self._done))

    def poll(self, timeout: float | None = 0.0) -> list[Reply]:
        """Replies that arrived, waiting up to ``timeout`` seconds for the first (None: until one
        does, or a deadline passes). Kills and replaces workers past their deadline."""
        busy = [w for w in self._workers if w.request is not None]
        if busy and not self._done:
            now = time.perf_counter()
            soonest = min(w.request[2] for w in busy) - now
            wait = max(0.0, soonest) if timeout is None else max(0.0, min(timeout, soonest))
            ready = multiprocessing.connection.wait([w.conn for w in busy], wait)
            for w in busy:
                if w.conn in ready:
                    self._receive(w)
        now = time.perf_counter()
        for w in list(self._workers):
            if w.request is not None and now > w.request[2]:
                self._fail(w, "timeout", f"{w.request[0]} ran past its {w.request[2] - w.request[1]:.1f} s "
                                         f"timeout; the worker was killed")
        self._dispatch()
        out, self._done = self._done, []
        return out

    def close(self) -> None:
        for w in self._workers:
            try:
                w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        deadline = time.perf_counter() + 5.0
        for w in self._workers:
            try:
                w.process.wait(max(0.0, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                pass
            self._kill(w)
        self._workers, self._lease = [], {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ internals
    def _begin(self, episode, op, payload) -> None:
        if episode in self._lease or any(e == episode for e, _, _ in self._waiting):
            raise KeyError(f"episode {episode!r} is already running")
        self._waiting.append((episode, op, payload))
        self._dispatch()

    def _dispatch(self) -> None:
        while self._waiting:
            worker = next((w for w in self._workers if w.episode is None), None)
            if worker is None:
                if len(self._workers) >= self.num_workers:
                    return
                worker = self._spawn()
            episode, op, payload = self._waiting.popleft()
            worker.episode = episode
            self._lease[episode] = worker
            self._send(worker, op, payload, self.reset_timeout)

    def _spawn(self) -> _Worker:
        # a fresh interpreter running hindsight.envs.worker (not multiprocessing's fork, unsafe in
        # a process running JAX's threads, nor its spawn, which re-imports the caller's main
        # script), in its own session, talking over a socket pair
        parent, child = socket.socketpair()
        address_space, cpu_seconds = self._limits
        setup = json.dumps({"name": self.spec.name, "options": dict(self.spec.options),
                            "module": self.spec.module,
                            "address_space": address_space, "cpu_seconds": cpu_seconds})
        process = subprocess.Popen(
            [sys.executable, "-m", "hindsight.envs.worker", str(child.fileno()), setup],
            pass_fds=(child.fileno(),), start_new_session=True, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, cwd=os.getcwd())
        child.close()
        worker = _Worker(process=process, conn=multiprocessing.connection.Connection(parent.detach()))
        self._workers.append(worker)
        self.stats["workers"] += 1
        return worker

    def _send(self, worker: _Worker, op: str, payload, timeout: float) -> None:
        now = time.perf_counter()
        worker.request = (op, now, now + timeout)
        self.stats["requests"] += 1
        try:
            worker.conn.send((op, payload))
        except (OSError, BrokenPipeError):
            self._fail(worker, "crashed", "the environment worker had died before the request")

    def _receive(self, worker: _Worker) -> None:
        op, sent, _ = worker.request
        try:
            status, step, message = worker.conn.recv()
        except (EOFError, OSError):
            try:
                code = worker.process.wait(1.0)
            except subprocess.TimeoutExpired:
                code = None
            self._fail(worker, "crashed", f"the environment worker died during {op} "
                                          f"(exit code {code})")
            return
        seconds = time.perf_counter() - sent
        self.busy_seconds += seconds
        worker.request = None
        episode = worker.episode
        if status != "ok":
            self.stats["errors"] += 1
            self._lease.pop(episode, None)
            worker.episode = None
        self._done.append(Reply(episode, op, status, step, seconds, message))

    def _fail(self, worker: _Worker, status: str, message: str) -> None:
        """End the worker's episode with ``status`` and replace the worker."""
        op, sent, _ = worker.request or ("?", time.perf_counter(), 0.0)
        self.stats["timeouts" if status == "timeout" else "crashes"] += 1
        self._kill(worker)
        self._workers.remove(worker)
        if worker.episode is not None:
            self._lease.pop(worker.episode, None)
            self._done.append(Reply(worker.episode, op, status, None,
                                    time.perf_counter() - sent, message))

    @staticmethod
    def _kill(worker: _Worker) -> None:
        worker.request = None
        if worker.process.poll() is None:
            try:
                os.killpg(worker.process.pid, signal.SIGKILL)  # the worker's session: a JVM too
            except (ProcessLookupError, PermissionError):
                worker.process.kill()
            worker.process.wait(5.0)
        else:  # the worker is gone; what it started may not be
            try:
                os.killpg(worker.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        worker.conn.close()
