"""The batch contract: constructor, and the errors a method raises on bad input (before any
compile)."""
import numpy as np
import pytest

from hindsight.batch import build_batch, check_batch
from hindsight.methods import get_method


def _drop(batch, prefix):
    return {k: v for k, v in batch.items() if not k.startswith(prefix)}


def test_make_batch_layout(batch):
    b, t = batch["targets"].shape
    assert (b, t) == (8, 6)
    for ctx in ("teacher", "probe", "hindsight"):
        assert batch[f"{ctx}_target_index"].shape == (b, t)
        # The same response is teacher-forced after every context.
        tok, idx = batch[f"{ctx}_tokens"], batch[f"{ctx}_target_index"]
        rows = np.arange(b)[:, None]
        valid = batch["mask"] > 0
        np.testing.assert_array_equal(np.where(valid, tok[rows, idx + 1], 0),
                                      np.where(valid, batch["targets"], 0))
    assert check_batch(batch, method="test", contexts=("teacher", "probe"),
                       fields=("logp_old", "advantages", "rewards")) == (b, t)


def test_missing_context_names_key_and_method(models, batch):
    model, ref = models
    with pytest.raises(KeyError, match=r"method 'opsd' needs batch key 'teacher_tokens' "
                                       r"\(context 'teacher'\)"):
        get_method("opsd").loss_fn(model, _drop(batch, "teacher_"), reference=ref)
    with pytest.raises(KeyError, match=r"'opsd_pmi' needs batch key 'probe_tokens'"):
        get_method("opsd_pmi").loss_fn(model, _drop(batch, "probe_"), reference=ref)
    with pytest.raises(KeyError, match=r"'grpo' needs batch key 'logp_old'"):
        get_method("grpo").loss_fn(model, _drop(batch, "logp_old"))


@pytest.mark.parametrize("key, value, match", [
    ("mask", np.ones((8, 5), np.float32), r"batch\['mask'\] has shape \(8, 5\), expected \(8, 6\)"),
    ("target_index", np.zeros((8, 7), np.int32), r"batch\['target_index'\] has shape \(8, 7\)"),
    ("teacher_tokens", np.zeros((4, 14), np.int32), r"batch\['teacher_tokens'\] has shape"),
    ("teacher_positions", np.zeros((8, 3), np.int32), r"batch\['teacher_positions'\]"),
    ("logp_old", np.zeros((8,), np.float32), r"batch\['logp_old'\] has shape \(8,\)"),
    ("advantages", np.zeros((4,), np.float32), r"batch\['advantages'\] has shape \(4,\)"),
    ("targets", np.zeros((8, 6), np.float32), r"batch\['targets'\] must be an integer array"),
    ("target_index", np.full((8, 6), 99, np.int32), r"`target_index` holds indices in \[99, 99\]"),
])
def test_shape_and_dtype_errors(models, batch, key, value, match):
    model, ref = models
    bad = dict(batch, **{key: value})
    with pytest.raises((ValueError, TypeError), match=match):
        get_method("pcsd").loss_fn(model, bad, reference=ref)


def test_method_argument_errors(models, batch):
    model, ref = models
    craft = get_method("craft")
    cfg = craft.make_config(group_size=4)
    state = craft.init_state(cfg)
    with pytest.raises(ValueError, match=r"'craft' needs the `reference` model"):
        craft.loss_fn(model, batch, config=cfg, method_state=state)
    with pytest.raises(ValueError, match=r"controller=True needs `method_state`"):
        craft.loss_fn(model, batch, config=cfg, reference=ref)
    with pytest.raises(ValueError, match=r"group_size=3 does not divide the batch size B=8"):
        craft.loss_fn(model, batch, config=craft.make_config(group_size=3), reference=ref,
                      method_state=state)
    token_adv = dict(batch, advantages=np.zeros((8, 6), np.float32))
    with pytest.raises(ValueError, match=r"per-sequence advantages"):
        craft.loss_fn(model, token_adv, config=cfg, reference=ref, method_state=state)
    with pytest.raises(ValueError,
                       match=r"'opsd' needs the `reference` model \(teacher='reference'\)"):
        get_method("opsd").loss_fn(model, batch)
    grpo = get_method("grpo")
    with pytest.raises(ValueError, match=r"kl_coef=0.001"):
        grpo.loss_fn(model, batch, config=grpo.make_config(kl_coef=1e-3))
    with pytest.raises(TypeError, match=r"'dapo' takes a DAPOConfig, got GRPOConfig"):
        get_method("dapo").loss_fn(model, batch, config=get_method("grpo").config)
    with pytest.raises(ValueError, match=r"'grpo' keeps no state"):
        get_method("grpo").loss_fn(model, batch, method_state=state)


def test_build_batch_errors(batch):
    core = {k: batch[k] for k in ("tokens", "positions", "attention_mask", "targets",
                                  "target_index", "mask")}
    ctx = {k: batch[f"teacher_{k}"] for k in ("tokens", "positions", "attention_mask",
                                               "target_index")}
    assert set(build_batch(**core, contexts={"teacher": ctx})) >= {"teacher_tokens", "tokens"}
    with pytest.raises(ValueError, match=r"unknown context 'oracle'"):
        build_batch(**core, contexts={"oracle": ctx})
    with pytest.raises(KeyError, match=r"context 'teacher' is missing \['positions'\]"):
        build_batch(**core, contexts={"teacher": {k: v for k, v in ctx.items()
                                                  if k != "positions"}})
    with pytest.raises(ValueError, match=r"batch\['rewards'\] has shape \(3,\)"):
        build_batch(**core, rewards=np.zeros(3, np.float32))
