"""``python -m experiments.export``: a trained run's policy as an HF folder that transformers loads
with our logits, the checkpoint's params and our tokenizer's ids (the tiny random model after two
GRPO steps; SmolLM2's initial params, slow); the argument errors."""
import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import configs.grpo
from experiments.export import ExportError, export_run
from hindsight.models import load_hf_folder
from hindsight.models.loading.export import INDEX_FILE, decoder_params
from hindsight.testing import CharTokenizer, char_model
from hindsight.train.loop import run, trained_policy
from hindsight.train.mesh import path_str
from tests.models.helpers import hf_logits, max_rel_err, ours, padded_batch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LENGTHS, TOTAL = (24, 17, 9), 24
PROBES = ("Question: 12 + 7 = ?\n\nAnswer: \\boxed{19}.", "Très bien — 完成 <think>ok</think>",
          " two  spaces\tand a tab\n")
MESSAGES = [{"role": "user", "content": "Is 'abcd' of even length?"}]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """GRPO's documented tiny config trained two steps, a checkpoint after each."""
    workdir = str(tmp_path_factory.mktemp("export") / "run")
    config = configs.grpo.get_config("tiny")
    config.eval.num_examples = 0
    config.train.update(num_steps=2, save_every=1)
    run(config, workdir, progress=False)
    return workdir


def _checkpoint_params(workdir: str, step: int) -> dict:
    """The params saved at ``step``, read straight from orbax (not through the export's restore)."""
    import orbax.checkpoint as ocp
    tree = ocp.StandardCheckpointer().restore(os.path.join(workdir, "checkpoints", str(step), "state"))
    return {path_str(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree["params"])[0]}


def _hf_model(folder: str, **kwargs):
    """transformers' model of ``folder``, refused if any weight was missing, unexpected or
    misshapen (transformers would initialise it at random and only warn)."""
    from transformers import AutoModelForCausalLM
    model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True, **kwargs)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return model.eval()


def _max_abs(out: np.ndarray, ref: np.ndarray) -> float:
    """max |out - ref| over the real (unpadded) positions."""
    return max(float(np.abs(out[b, :n] - ref[b, :n]).max()) for b, n in enumerate(LENGTHS))


def test_tiny_run_exports_what_transformers_loads(tiny_run, tmp_path):
    import torch
    from transformers import AutoTokenizer

    out = str(tmp_path / "hf")
    summary = export_run(tiny_run, out)
    assert (summary["step"], summary["architecture"], summary["dtype"]) == (2, "LlamaForCausalLM", "float32")
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json"} <= set(os.listdir(out)) == set(summary["files"])
    assert not [n for n in os.listdir(tmp_path) if "partial" in n]

    # the params are the last checkpoint's, which training moved off the initial ones
    saved = _checkpoint_params(tiny_run, 2)
    exported = decoder_params(load_hf_folder(out, scan_layers=False))
    assert exported.keys() == saved.keys() and summary["num_params"] == sum(v.size for v in saved.values())
    for key, value in saved.items():
        np.testing.assert_array_equal(exported[key], value, err_msg=key)
    initial = decoder_params(char_model(0))
    assert any(not np.array_equal(initial[k], saved[k]) for k in saved)

    # transformers' logits are ours on the restored params
    policy, _, step = trained_policy(tiny_run)
    tokens, positions, mask = padded_batch(LENGTHS, TOTAL, policy.config.vocab_size)
    torch.set_num_threads(2)
    hf = _hf_model(out, dtype=torch.float32)
    err = _max_abs(ours(policy, tokens, positions, mask), hf_logits(hf, tokens, positions, mask))
    assert step == 2 and err <= 1e-4, err
    print(f"tiny-random max |logits - transformers| = {err:.2e}")

    # the character tokenizer, as an HF tokenizer: the same ids, chat template included
    tok, char = AutoTokenizer.from_pretrained(out), CharTokenizer()
    for text in PROBES:
        assert tok.encode(text, add_special_tokens=False) == char.encode(text), text
    prompt = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert tok(prompt, add_special_tokens=False)["input_ids"] == char.apply_chat_template(MESSAGES)
    assert (tok.eos_token_id, hf.generation_config.eos_token_id) == (char.eos_token_id,) * 2


def test_a_chosen_step_in_bfloat16_shards(tiny_run, tmp_path):
    import torch

    out = tmp_path / "hf"
    out.mkdir()  # an empty directory is a valid --out
    summary = export_run(tiny_run, str(out), step=1, dtype="bfloat16", max_shard_bytes=20_000)
    assert (summary["step"], summary["dtype"]) == (1, "bfloat16")
    shards = sorted(n for n in os.listdir(out) if n.endswith(".safetensors"))
    assert len(shards) > 1 and INDEX_FILE in summary["files"]
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"

    hf = _hf_model(str(out))  # reads the index; the config's dtype is the default
    assert {p.dtype for p in hf.parameters()} == {torch.bfloat16}
    saved = _checkpoint_params(tiny_run, 1)
    exported = decoder_params(load_hf_folder(str(out), scan_layers=False))
    for key, value in saved.items():
        np.testing.assert_array_equal(exported[key], value.astype(jnp.bfloat16).astype(np.float32),
                                      err_msg=key)


