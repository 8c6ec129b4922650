"""The training configuration: one frozen dataclass per concern, checked together before compiling.

Each sub-config validates its own fields on construction; :func:`validate` checks what depends on
several of them or on the machine (mesh vs device count, batch vs data axis, batch vs processes).
Every error names the offending field (``mesh.data``, ``step.batch_size``, ``optim.name``, ...).
"""
from __future__ import annotations

import dataclasses

import jax

from hindsight.train.checkpoint import CheckpointConfig
from hindsight.train.data import DataConfig
from hindsight.train.mesh import DistributedConfig, MeshConfig
from hindsight.train.metrics import MetricsConfig
from hindsight.train.optim import OptimConfig
from hindsight.train.step import StepConfig


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    step: StepConfig
    mesh: MeshConfig = MeshConfig()
    distributed: DistributedConfig = DistributedConfig()
    optim: OptimConfig = OptimConfig()
    data: DataConfig = DataConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    metrics: MetricsConfig = MetricsConfig()
    num_steps: int = 1

    def __post_init__(self):
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """Build from nested plain dicts (e.g. ``ml_collections.ConfigDict.to_dict()``)."""
        parts = {"step": StepConfig, "mesh": MeshConfig, "distributed": DistributedConfig,
                 "optim": OptimConfig, "data": DataConfig, "checkpoint": CheckpointConfig,
                 "metrics": MetricsConfig}
        unknown = set(d) - set(parts) - {"num_steps"}
        if unknown:
            raise ValueError(f"unknown train config fields {sorted(unknown)}; expected "
                             f"{sorted(parts) + ['num_steps']}")
        kwargs = {}
        for name, value in d.items():
            if name in parts:
                fields = {f.name for f in dataclasses.fields(parts[name])}
                bad = set(value) - fields
                if bad:
                    raise ValueError(f"unknown fields {sorted(f'{name}.{b}' for b in bad)}")
                kwargs[name] = parts[name](**value)
            else:
                kwargs[name] = value
        return cls(**kwargs)


def validate(config: TrainConfig, *, num_devices: int | None = None,
             process_count: int | None = None) -> dict[str, int]:
    """Check the cross-field constraints; returns the resolved mesh axis sizes.

    Runs in microseconds and touches no device buffers, so a bad config fails before anything
    is traced or compiled.
    """
    num_devices = jax.device_count() if num_devices is None else num_devices
    process_count = jax.process_count() if process_count is None else process_count
    sizes = config.mesh.resolve(num_devices)
    config.step.check_shards(sizes["data"], sizes["fsdp"])
    if config.step.batch_size % process_count:
        raise ValueError(f"step.batch_size={config.step.batch_size} is not divisible by the "
                         f"process count {process_count}")
    if config.data.batch_size % process_count:
        raise ValueError(f"data.batch_size={config.data.batch_size} is not divisible by the "
                         f"process count {process_count}")
    if config.optim.schedule != "constant" and config.optim.total_steps < config.num_steps:
        raise ValueError(f"optim.total_steps={config.optim.total_steps} is shorter than "
                         f"num_steps={config.num_steps}")
    return sizes
