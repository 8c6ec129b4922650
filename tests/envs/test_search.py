"""The search tool: BM25 over the shipped corpus, exact match / F1 rewards, the task's action
parsing and the search-query token mask, and a search episode's batch row."""
import numpy as np
import pytest

from hindsight.envs import make_env
from hindsight.envs.search import exact_match, f1_score, read_corpus
from hindsight.testing import CharTokenizer
from hindsight.rollout.episodes import Episode, Piece
from hindsight.tasks import get_task


def test_search_then_answer():
    env = make_env("search", top_k=2)
    assert env.reset({"question": "Where?", "answers": ["Khartoum"]}) == "Question: Where?"
    hit = env.step("search:where does the Blue Nile join the White Nile")
    assert hit.observation.startswith("<information>\n1. ") and not hit.done
    assert hit.info["hits"][0] == "d22" and len(hit.info["hits"]) == 2
    assert "No results." in env.step("search:the of a").observation  # stop words only
    assert "Search with <search>" in env.step("").observation
    end = env.step("answer: The Khartoum!")
    assert end.done and end.reward == 1.0 and end.info["searches"] == 2
    env.reset({"question": "Where?", "answers": ["Lake Tana"]})
    wrong = env.step("answer:Tana lake shore")
    assert wrong.reward == 0.0 and "expected 'Lake Tana'" in wrong.info["feedback"]
    assert make_env("search", reward="f1").reset({"question": "q", "answers": ["Lake Tana"]})


def test_answer_scores_and_bad_inputs(tmp_path):
    assert exact_match("the Sahara.", ["Sahara"]) == 1.0 and exact_match("Sahara desert", ["Sahara"]) == 0.0
    assert f1_score("Sahara desert", ["the Sahara"]) == pytest.approx(2 / 3)
    bad = tmp_path / "c.jsonl"
    bad.write_text('{"text": "ok"}\n{"title": "no text"}\n')
    with pytest.raises(ValueError, match="line 2: a passage needs a string field 'text'"):
        read_corpus(str(bad))
    with pytest.raises(ValueError, match="`reward`"):
        make_env("search", reward="bleu")


def test_task_splits_actions_and_query_mask(tmp_path):
    task = get_task("search_qa")
    train, test = task.examples(split="train", count=17, seed=0), task.examples(split="test", count=3, seed=0)
    assert not {e.data for e in train} & {e.data for e in test}
    assert task.parse_action("<search>a</search> then <answer> b </answer>") == "answer:b"
    assert task.parse_action("<answer>b</answer> or <search>c") == "search:c"
    assert task.parse_action("none") == ""
    tok = CharTokenizer()
    ids = tok.encode("I will <search>blue nile</search>")
    mask = task.search_mask(tok, ids)
    text = tok.decode(ids)
    assert "".join(c for c, m in zip(text, mask) if m) == "blue nile"
    # a search episode's row: the query tokens are its search_mask, only on action tokens
    ep = Episode(key=(0, 0), status="done")
    obs = np.asarray(tok.encode("<information>x</information>"), np.int32)
    zeros = lambda n: np.zeros(n, np.float32)
    ep.pieces = [Piece(np.asarray(ids, np.int32), *[zeros(len(ids))] * 3, 0, mask),
                 Piece(obs, *[zeros(obs.size)] * 3, -1)]
    row = ep.arrays(64, 2)
    assert row["search_mask"].sum() == len("blue nile") and not row["search_mask"][len(ids):].any()
    assert (row["mask"][:len(ids)]).all() and not row["mask"][len(ids):].any()
    bad = tmp_path / "qa.jsonl"
    bad.write_text('{"question": "q", "answers": []}\n')
    with pytest.raises(ValueError, match="line 1: field 'answers'"):
        get_task("search_qa", path=str(bad))
