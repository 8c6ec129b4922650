"""The experiment schema: bad configuration fails at resolution, before anything is written,
traced or compiled, with a message naming the key; derived keys follow the command line."""
import re

import jax
import pytest
from absl import flags
from flax import nnx
from ml_collections import config_flags

import hindsight.train as ht
from hindsight.train.experiment import ConfigError, resolve


def _config(method: str, *overrides: str):
    """``configs/<method>.py:tiny`` with ``--config.<key>=<value>`` overrides, parsed by the same
    ml_collections flag the launcher defines."""
    argv = ["prog", f"--config=configs/{method}.py:tiny", *overrides]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True,
                                    sys_argv=argv)
    values(argv)
    return values.config


def test_mesh_that_does_not_divide_the_devices():
    with pytest.raises(ConfigError, match=re.escape("needs 6 devices but 8 are available; "
                                                    "change mesh.data")):
        resolve(_config("grpo", "--config.train.mesh.data=3", "--config.train.mesh.fsdp=2"),
                num_devices=8, process_count=1)
    with pytest.raises(ValueError, match=r"mesh.data=-1 cannot fill 8 devices"):
        ht.MeshConfig(data=-1, tensor=3).resolve(8)
    with pytest.raises(ValueError, match=r"mesh.tensor must be a positive int or -1"):
        ht.MeshConfig(tensor=0)
    with pytest.raises(ValueError, match=r"at most one mesh axis may be -1"):
        ht.MeshConfig(data=-1, fsdp=-1)
    # On this process's real devices (1 CPU device unless forced) a 2-way mesh cannot be built.
    with pytest.raises(ValueError, match=r"mesh.tensor"):
        ht.make_mesh(ht.MeshConfig(data=1, tensor=jax.device_count() + 1))


def test_mesh_resolves_minus_one():
    assert ht.MeshConfig(data=-1, fsdp=2, tensor=2).resolve(8) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert ht.MeshConfig(data=2, fsdp=-1).resolve(8) == {"data": 2, "fsdp": 4, "tensor": 1}


def test_rows_the_mesh_and_the_minibatches_cannot_split():
    # grpo:tiny: 2 prompts x 4 rows = 8 rows per rollout.
    with pytest.raises(ConfigError, match=r"train.num_microbatches \* data \* fsdp = 16"):
        resolve(_config("grpo", "--config.train.num_microbatches=4"), num_devices=4,
                process_count=1)
    with pytest.raises(ConfigError, match=r"mini-batches of whole groups.*group_size=4, "
                                          r"train.ppo_minibatches=4"):
        resolve(_config("grpo", "--config.train.ppo_minibatches=4"), num_devices=1,
                process_count=1)
    with pytest.raises(ConfigError, match=r"on every process.*2 process"):
        resolve(_config("grpo", "--config.train.ppo_minibatches=2"), num_devices=2,
                process_count=2)
    # CRAFT couples the rows of a group: a micro-batch of 2 rows cannot hold a group of 4.
    with pytest.raises(ConfigError, match=r"couples the rows of a group.*group_size=4.*"
                                          r"train.num_microbatches=4.*mesh \(data=1"):
        resolve(_config("craft", "--config.train.num_microbatches=4"), num_devices=1,
                process_count=1)
    # GRPO does not couple rows: its micro-batches may split groups.
    resolve(_config("grpo", "--config.train.num_microbatches=4"), num_devices=1, process_count=1)


def test_unknown_optimizer_and_bad_schedule():
    with pytest.raises(ValueError, match=r"optim.name must be one of \['adamw', 'adam', 'sgd'\], got 'lion'"):
        ht.OptimConfig(name="lion")
    with pytest.raises(ValueError, match=r"optim.schedule must be one of"):
        ht.OptimConfig(schedule="exp")
    with pytest.raises(ValueError, match=r"optim.total_steps must be > optim.warmup_steps=10"):
        ht.OptimConfig(schedule="cosine", warmup_steps=10, total_steps=10)
    with pytest.raises(ValueError, match=r"optim.learning_rate"):
        ht.OptimConfig(learning_rate=0.0)
    # The schedule counts optimizer updates: 3 rollouts x 2 epochs x 2 mini-batches = 12.
    with pytest.raises(ConfigError, match=r"total_steps=10 counts optimizer updates.*= 12"):
        resolve(_config("grpo", "--config.train.optim.schedule=linear",
                        "--config.train.optim.total_steps=10", "--config.train.ppo_epochs=2",
                        "--config.train.ppo_minibatches=2"), num_devices=1, process_count=1)


