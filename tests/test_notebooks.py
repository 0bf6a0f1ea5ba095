"""Both notebooks execute headlessly (nbclient, a fresh Python kernel) with their CPU settings; any cell error
fails the test. They are stored without outputs (checked here too), so what they print comes from a real run."""

import os
import pathlib

import nbformat
import pytest

nbclient = pytest.importorskip("nbclient")
pytestmark = pytest.mark.slow  # each loads SmolLM2-135M and compiles its decoders (~2-4 min)

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"


@pytest.mark.parametrize("name", ["quickstart", "train_jacobi_forcing"])
def test_notebook_runs_without_errors(name, monkeypatch):
    path = NOTEBOOKS / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")
    monkeypatch.setenv("JF_JAX_NOTEBOOK_SMALL", "1")
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()  # raises CellExecutionError naming the cell on any error
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "small settings: True" in text
    if name == "train_jacobi_forcing":
        assert "held-out Jacobi TPF" in text and os.environ["JF_JAX_NOTEBOOK_SMALL"] == "1"