def test_argument_errors_name_the_argument(tiny_run, tmp_path):
    out = str(tmp_path / "out")
    with pytest.raises(ExportError, match="workdir '.*nowhere' is not a directory"):
        export_run(str(tmp_path / "nowhere"), out)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExportError, match="holds no run"):
        export_run(str(tmp_path / "empty"), out)
    fresh = tmp_path / "fresh"  # a run that has not saved a checkpoint yet
    fresh.mkdir()
    shutil.copy(os.path.join(tiny_run, "config.json"), fresh)
    with pytest.raises(ExportError, match="has no checkpoint under checkpoints/"):
        export_run(str(fresh), out)
    with pytest.raises(ExportError, match=r"--step=5: .* saved steps: \[1, 2\]"):
        export_run(tiny_run, out, step=5)
    with pytest.raises(ValueError, match="dtype must be one of"):
        export_run(tiny_run, out, dtype="float16")
    os.makedirs(out)
    (tmp_path / "out" / "keep.txt").write_text("not ours")
    with pytest.raises(ExportError, match="--out='.*out' exists and is not an empty directory"):
        export_run(tiny_run, out)
    assert os.listdir(out) == ["keep.txt"]

    # the command: one line on stderr, exit code 2, before JAX is even imported
    result = subprocess.run([sys.executable, "-m", "experiments.export", str(fresh), f"--out={out}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"export error: workdir {str(fresh)!r} has no checkpoint under checkpoints/ (a run saves "
        f"one every train.save_every steps and when it ends)"]
    result = subprocess.run([sys.executable, "-m", "experiments.export", tiny_run],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "--out" in result.stderr


@pytest.mark.slow
def test_smollm2_initial_params_export(tmp_path):
    """SmolLM2 (the embedded GGUF): a run directory whose checkpoint holds the initial params,
    written by the loop's own state and checkpointer (a training step would add minutes of
    compilation and test nothing more of the export), exported by the command, loaded by
    transformers."""
    import torch
    from safetensors import safe_open
    from transformers import AutoTokenizer

    from hindsight.train.checkpoint import CheckpointConfig, Checkpointer
    from hindsight.train.experiment import resolve
    from hindsight.train.loop import _prepare_workdir, _train_state, load_policy
    from hindsight.train.mesh import make_mesh
    from hindsight.train.optim import make_optimizer

    config = configs.grpo.get_config("smollm2-count_letters")
    config.train.optim.name = "sgd"  # no optimizer moments: the checkpoint holds the params only
    config.model.dtype = "float32"   # logits compared with transformers' float32 forward
    xp = resolve(config)
    workdir = str(tmp_path / "run")
    _prepare_workdir(workdir, xp.config.to_dict())
    mesh = make_mesh(xp.config.train.mesh)
    model, tokenizer = load_policy(xp.config.model, mesh)
    state, _, _ = _train_state(xp, model, make_optimizer(xp.config.train.optim), mesh)
    ckpt = Checkpointer(CheckpointConfig(directory=os.path.join(workdir, "checkpoints")))
    ckpt.save(0, state, force=True)
    ckpt.close()
    del state

    out = str(tmp_path / "hf")  # the command as a user runs it
    result = subprocess.run([sys.executable, "-m", "experiments.export", workdir, f"--out={out}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert (summary["step"], summary["architecture"], summary["dtype"]) == (0, "LlamaForCausalLM", "float32")
    assert summary["num_params"] == 134_515_008 and "model.safetensors" in summary["files"]
    with safe_open(os.path.join(out, "model.safetensors"), framework="numpy") as f:
        assert "lm_head.weight" not in f.keys()  # tied: transformers ties the head to the embedding
    exported = decoder_params(load_hf_folder(out))
    for key, value in decoder_params(model).items():
        np.testing.assert_array_equal(exported[key], value, err_msg=key)
    del exported

    tok = AutoTokenizer.from_pretrained(out)
    for text in PROBES:
        assert tok.encode(text, add_special_tokens=False) == tokenizer.encode(text, add_special_tokens=False)
    assert (tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
            == tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False))
    assert (tok.bos_token_id, tok.eos_token_id) == (tokenizer.bos_token_id, tokenizer.eos_token_id)

    torch.set_num_threads(2)
    hf = _hf_model(out, dtype=torch.float32)
    lengths = (16, 9)  # fewer tokens than the tiny test's: a forward of 135M params costs seconds here
    tokens, positions, mask = padded_batch(lengths, max(lengths), model.config.vocab_size)
    err = max_rel_err(ours(model, tokens, positions, mask), hf_logits(hf, tokens, positions, mask), lengths)
    assert err <= 1e-4, err
    print(f"SmolLM2 max |logits - transformers| / max |logits| = {err:.2e}")
