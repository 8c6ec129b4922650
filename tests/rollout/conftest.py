"""Session fixtures: one tiny character-level decoder (shared so the engine compiles once per
sampling configuration) and its tokenizer."""
import pytest

from tests.rollout.helpers import CharTokenizer, char_model


@pytest.fixture(scope="session")
def model():
    return char_model(0)


@pytest.fixture(scope="session")
def tokenizer():
    return CharTokenizer()
