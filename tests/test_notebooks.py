"""Every notebook in ``notebooks/`` runs top to bottom (code cells in order, one namespace, the
matplotlib Agg backend); the notebooks assert their own invariants (finite scores, shared prefixes,
a gate in [0, 1]), so a failing assertion fails here."""
import json
import pathlib

import matplotlib
import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path):
    matplotlib.use("Agg")
    cells = json.loads(path.read_text())["cells"]
    namespace = {"__name__": "__notebook__"}
    for i, cell in enumerate(c for c in cells if c["cell_type"] == "code"):
        exec(compile("".join(cell["source"]), f"{path.name}[code cell {i}]", "exec"), namespace)
