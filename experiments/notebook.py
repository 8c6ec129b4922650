"""Run a notebook's code cells top to bottom in one namespace, and optionally save their outputs.

    python -m experiments.notebook notebooks/hindsight_scores.ipynb --save

Each code cell's printed text becomes a ``stream`` output and each figure it shows (``plt.show()``,
matplotlib's Agg backend) a PNG ``display_data`` output, so the saved notebook reads on GitHub
without running it. ``tests/test_notebooks.py`` runs every notebook through :func:`execute`
(without saving), so what is saved is what the test suite checks. Environment variables set
before the run reach the notebook (``HINDSIGHT_NOTEBOOK_MODEL=tiny`` picks the tiny random model
where a notebook offers it).
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import pathlib

FIGURE_DPI = 72  # small PNGs: the saved notebook stays a few tens of KiB


def execute(path: str | pathlib.Path) -> dict:
    """Run the code cells of the notebook at ``path``; returns the notebook (a dict) with every
    code cell's ``outputs`` and ``execution_count`` replaced by this run's. A failing cell raises
    (its exception names the cell)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = pathlib.Path(path)
    nb = json.loads(path.read_text())
    namespace = {"__name__": "__notebook__"}
    count = 0
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        count += 1
        figures: list[str] = []

        def show(*args, **kwargs):
            buf = io.BytesIO()
            plt.gcf().savefig(buf, format="png", dpi=FIGURE_DPI, bbox_inches="tight")
            plt.close("all")
            figures.append(base64.b64encode(buf.getvalue()).decode("ascii"))

        text = io.StringIO()
        original_show, plt.show = plt.show, show
        try:
            with contextlib.redirect_stdout(text):
                exec(compile("".join(cell["source"]), f"{path.name}[code cell {count - 1}]",
                             "exec"), namespace)
        finally:
            plt.show = original_show
        outputs = []
        if text.getvalue():
            outputs.append({"output_type": "stream", "name": "stdout",
                            "text": text.getvalue().splitlines(keepends=True)})
        outputs += [{"output_type": "display_data", "metadata": {},
                     "data": {"image/png": png, "text/plain": ["<Figure>"]}} for png in figures]
        cell["outputs"], cell["execution_count"] = outputs, count
    return nb


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("path")
    p.add_argument("--save", action="store_true", help="write the outputs into the notebook")
    args = p.parse_args(argv)
    nb = execute(args.path)
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            if out["output_type"] == "stream":
                print("".join(out["text"]), end="")
    if args.save:
        pathlib.Path(args.path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
