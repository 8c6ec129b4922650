"""Shared test fixtures: float64 NumPy references live in each test file, not here."""
import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(0)
