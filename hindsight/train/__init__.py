"""Training engine: mesh + sharding, train state, the jitted train step with exact gradient
accumulation over named loss terms, optax chains, orbax checkpoint/resume, grain prompt data,
metrics, the experiment schema and the RL loop.

Typical use (what :func:`hindsight.train.loop.run` does for an experiment config)::

    mesh = make_mesh(MeshConfig(data=-1))
    tx = make_optimizer(OptimConfig(name="adamw", learning_rate=1e-6))
    state, shardings, model_def = create_train_state(model, tx, mesh=mesh, rules=model_rules(mesh))
    step = make_train_step(method.loss_fn, model_def=model_def, optimizer=tx, mesh=mesh,
                           shardings=shardings, loss_kwargs={"config": method.config},
                           config=StepConfig(batch_size=32, num_microbatches=4))
    state, metrics = step(state, local_rows)        # this process's rows of the step's batch
"""
from hindsight.train.checkpoint import CheckpointConfig, Checkpointer
from hindsight.train.data import (DataConfig, make_data_iterator, prompt_batches, prompt_dataset,
                                 read_jsonl)
from hindsight.train.mesh import (AXES, BATCH_AXES, DistributedConfig, MeshConfig,
                                  initialize_distributed, make_mesh, model_rules, param_shardings)
from hindsight.train.metrics import MetricsConfig, MetricsLogger, StepTimer, format_summary
from hindsight.train.optim import OPTIMIZERS, SCHEDULES, OptimConfig, make_optimizer, make_schedule
from hindsight.train.state import (ModelDef, TrainState, abstract_train_state, create_train_state,
                                   split_model, state_shardings)
from hindsight.train.step import (StepConfig, TrainStep, check_layout, make_train_step,
                                  shard_batch)

__all__ = [
    "AXES", "BATCH_AXES", "CheckpointConfig", "Checkpointer", "DataConfig", "DistributedConfig",
    "MeshConfig", "MetricsConfig", "MetricsLogger", "ModelDef", "OPTIMIZERS", "OptimConfig",
    "SCHEDULES", "StepConfig", "StepTimer", "TrainState", "TrainStep", "abstract_train_state",
    "check_layout", "create_train_state", "format_summary", "initialize_distributed",
    "make_data_iterator", "make_mesh", "make_optimizer", "make_schedule", "make_train_step",
    "model_rules", "param_shardings", "prompt_batches", "prompt_dataset", "read_jsonl", "shard_batch", "split_model",
    "state_shardings",
]
