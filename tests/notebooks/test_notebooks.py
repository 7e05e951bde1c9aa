"""Every analysis notebook executes top to bottom in a Jupyter kernel (nbclient) with the small
parameters CI uses (TWINSERVE_NOTEBOOK_SMALL=1); the studies are committed with their outputs,
open with their question and end with their answer."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from experiments.study import SMALL_ENV, STUDY_DIR_ENV

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
STUDIES = ["policy_study", "eviction_study", "layout_study"]
CELL_TIMEOUT_S = 600


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, monkeypatch, tmp_path):
    monkeypatch.setenv(SMALL_ENV, "1")
    monkeypatch.setenv(STUDY_DIR_ENV, str(tmp_path))     # never the studies' own outputs/
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK_DIR)}}).execute()   # raises on any error
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert outputs and not [o for o in outputs if o.output_type == "error"]


@pytest.mark.parametrize("name", STUDIES)
def test_study_is_committed_with_question_outputs_and_answer(name):
    notebook = nbformat.read(NOTEBOOK_DIR / f"{name}.ipynb", as_version=4)
    first, last = notebook.cells[0], notebook.cells[-1]
    assert first.cell_type == "markdown" and "**Question.**" in first.source
    assert last.cell_type == "markdown" and last.source.startswith("## Answer") and len(last.source) > 300
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), "commit the executed notebook"
    images = [o for c in code for o in c.outputs if "image/png" in o.get("data", {})]
    assert images, "the study's plots are part of its committed outputs"
