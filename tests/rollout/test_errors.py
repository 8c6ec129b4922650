"""Bad input fails before anything is sampled or compiled, with errors that say what is wrong."""
import dataclasses

import jax
import pytest

from hindsight.methods import get_method
from hindsight.rollout import RolloutConfig, collect
from hindsight.sampling import SamplingParams
from hindsight.tasks import Example
from tests.rollout.helpers import CharTokenizer, ScriptedTask, configured, examples

TOK, TASK, KEY = CharTokenizer(), ScriptedTask(), jax.random.key(0)
PARAMS = SamplingParams(max_new_tokens=8)


def _collect(method, exs=None, **kw):
    kw.setdefault("sampling", PARAMS)
    if isinstance(method, str):
        method = configured(method, group_size=None if method == "hdl" else 4,
                            temperature=kw["sampling"].temperature)
    return collect(method, None, TOK, TASK, exs or examples("mixed"), key=KEY, **kw)


def test_unknown_rollout_shape():
    beam = dataclasses.replace(configured("grpo", group_size=4), rollout="beam")
    with pytest.raises(ValueError, match="rollout shape 'beam'.*known shapes"):
        _collect(beam)


def test_unconfigured_method():
    with pytest.raises(ValueError, match=r"'grpo' is not configured.*configure"):
        _collect(get_method("grpo"))
    with pytest.raises(TypeError, match="configured hindsight.methods.Method"):
        _collect(object())


def test_group_size_mismatch():
    with pytest.raises(ValueError, match=r"rollout.group_size=8 but an HDL tree has 16 rows"):
        configured("hdl", group_size=8)
    with pytest.raises(ValueError, match=r"rollout.group_size must be set"):
        configured("grpo")


def test_missing_reference_answer():
    exs = [Example(prompt="q0", answer="a"), Example(prompt="q1", answer="")]
    with pytest.raises(ValueError, match="reference answer.*example 1"):
        _collect("opsd", exs, sampling=SamplingParams(temperature=1.1))  # OPSD's loss temperature


def test_hindsight_context_needs_a_tree():
    method = dataclasses.replace(configured("grpo", group_size=4), contexts=("hindsight",))
    with pytest.raises(ValueError, match="only the 'hdl_tree' rollout"):
        _collect(method)
    unknown = dataclasses.replace(configured("grpo", group_size=4), contexts=("oracle",))
    with pytest.raises(ValueError, match="context 'oracle'"):
        _collect(unknown)


def test_temperature_and_counts():
    with pytest.raises(ValueError, match="temperature"):
        _collect(configured("grpo", group_size=4), sampling=SamplingParams(temperature=0.7))
    with pytest.raises(ValueError, match="num_groups"):
        _collect("dapo")
    with pytest.raises(ValueError, match="num_groups"):
        _collect("grpo", num_groups=3)
    with pytest.raises(ValueError, match="non-empty sequence"):
        collect(configured("grpo", group_size=4), None, TOK, TASK, [], key=KEY, sampling=PARAMS)
