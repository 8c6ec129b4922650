"""Every notebook in ``notebooks/`` runs top to bottom (code cells in order, one namespace, the
matplotlib Agg backend) through :func:`experiments.notebook.execute`, on the tiny random model
(``HINDSIGHT_NOTEBOOK_MODEL=tiny``); the notebooks assert their own invariants (finite scores,
shared prefixes, a gate in [0, 1]), so a failing assertion fails here. The saved outputs (from
the embedded model) stay small."""
import json
import pathlib

import pytest

from experiments.notebook import execute

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, monkeypatch):
    monkeypatch.setenv("HINDSIGHT_NOTEBOOK_MODEL", "tiny")
    nb = execute(path)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c["execution_count"] == i + 1 for i, c in enumerate(code))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_saved_notebook_has_its_outputs(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert any(c.get("outputs") for c in code), "save it with experiments.notebook --save"
    assert path.stat().st_size < 200_000