def test_unknown_keys_and_values_name_the_key():
    with pytest.raises(ConfigError, match=r"train.lm_head. must be one of"):
        resolve(_config("grpo", "--config.train.lm_head=sparse"))
    with pytest.raises(ConfigError, match=r"train.ppo_epochs must be a positive int, got 0"):
        resolve(_config("grpo", "--config.train.ppo_epochs=0"))
    with pytest.raises(ConfigError, match=r"train.pack_row_multiple=2 needs train.packing=True"):
        resolve(_config("grpo", "--config.train.packing=false",
                        "--config.train.pack_row_multiple=2"))


# Each derived key: (method, override, resolved key, expected value).
DERIVED = [
    ("dapo", "--config.rollout.max_new_tokens=40", "max_response_length", 40),
    ("dapo", "--config.rollout.max_new_tokens=40", "overlong_buffer", 8),
    ("drgrpo", "--config.rollout.max_new_tokens=40", "max_response_length", 40),
    ("craft", "--config.rollout.group_size=8", "group_size", 8),
    ("grpo", "--config.rollout.temperature=0.7", "temperature", 0.7),
    ("opsd", "--config.rollout.temperature=0.9", "temperature", 0.9),
]


@pytest.mark.parametrize("method, override, key, value", DERIVED)
def test_derived_keys_follow_the_command_line(method, override, key, value):
    xp = resolve(_config(method, override), num_devices=1, process_count=1)
    assert xp.config.to_dict()["method_config"][key] == value  # what config.json holds
    assert getattr(xp.method.config, key) == value


def test_an_explicit_derived_key_wins_and_conflicts_are_refused():
    xp = resolve(_config("dapo", "--config.method_config.overlong_buffer=3"), num_devices=1,
                 process_count=1)
    assert xp.method.config.overlong_buffer == 3 and xp.method.config.max_response_length == 24
    with pytest.raises(ConfigError, match=r"method_config.group_size=2 differs from "
                                          r"rollout.group_size=4"):
        resolve(_config("craft", "--config.method_config.group_size=2"))
    with pytest.raises(ConfigError, match=r"temperature=0.5 differs from rollout.temperature"):
        resolve(_config("grpo", "--config.method_config.temperature=0.5"))


def test_train_step_checks_before_compiling(monkeypatch):
    """The step rejects a batch size the mesh cannot split, and a batch of the wrong size,
    without compiling (compilation is made to fail loudly here)."""
    mesh = ht.make_mesh(ht.MeshConfig())
    tx = ht.make_optimizer(ht.OptimConfig(name="sgd"))
    state, sh, md = ht.create_train_state(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), tx, mesh=mesh)
    monkeypatch.setattr(jax.stages.Lowered, "compile",
                        lambda *a, **k: pytest.fail("compiled a bad configuration"))
    with pytest.raises(ValueError, match=r"step.reference must be one of"):
        ht.StepConfig(batch_size=2, reference="teacher")
    with pytest.raises(ValueError, match=r"must split evenly into train.num_microbatches"):
        ht.make_train_step(lambda m, b: None, model_def=md, optimizer=tx, mesh=mesh, shardings=sh,
                           config=ht.StepConfig(batch_size=6, num_microbatches=4))
    step = ht.make_train_step(lambda m, b: None, model_def=md, optimizer=tx, mesh=mesh,
                              shardings=sh, config=ht.StepConfig(batch_size=4, num_microbatches=2))
    with pytest.raises(ValueError,
                       match=r"batch leaf \['x'\] has shape \(3, 2\); expected this process's 4"):
        step(state, {"x": jax.numpy.zeros((3, 2))})


def test_a_key_the_saved_config_lacks_differs_only_off_its_default():
    """A run written before a key existed resumes while the key keeps its default."""
    from hindsight.train.experiment import config_differences
    current = resolve(_config("grpo")).config.to_dict()
    saved = {k: v for k, v in current.items() if k != "distributed"}   # an older run's file
    assert config_differences(saved, current) == []
    current["distributed"]["initialization_timeout"] = 60   # resumable: a new launch's setting
    current["seed"] = 7
    assert config_differences(saved, current) == ["seed"]
