"""A name -> factory registry (tasks, environments): registered by a class decorator, built by
name with keyword options, unknown names answered with the list of known ones. Plain Python, so
the environment workers can import it without JAX."""
from __future__ import annotations

from typing import Callable


class Registry:
    """Factories of one ``kind`` (``"task"``, ``"environment"``) by name."""

    def __init__(self, kind: str):
        self.kind, self._factories = kind, {}

    def register(self, name: str):
        """Class decorator adding a factory under ``name``; a name registers once."""
        def deco(factory: Callable):
            if name in self._factories:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._factories[name] = factory
            return factory
        return deco

    def make(self, name: str, **options):
        """Build ``name`` with ``options``; an unknown name lists what is available."""
        return self.get(name)(**options)

    def get(self, name: str) -> Callable:
        """The factory registered as ``name``; an unknown name lists what is available."""
        if name not in self._factories:
            raise ValueError(f"unknown {self.kind} {name!r}; available: {self.names()}")
        return self._factories[name]

    def names(self) -> list[str]:
        return sorted(self._factories)
