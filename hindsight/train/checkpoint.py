"""Checkpoint / resume with orbax ``CheckpointManager``.

One checkpoint step holds three items:
  * ``state``: the whole :class:`~hindsight.train.state.TrainState` (params, optimizer state,
    step, RNG key data, reference params, method state), saved asynchronously where supported;
  * ``data``: each process's grain iterator position (one JSON file per process, grain's handler);
  * ``meta``: a small JSON dict (config, last metrics) written by the primary process.
Restoring takes an abstract state carrying the *target* shardings, so a run can resume on a
different mesh shape: orbax reads every array straight into its new layout.
"""
from __future__ import annotations

import dataclasses
import os

import grain
import orbax.checkpoint as ocp

from hindsight import storage
from hindsight.train.state import TrainState, with_shardings


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """``directory`` (None = no checkpoints); save every ``save_every`` steps; keep the newest
    ``max_to_keep``; ``async_save`` lets training continue while arrays are written."""
    directory: str | os.PathLike | None = None
    save_every: int = 100
    max_to_keep: int = 3
    async_save: bool = True

    def __post_init__(self):
        if self.save_every < 1:
            raise ValueError(f"checkpoint.save_every must be >= 1, got {self.save_every}")
        if self.max_to_keep < 1:
            raise ValueError(f"checkpoint.max_to_keep must be >= 1, got {self.max_to_keep}")


class Checkpointer:
    """Save and restore train state, data iterator and metadata under ``config.directory``.

    All processes of a multi-host run must call :meth:`save` and :meth:`restore` together.
    """

    def __init__(self, config: CheckpointConfig):
        if config.directory is None:
            raise ValueError("checkpoint.directory must be set to create a Checkpointer")
        self.config = config
        options = ocp.CheckpointManagerOptions(
            max_to_keep=config.max_to_keep, save_interval_steps=config.save_every, create=True,
            enable_async_checkpointing=config.async_save)
        self._manager = ocp.CheckpointManager(
            storage.run_path(config.directory), options=options,
            item_handlers={"state": ocp.StandardCheckpointHandler(),
                           "data": grain.checkpoint.CheckpointHandler(),
                           "meta": ocp.JsonCheckpointHandler()})

    @property
    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state: TrainState, *, data_iterator=None, meta: dict | None = None,
             force: bool = False) -> bool:
        """Save if ``step`` is due (every ``save_every``) or ``force``; returns whether it saved.

        The data iterator must be the one whose next batch feeds step ``step`` (i.e. its position
        after the batches of steps ``< step``), so that resume replays the same data order.
        """
        items = {"state": ocp.args.StandardSave(state), "meta": ocp.args.JsonSave(meta or {})}
        if data_iterator is not None:
            items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
        return self._manager.save(step, args=ocp.args.Composite(**items), force=force)

    def restore(self, abstract_state: TrainState, shardings: TrainState, *, step: int | None = None,
                data_iterator=None) -> tuple[TrainState, dict]:
        """Restore ``(state, meta)`` at ``step`` (default: latest) onto ``shardings``.

        ``abstract_state`` gives shapes/dtypes (see
        :func:`hindsight.train.state.abstract_train_state`); ``shardings`` may come from a mesh
        of a different shape than the one that saved. ``data_iterator``, when given, is moved to
        the saved position in place.
        """
        step = self.latest_step if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint under checkpoint.directory="
                                    f"{self.config.directory!r}")
        target = with_shardings(abstract_state, shardings)
        items = {"state": ocp.args.StandardRestore(target), "meta": ocp.args.JsonRestore()}
        if data_iterator is not None:
            items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
        restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        return restored["state"], restored["meta"]

    def wait(self) -> None:
        """Block until pending asynchronous saves are on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

