"""The decode-layout benchmark counts the collectives of compiled HLO text correctly."""
from experiments.bench.decode_layouts import collectives

HLO = """
  %all-gather.3 = bf16[64,4096]{1,0} all-gather(bf16[8,4096]{1,0} %p), channel_id=1, dimensions={0}
  %ars = (f32[64,8]{1,0}, bf16[2,3]{1,0}) all-reduce-start(f32[64,8]{1,0} %a, bf16[2,3]{1,0} %b)
  %ard = (f32[64,8]{1,0}, bf16[2,3]{1,0}) all-reduce-done((f32[64,8]{1,0}, bf16[2,3]{1,0}) %ars)
  %cp = s32[16]{0} collective-permute(s32[16]{0} %x), source_target_pairs={{0,1}}
  %dot.1 = f32[64,64]{1,0} dot(f32[64,8]{1,0} %a, f32[8,64]{1,0} %b)
"""


def test_collectives_counts_ops_and_result_bytes():
    assert collectives(HLO) == {
        "all-gather": {"count": 1, "bytes": 64 * 4096 * 2},
        "all-reduce": {"count": 1, "bytes": 64 * 8 * 4 + 2 * 3 * 2},   # -start once, -done not
        "collective-permute": {"count": 1, "bytes": 16 * 4},
    }
