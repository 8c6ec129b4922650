"""Verification off the decode path: workers check rows while the engine decodes, callbacks run in
submission order, and a rollout verified by workers equals the one verified inline."""
import dataclasses
import threading
import time

import jax
import numpy as np
import pytest

from hindsight.rollout import RolloutConfig, TreeOptions, collect
from hindsight.rollout.verification import Verifier, check_texts
from hindsight.sampling import SamplingParams
from hindsight.tasks import Example, Verdict, get_task
from tests.rollout.helpers import CharTokenizer, ScriptedTask, configured, examples


@dataclasses.dataclass
class SlowTask(ScriptedTask):
    """ScriptedTask that takes ``delay`` seconds per response and records the checking threads."""
    delay: float = 0.0
    threads: set = dataclasses.field(default_factory=set)

    def verify(self, example, response):
        self.threads.add(threading.current_thread().name)
        time.sleep(self.delay)
        return super().verify(example, response)


def test_a_raising_verifier_is_reward_zero_with_its_message():
    class Broken:
        name = "broken"

        def verify(self, example, response):
            if "x" in response:
                raise RuntimeError("parser exploded\nsecond line")
            return task.verify(example, response)

    task = get_task("even_length")
    ex = task.examples(split="train", count=1, seed=0)[0]
    checked = check_texts(Broken(), ex, ["ab", "xy"])
    assert checked.rewards.tolist() == [1.0, 0.0] and checked.errors == 1
    assert checked.feedback[1] == "verifier error: RuntimeError: parser exploded"


def test_rewards_outside_the_declared_range_are_refused():
    class Ten:
        name, reward_range = "ten", (0.0, 10.0)

        def verify(self, example, response):
            return Verdict(float(len(response)), "")

    ex = Example("q", "a")
    assert check_texts(Ten(), ex, ["x" * 10]).rewards.tolist() == [10.0]
    with pytest.raises(ValueError, match=r"reward 11.0 outside its reward_range \[0.0, 10.0\]"):
        check_texts(Ten(), ex, ["x" * 11])
    plain = dataclasses.replace(ScriptedTask())
    plain.verify = lambda e, r: Verdict(2.0, "")
    with pytest.raises(ValueError, match=r"outside its reward_range \[0.0, 1.0\]"):
        check_texts(plain, ex, ["x"])


def test_callbacks_run_in_submission_order_whatever_finishes_first():
    class Sleepy:
        name = "sleepy"

        def verify(self, example, response):
            time.sleep(float(example.prompt))
            return Verdict(1.0, "ok")

    tok, order = CharTokenizer(), []
    rows = np.array([tok.encode("ab")], np.int32)
    with Verifier(Sleepy(), tok, workers=3) as v:
        for i, delay in enumerate((0.3, 0.0, 0.1)):
            v.submit(Example(str(delay), ""), rows, np.array([2]), lambda c, i=i: order.append(i))
        assert v.deliver() == 0 and v.pending == 3   # the head is still sleeping
        waited = v.wait()
        assert 0.1 < waited < 5.0
        assert v.deliver() == 3 and order == [0, 1, 2] and v.pending == 0
    with pytest.raises(ValueError, match="workers"):
        Verifier(Sleepy(), tok, workers=-1)


@pytest.mark.parametrize("method", ["grpo", "hdl"])
def test_workers_give_the_rollout_inline_verification_gives(model, tokenizer, method):
    """The engine keeps decoding while slow checks run in threads; the batch is the one checking
    inline in the engine's callbacks (workers=0) gives, and the wait is reported. Integer and
    boolean fields (tokens, masks, indices) are bit-identical, float fields equal to 1e-6: when
    a worker's result arrives changes when a tree's next request is queued, hence the slot
    batch's width at each chunk (``Engine(min_slots=...)``), and XLA:CPU's matmuls round the
    last bits differently per batch size (a run of tests/rollout saw HDL's batch differ)."""
    if method == "hdl":
        m = configured("hdl", group_size=None, max_new_tokens=24, tail_guard=2, min_gap_floor=2)
        tree = TreeOptions(reflection_max_tokens=8, hindsight_reflection_tokens=6)
    else:
        m, tree = configured("grpo", group_size=4, max_new_tokens=24), TreeOptions()
    exs = examples("mixed", "one", "zero")
    out = {}
    for workers in (0, 3):
        task = SlowTask(delay=0.01)
        batch, stats = collect(m, model, tokenizer, task, exs, key=jax.random.key(3),
                               sampling=SamplingParams(max_new_tokens=24),
                               rollout=RolloutConfig(verify_workers=workers, slots=4, tree=tree,
                                                     chunk_steps=4))
        out[workers] = (batch, stats, task.threads)
    (b0, s0, t0), (b3, s3, t3) = out[0], out[3]
    assert b0.keys() == b3.keys()
    for k in b0:
        a, b = np.asarray(b0[k]), np.asarray(b3[k])
        if np.issubdtype(a.dtype, np.floating):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, err_msg=k)
        else:
            np.testing.assert_array_equal(a, b, err_msg=k)
    assert t0 == {threading.main_thread().name} and all(t.startswith("verify") for t in t3)
    assert s0.seconds.get("verify_wait", 0.0) == 0.0 and "verify_wait" in s3.seconds
    assert s3.verify_worker_seconds >= 0.01 * len(b3["rewards"])
