"""The text API: chat template, stop tokens / strings, decoded samples (stub tokenizer; SmolLM2 slow)."""
import jax
import numpy as np
import pytest

from hindsight.sampling import SamplingParams, generate
from hindsight.sampling.text import encode_prompt, generate_text, score_text


class CharTokenizer:
    """Ids 1..95 = printable ASCII; 0 = end of turn (eos); a toy chat template."""

    eos_token_id = 0

    def __call__(self, text):
        return {"input_ids": self.encode(text)}

    def encode(self, text, add_special_tokens=True):
        return [ord(c) - 31 for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i + 31) for i in ids if i != 0 or not skip_special_tokens)

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        text = "".join(f"{m['role']}:{m['content']};" for m in messages) + ("assistant:" if add_generation_prompt else "")
        return self.encode(text)


def test_generate_text_decodes_and_cuts(tiny):
    tok = CharTokenizer()
    params = SamplingParams(max_new_tokens=16)
    out = generate_text(tiny, tok, ["hi", "go on"], params, num_samples=2, key=jax.random.key(0))
    assert len(out) == 2 and all(len(g) == 2 for g in out)
    ref = generate(tiny, [encode_prompt(tok, "hi"), encode_prompt(tok, "go on")],
                   SamplingParams(max_new_tokens=16, stop_tokens=(0,)), num_samples=2, key=jax.random.key(0))
    for b in range(4):
        s = out[b // 2][b % 2]
        np.testing.assert_array_equal(s.token_ids, ref.tokens[b, : ref.lengths[b]])
        assert s.text == tok.decode(s.token_ids.tolist(), skip_special_tokens=True)
        assert s.finish_reason == ("stop_token" if ref.stopped[b] else "length")
    text = out[0][0].text
    assert len(text) > 2
    cut = generate_text(tiny, tok, ["hi"], params, num_samples=2, key=jax.random.key(0), stop_strings=[text[2]])
    assert cut[0][0].text == text[: text.find(text[2])] and cut[0][0].finish_reason == "stop_string"
    # a multi-token string ends the row while decoding, at the token that completes it: the kept
    # ids are the uncut sample's prefix (a row's draws depend only on its key and prefix)
    stop = text[2:4]
    end = text.find(stop) + len(stop)
    cut = generate_text(tiny, tok, ["hi"], params, num_samples=2, key=jax.random.key(0), stop_strings=[stop])
    np.testing.assert_array_equal(cut[0][0].token_ids, out[0][0].token_ids[:end])
    assert cut[0][0].text == text[: text.find(stop)] and cut[0][0].finish_reason == "stop_string"


def test_stop_strings_cut_at_the_completing_token():
    from hindsight.sampling.text import StopStrings
    tok = CharTokenizer()
    check = StopStrings(tok, ["</a>", "zz"])
    ids = tok.encode("go north</a> and more")
    assert check(ids) == len("go north</a>")
    assert check(tok.encode("go north</")) is None and check([]) is None
    assert check(tok.encode("zz then </a>")) == 2
    with pytest.raises(TypeError, match="single string"):
        StopStrings(tok, "</a>")
    with pytest.raises(ValueError, match="non-empty"):
        StopStrings(tok, [""])


def test_score_text_matches_generation_logprobs(tiny):
    tok = CharTokenizer()
    out = generate_text(tiny, tok, ["abc"], SamplingParams(max_new_tokens=12), key=jax.random.key(2))
    s = out[0][0]
    lp = score_text(tiny, tok, ["abc"], [s.text])[0]  # the text drops a final eos token
    assert len(lp) == len(s.token_ids) - (s.finish_reason == "stop_token")
    np.testing.assert_allclose(lp, s.policy_logprobs[: len(lp)], rtol=1e-5, atol=1e-5)


def test_generate_text_rejects_single_string(tiny):
    with pytest.raises(TypeError, match="list of prompts"):
        generate_text(tiny, CharTokenizer(), "hi")


@pytest.mark.slow
def test_generate_text_smollm2():
    from hindsight.models import load

    model, tok = load("smollm2-135m-instruct")
    out = generate_text(model, tok, ["What is 2 + 2? Answer with one number."],
                        SamplingParams(temperature=0.0, max_new_tokens=16))
    assert "4" in out[0][0].text
