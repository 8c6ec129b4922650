"""An environment worker process: ``python -m hindsight.envs.worker FD SETUP``, started by
:class:`hindsight.envs.pool.EnvPool` in its own session. It applies its limits, builds the
environment ``SETUP`` names (JSON: ``name``, ``options``, ``module``, ``address_space``,
``cpu_seconds``) and
answers ``(op, payload)`` requests on the socket ``FD`` in order with ``(status, Step | None,
message)``, until the socket closes or a ``None`` request arrives.
"""
from __future__ import annotations

import json
import multiprocessing.connection
import resource
import signal
import sys
import traceback


def _die_with_parent() -> None:
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the pool's close() still kills the worker
        pass


def serve(conn, setup: dict) -> None:
    from hindsight.envs.base import EnvSpec, Step

    _die_with_parent()
    for limit, value in ((resource.RLIMIT_AS, setup.get("address_space")),
                         (resource.RLIMIT_CPU, setup.get("cpu_seconds"))):
        if value:
            resource.setrlimit(limit, (int(value), int(value)))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    spec = EnvSpec.of(setup["name"], module=setup.get("module"), **setup["options"])
    env = None
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg is None:
            break
        op, payload = msg
        try:
            if env is None:
                env = spec.make()
            if op == "reset":
                out = Step(env.reset(payload))
            elif op == "step":
                out = env.step(payload)
            elif op == "replay":
                setup_, actions = payload
                out = Step(env.reset(setup_))
                for action in actions:
                    out = env.step(action)
            else:
                raise ValueError(f"unknown request {op!r}")
            reply = ("ok", out, "")
        except Exception as exc:  # the environment's failure is the episode's, not the worker's
            reply = ("error", None, "".join(traceback.format_exception_only(exc)).strip() + "\n"
                     + "".join(traceback.format_tb(exc.__traceback__)[-3:]))
        conn.send(reply)
    if env is not None:
        try:
            env.close()
        except Exception:
            pass


if __name__ == "__main__":
    serve(multiprocessing.connection.Connection(int(sys.argv[1])), json.loads(sys.argv[2]))
