"""hindsight: token-level credit assignment for LLM post-training in JAX.

Layers (arrows are the only import direction)::

    ops -> signals -> objectives -> methods -> train -> experiments / configs
    models -> sampling -> rollout ---^
"""
from hindsight import objectives, ops, signals, tasks

__version__ = "0.1.0"
__all__ = ["objectives", "ops", "signals", "tasks"]
