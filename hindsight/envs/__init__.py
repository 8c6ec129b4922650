"""Environments for multi-turn episodes: the protocol (:mod:`~hindsight.envs.base`), the pool of
worker processes that steps them while the engine decodes (:mod:`~hindsight.envs.pool`), and the
environments (``textgame``: a tiny deterministic game for tests). Importing this package is cheap
(no JAX): the workers import it.
"""
from hindsight.envs.base import Env, EnvSpec, Step, env_names, make_env, register_env
from hindsight.envs import scienceworld, search, textgame  # noqa: F401  (register the environments)
from hindsight.envs.pool import STATUSES, EnvPool, Reply

__all__ = ["STATUSES", "Env", "EnvPool", "EnvSpec", "Reply", "Step", "env_names", "make_env",
           "register_env"]
