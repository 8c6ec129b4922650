"""grain prompt data: deterministic order, per-process shards, checkpointable position, JSONL."""
import json

import pytest

import hindsight.train as ht

RECORDS = [{"id": i, "prompt": f"q{i}"} for i in range(20)]


def ids(batch):
    return [r["id"] for r in batch]


def take(it, n):
    return [ids(next(it)) for _ in range(n)]


def test_deterministic_by_seed_and_reshuffled_per_epoch():
    a = take(iter(ht.prompt_dataset(RECORDS, batch_size=5, seed=3, process_count=1, process_index=0)), 8)
    b = take(iter(ht.prompt_dataset(RECORDS, batch_size=5, seed=3, process_count=1, process_index=0)), 8)
    c = take(iter(ht.prompt_dataset(RECORDS, batch_size=5, seed=4, process_count=1, process_index=0)), 8)
    assert a == b and a != c
    epoch0, epoch1 = sum(a[:4], []), sum(a[4:], [])
    assert sorted(epoch0) == sorted(epoch1) == list(range(20)) and epoch0 != epoch1


def test_process_shards_are_disjoint_parts_of_the_same_global_batch():
    whole = take(iter(ht.prompt_dataset(RECORDS, batch_size=8, process_count=1, process_index=0)), 3)
    parts = [take(iter(ht.prompt_dataset(RECORDS, batch_size=8, process_count=2, process_index=p)), 3)
             for p in range(2)]
    for k in range(3):
        assert len(parts[0][k]) == len(parts[1][k]) == 4
        assert parts[0][k] + parts[1][k] == whole[k]


def test_iterator_state_restores_the_position():
    it = iter(ht.prompt_dataset(RECORDS, batch_size=4, seed=1, process_count=1, process_index=0))
    take(it, 7)  # into the second epoch
    state = it.get_state()
    expected = take(it, 5)
    fresh = iter(ht.prompt_dataset(RECORDS, batch_size=4, seed=1, process_count=1, process_index=0))
    fresh.set_state(state)
    assert take(fresh, 5) == expected


def test_jsonl_source_and_finite_epochs(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in RECORDS[:6]) + "\n\n")
    cfg = ht.DataConfig(path=str(path), batch_size=3, shuffle=False, num_epochs=1)
    assert [ids(b) for b in ht.make_data_iterator(cfg, process_index=0, process_count=1)] == [
        [0, 1, 2], [3, 4, 5]]
    path.write_text('{"id": 1}\nnot json\n')
    with pytest.raises(ValueError, match=r"prompts.jsonl, line 2: not valid JSON"):
        ht.read_jsonl(str(path))
    with pytest.raises(ValueError, match=r"data.batch_size=5 is not divisible by the process count 2"):
        ht.prompt_dataset(RECORDS, batch_size=5, process_count=2, process_index=0)


def test_a_record_backed_task_is_read_in_epochs_by_step():
    """A task with ``split_examples`` (files, HumanEval) feeds the loop through grain: step ``k``'s
    prompts are batch ``k`` of the shuffled split, every problem once per epoch, a pure function
    of ``(seed, step)``; extra draws (DAPO) come from a reshuffle of the step."""
    import itertools

    from hindsight.tasks import Example
    from hindsight.train.experiment import ConfigError
    from hindsight.train.loop import train_examples

    class Records:
        name = "records"

        def split_examples(self, split):
            assert split == "train"
            return [Example(prompt=f"p{i}", answer=str(i)) for i in range(12)]

    def step(k, count=4, take=None):
        return [e.prompt for e in itertools.islice(
            train_examples(Records(), seed=7, step=k, count=count), take or count)]

    epoch = step(0) + step(1) + step(2)
    assert sorted(epoch) == sorted(f"p{i}" for i in range(12))
    assert step(1) == step(1) and step(3) != step(0)            # a new permutation next epoch
    assert sorted(step(3) + step(4) + step(5)) == sorted(epoch)
    longer = step(1, take=9)
    assert longer[:4] == step(1) and len(longer) == 9            # dynamic sampling draws more
    import pytest
    with pytest.raises(ConfigError, match="prompts_per_step=13 exceeds the 12 problems"):
        step(0, count=13)
