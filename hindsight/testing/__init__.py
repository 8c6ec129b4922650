"""Testing tools: numerical checks for a researcher's own signal or loss (:mod:`.checks`: chex
underneath, the library's mask patterns and invariances), and the tiny random decoder, character
tokenizer and random batches the library's tests use (:mod:`.models`)."""
from hindsight.testing.checks import (B, GARBAGE, LOGPROBS, MASK, MASK_PATTERNS, ROW, ROW_MASK, T,
                                      TURN_ID, VALUES, Input, check_signal, draw, layout, logits,
                                      tokens)
from hindsight.testing.models import (CHAR_VOCAB, TINY, CharTokenizer, char_model, make_batch,
                                      tiny_model)

__all__ = ["B", "CHAR_VOCAB", "GARBAGE", "LOGPROBS", "MASK", "MASK_PATTERNS", "ROW", "ROW_MASK",
           "T", "TINY", "TURN_ID", "VALUES", "CharTokenizer", "Input", "char_model", "check_signal",
           "draw", "layout", "logits", "make_batch", "tiny_model", "tokens"]
