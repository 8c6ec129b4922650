"""Shape buckets: powers of two up to 128, then multiples of 32 for prompts and 64 for caches."""
from hindsight.sampling.buckets import cache_len_bucket, pow2_bucket, prompt_bucket


def test_prompt_buckets():
    assert [prompt_bucket(n) for n in (1, 16, 17, 100, 128)] == [16, 16, 32, 128, 128]
    # above 128: multiples of 32 (a 130-token hindsight context pads to 160, not 192 or 256)
    assert [prompt_bucket(n) for n in (129, 160, 161, 250)] == [160, 160, 192, 256]


def test_cache_and_batch_buckets():
    assert cache_len_bucket(70, 128) == 256  # prompt bucket 128 + 128 new
    assert cache_len_bucket(130, 16) == 192  # 160 + 16 -> next multiple of 64
    assert cache_len_bucket(70, 128, min_len=251) == 256  # room past the cap (HDL's reflection turn)
    assert cache_len_bucket(70, 128, min_len=260) == 320
    assert [pow2_bucket(n) for n in (0, 1, 3, 8, 9)] == [1, 1, 4, 8, 16]
