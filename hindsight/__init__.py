"""hindsight: token-level credit assignment for LLM post-training in JAX.

Layers (arrows are the only import direction)::

    ops -> signals -> objectives -> methods -> train -> experiments / configs
    models -> sampling -> rollout ---^
    tasks (verifiers) -------------------------^

``storage`` (run files through ``etils.epath``: local folders and ``gs://`` alike) is used by
rollout, train and the experiments.

Subpackages are imported on first attribute access (``hs.models``), so ``import hindsight`` stays
cheap and never pulls the model loaders' heavy dependencies into a notebook that only wants signals.
"""
import importlib

__version__ = "0.1.0"
SUBPACKAGES = ("envs", "methods", "models", "objectives", "ops", "rollout", "sampling", "signals",
               "tasks", "testing", "train")
__all__ = list(SUBPACKAGES)


def __getattr__(name: str):
    if name in SUBPACKAGES:
        module = importlib.import_module(f"hindsight.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'hindsight' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(SUBPACKAGES))
