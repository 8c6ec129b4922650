"""A search tool for search-augmented QA (HindSearch's setting): a local BM25 index (``bm25s``)
over a corpus file, queried by ``<search>query</search>`` turns; ``<answer>...</answer>`` ends
the episode with an exact-match (or F1) reward against the question's answers.

The episode task turns a turn's text into the action ``"search:<query>"`` or ``"answer:<text>"``
(:class:`hindsight.tasks.episodic.SearchQATask`); anything else is answered with a reminder of
the two tags. Results come back as one observation: the top ``top_k`` passages, numbered, each as
``title: text`` cut to ``max_passage_chars``, inside ``<information>...</information>``.
"""
from __future__ import annotations

import collections
import os
import re
import string

from hindsight._records import read_records
from hindsight.envs.base import Step, register_env

DATA = os.path.join(os.path.dirname(__file__), "data")
CORPUS = os.path.join(DATA, "search_corpus.jsonl")
"""The shipped corpus: 24 short passages written for the tests and the tiny configs."""


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(c for c in text.lower() if c not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, answers) -> float:
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(a) for a in answers))


def f1_score(prediction: str, answers) -> float:
    """The best token-level F1 of ``prediction`` against any of ``answers`` (SQuAD's)."""
    best = 0.0
    pred = normalize_answer(prediction).split()
    for answer in answers:
        gold = normalize_answer(answer).split()
        common = sum((collections.Counter(pred) & collections.Counter(gold)).values())
        if common:
            precision, recall = common / len(pred), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def read_corpus(path: str) -> list[dict]:
    """The corpus records (``id``, ``title``, ``text``) of a JSONL or Parquet file; errors name
    the file and line."""
    out = []
    for where, record in read_records(path):
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise ValueError(f"{where}: a passage needs a string field 'text'")
        out.append({"id": str(record.get("id", where)), "title": str(record.get("title", "")),
                    "text": record["text"]})
    if not out:
        raise ValueError(f"{path}: the corpus is empty")
    return out


@register_env("search")
class Search:
    """BM25 over ``corpus`` (a JSONL file of passages). ``setup``: ``{"question", "answers"}``.

    Args:
      corpus: the passages' file (default the shipped :data:`CORPUS`).
      top_k: passages per search. max_passage_chars: each passage is cut to this many characters.
      reward: ``"em"`` (exact match after SQuAD normalisation) or ``"f1"``.
    """

    deterministic = True

    def __init__(self, *, corpus: str = CORPUS, top_k: int = 3, max_passage_chars: int = 300,
                 reward: str = "em"):
        import bm25s  # imported in the worker only
        if reward not in ("em", "f1"):
            raise ValueError(f"`reward` must be 'em' or 'f1', got {reward!r}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"`top_k` must be a positive int, got {top_k!r}")
        self.passages = read_corpus(corpus)
        self.top_k, self.max_chars, self.reward = min(top_k, len(self.passages)), max_passage_chars, reward
        self._bm25s = bm25s
        self.index = bm25s.BM25()
        self.index.index(bm25s.tokenize([f"{p['title']} {p['text']}" for p in self.passages],
                                        stopwords="en", show_progress=False), show_progress=False)
        self.question, self.answers, self.searches = None, (), 0

    def reset(self, setup: dict) -> str:
        self.question, self.answers = str(setup["question"]), tuple(setup["answers"])
        self.searches = 0
        return f"Question: {self.question}"

    def search(self, query: str) -> list[dict]:
        """The top passages for ``query`` (none for a query of stop words only)."""
        tokens = self._bm25s.tokenize([query], stopwords="en", show_progress=False)
        if not tokens.ids or not tokens.ids[0]:
            return []
        ids, scores = self.index.retrieve(tokens, k=self.top_k, show_progress=False)
        return [self.passages[int(i)] for i, s in zip(ids[0], scores[0]) if s > 0]

    def step(self, action: str) -> Step:
        kind, _, text = action.partition(":")
        text = text.strip()
        if kind == "answer":
            em, f1 = exact_match(text, self.answers), f1_score(text, self.answers)
            reward = em if self.reward == "em" else f1
            verdict = "correct" if em else f"expected {self.answers[0]!r}, answered {text[:60]!r}"
            return Step("", reward, True, {"feedback": verdict, "em": em, "f1": f1,
                                           "searches": self.searches})
        if kind == "search" and text:
            self.searches += 1
            hits = self.search(text)
            body = "\n".join(f"{n}. {p['title']}: {p['text'][:self.max_chars]}"
                             for n, p in enumerate(hits, 1)) or "No results."
            return Step(f"<information>\n{body}\n</information>", 0.0, False,
                        {"query": text, "hits": [p["id"] for p in hits], "feedback": ""})
        return Step("Search with <search>query</search> or answer with <answer>answer</answer>.",
                    0.0, False, {"feedback": "neither a search nor an answer"})

    def close(self) -> None:
        self.index = None
