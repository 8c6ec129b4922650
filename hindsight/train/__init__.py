"""Training engine: mesh + sharding, train state, the jitted train step with exact gradient
accumulation, optax chains, orbax checkpoint/resume, grain prompt data and metrics.

Typical use::

    cfg = TrainConfig(step=StepConfig(batch_size=32, num_microbatches=4), mesh=MeshConfig(data=-1))
    validate(cfg)                                    # fails fast, naming the field
    mesh = make_mesh(cfg.mesh)
    tx = make_optimizer(cfg.optim)
    state, shardings, model_def = create_train_state(model, tx, mesh=mesh, rules=model_rules(mesh))
    step = make_train_step(loss_fn, model_def=model_def, optimizer=tx, mesh=mesh,
                           shardings=shardings, config=cfg.step)
    state, metrics = step(state, shard_batch(local_batch, mesh))
"""
from hindsight.train.checkpoint import CheckpointConfig, Checkpointer
from hindsight.train.config import TrainConfig, validate
from hindsight.train.data import DataConfig, make_data_iterator, prompt_dataset, read_jsonl
from hindsight.train.mesh import (AXES, BATCH_AXES, DistributedConfig, MeshConfig, batch_sharding,
                                  data_parallel_size, initialize_distributed, make_mesh,
                                  model_rules, param_shardings, shard_batch)
from hindsight.train.metrics import MetricsConfig, MetricsLogger, StepTimer, format_summary
from hindsight.train.optim import OPTIMIZERS, SCHEDULES, OptimConfig, make_optimizer, make_schedule
from hindsight.train.state import (ModelDef, TrainState, abstract_train_state, create_train_state,
                                   split_model, state_shardings)
from hindsight.train.step import StepConfig, TrainStep, make_train_step, split_microbatches

__all__ = [
    "AXES", "BATCH_AXES", "CheckpointConfig", "Checkpointer", "DataConfig", "DistributedConfig",
    "MeshConfig", "MetricsConfig", "MetricsLogger", "ModelDef", "OPTIMIZERS", "OptimConfig",
    "SCHEDULES", "StepConfig", "StepTimer", "TrainConfig", "TrainState", "TrainStep",
    "abstract_train_state", "batch_sharding", "create_train_state", "data_parallel_size",
    "format_summary", "initialize_distributed", "make_data_iterator", "make_mesh",
    "make_optimizer", "make_schedule", "make_train_step", "model_rules", "param_shardings", "prompt_dataset",
    "read_jsonl", "shard_batch", "split_microbatches", "split_model", "state_shardings", "validate",
]
