""":class:`~hindsight.testing.models.CharTokenizer` as a transformers tokenizer, so that an exported
``tiny-random`` policy is a self-contained HF folder (``AutoTokenizer.from_pretrained`` reads it
back): one id per ASCII character, every other character is id 127, ids 0 / 1 / 2 are pad / BOS /
EOS, no special token is added by ``encode``, and the chat template writes ``<role>text`` turns after
a BOS, exactly as ``CharTokenizer`` does."""
from __future__ import annotations

from hindsight.testing.models import CHAR_BOS, CHAR_EOS, CHAR_VOCAB

CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n"
                 "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")


def hf_char_tokenizer():
    """A ``PreTrainedTokenizerFast`` giving ``CharTokenizer``'s ids (encode, decode, chat
    template); ``save_pretrained`` writes it as ``tokenizer.json`` + config."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    unknown = chr(CHAR_VOCAB - 1)
    tok = Tokenizer(models.WordLevel({chr(i): i for i in range(CHAR_VOCAB)}, unk_token=unknown))
    # Every character is its own pre-token (newlines included), looked up whole in the vocabulary;
    # decoding concatenates the pieces without spaces.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=chr(0), bos_token=chr(CHAR_BOS),
                                   eos_token=chr(CHAR_EOS), chat_template=CHAT_TEMPLATE,
                                   clean_up_tokenization_spaces=False)
