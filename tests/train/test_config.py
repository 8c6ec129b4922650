"""Bad configuration fails at construction / validation, before anything is traced or compiled,
with a message naming the field."""
import re

import jax
import pytest
from flax import nnx

import hindsight.train as ht


def test_mesh_that_does_not_divide_the_devices():
    cfg = ht.TrainConfig(step=ht.StepConfig(batch_size=8), mesh=ht.MeshConfig(data=3, fsdp=2))
    with pytest.raises(ValueError, match=re.escape("needs 6 devices but 8 are available; change mesh.data")):
        ht.validate(cfg, num_devices=8, process_count=1)
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


def test_batch_not_divisible_by_the_data_axis():
    cfg = ht.TrainConfig(step=ht.StepConfig(batch_size=6), mesh=ht.MeshConfig(data=4, fsdp=1))
    with pytest.raises(ValueError, match=r"step.batch_size=6 must be divisible by mesh.data\*mesh.fsdp"):
        ht.validate(cfg, num_devices=4, process_count=1)
    cfg = ht.TrainConfig(step=ht.StepConfig(batch_size=8, num_microbatches=4),
                         mesh=ht.MeshConfig(data=-1, fsdp=2))
    with pytest.raises(ValueError, match=r"= 2\*2\*4 = 16"):
        ht.validate(cfg, num_devices=4, process_count=1)
    with pytest.raises(ValueError, match=r"step.batch_size=6 is not divisible by step.num_microbatches=4"):
        ht.StepConfig(batch_size=6, num_microbatches=4)
    with pytest.raises(ValueError, match=r"data.batch_size=3 is not divisible by the process count 2"):
        ht.validate(ht.TrainConfig(step=ht.StepConfig(batch_size=4), data=ht.DataConfig(batch_size=3)),
                    num_devices=2, process_count=2)


def test_unknown_optimizer_and_bad_schedule():
    with pytest.raises(ValueError, match=r"optim.name must be one of \['adamw', 'adam', 'sgd'\], got 'lion'"):
        ht.OptimConfig(name="lion")
    with pytest.raises(ValueError, match=r"optim.schedule must be one of"):
        ht.OptimConfig(schedule="exp")
    with pytest.raises(ValueError, match=r"optim.total_steps must be > optim.warmup_steps=10"):
        ht.OptimConfig(schedule="cosine", warmup_steps=10, total_steps=10)
    with pytest.raises(ValueError, match=r"optim.learning_rate"):
        ht.OptimConfig(learning_rate=0.0)
    with pytest.raises(ValueError, match=r"optim.total_steps=5 is shorter than num_steps=9"):
        ht.validate(ht.TrainConfig(step=ht.StepConfig(batch_size=1), num_steps=9,
                                   optim=ht.OptimConfig(schedule="linear", total_steps=5)),
                    num_devices=1, process_count=1)


def test_from_dict_names_unknown_fields():
    cfg = ht.TrainConfig.from_dict({"step": {"batch_size": 4}, "optim": {"name": "sgd"},
                                    "num_steps": 3})
    assert cfg.optim.name == "sgd" and cfg.step.batch_size == 4 and cfg.num_steps == 3
    with pytest.raises(ValueError, match=r"optim.lr"):
        ht.TrainConfig.from_dict({"step": {"batch_size": 4}, "optim": {"lr": 1.0}})
    with pytest.raises(ValueError, match=r"optim.name must be one of"):
        ht.TrainConfig.from_dict({"step": {"batch_size": 4}, "optim": {"name": "lion"}})


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
    step = ht.make_train_step(lambda m, b: (0.0, 1.0, {}), model_def=md, optimizer=tx, mesh=mesh,
                              shardings=sh, config=ht.StepConfig(batch_size=4, num_microbatches=2))
    with pytest.raises(ValueError,
                       match=r"batch leaf \['x'\] has shape \(3, 2\); expected step.batch_size=4"):
        step(state, {"x": jax.numpy.zeros((3, 2))})
