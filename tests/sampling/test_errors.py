"""Bad input is rejected with a clear message before anything is compiled."""
import numpy as np
import pytest

from hindsight.sampling import SamplingParams, generate


@pytest.mark.parametrize("prompts, kwargs, match", [
    ([[]], {}, "empty: a prompt needs at least one token"),
    ([], {}, "`prompts` is empty"),
    ([1, 2, 3], {}, "sequence of token sequences"),
    ([[1, 2, 500]], {}, "outside \\[0, 96\\)"),
    ([[1.5, 2.0]], {}, "integer token ids"),
    ([list(range(1, 60))], dict(max_len=64), "exceeds the cache length max_len=64"),
    ([[1, 2]], dict(stop_tokens=[96]), "unknown stop token id\\(s\\) \\[96\\]"),
    ([[1, 2]], dict(num_samples=0), "num_samples"),
    ([[1, 2]], dict(max_new_tokens=0), "max_new_tokens"),
])
def test_generate_rejects_bad_input(tiny, prompts, kwargs, match):
    err = TypeError if "integer" in match else ValueError
    with pytest.raises(err, match=match):
        generate(tiny, prompts, SamplingParams(max_new_tokens=16), **kwargs)


def test_params_stop_token_outside_vocab(tiny):
    with pytest.raises(ValueError, match="unknown stop token"):
        generate(tiny, [[1]], SamplingParams(stop_tokens=(1000,)))


def test_errors_do_not_compile(tiny, monkeypatch):
    """Validation runs before tracing: a failing call never reaches the jitted loop."""
    import hindsight.sampling.engine as engine

    def boom(*a, **k):
        raise AssertionError("compiled on bad input")

    monkeypatch.setattr(engine, "prefill_in_chunks", boom)
    monkeypatch.setattr(engine, "decode_steps", boom)
    with pytest.raises(ValueError):
        generate(tiny, [np.arange(70)], SamplingParams(max_new_tokens=8), max_len=64)
