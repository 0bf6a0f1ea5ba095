"""Both notebooks execute headlessly (nbclient, a fresh Python kernel) with their CPU settings; any cell error
fails the test. They are stored without outputs (checked here too), so what they print comes from a real run."""

import json
import os
import pathlib
import sys

import nbformat
import pytest

from tests.conftest import require

nbclient = require("nbclient")
pytestmark = pytest.mark.slow  # each loads SmolLM2-135M and compiles its decoders (~2-4 min)

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"


def _this_interpreter_kernel(tmp_path, monkeypatch) -> str:
    """A kernelspec that runs this test's own interpreter with the checkout on its path. The installed "python3"
    spec runs whichever ``python`` PATH finds; twice a full suite's quickstart kernel could not import jf_jax."""
    spec_dir = tmp_path / "kernels" / "jf-jax-test"
    spec_dir.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec_dir / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "jf-jax test",
                                                      "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(NOTEBOOKS.parent),
                                                                    os.environ.get("PYTHONPATH")])))
    return "jf-jax-test"


@pytest.mark.parametrize("name", ["quickstart", "train_jacobi_forcing"])
def test_notebook_runs_without_errors(name, monkeypatch, tmp_path):
    path = NOTEBOOKS / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")
    monkeypatch.setenv("JF_JAX_NOTEBOOK_SMALL", "1")
    # A user's kernel: no XLA_FLAGS from this process (the notebooks start JAX before importing jf_jax, and the
    # training notebook asserts jacobi == AR, which must hold without any flag; jf_jax.model.decode_jit).
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name=_this_interpreter_kernel(tmp_path, monkeypatch),
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    try:
        client.execute()  # raises CellExecutionError naming the cell on any error
    except nbclient.exceptions.CellExecutionError:
        first = next(c for c in nb.cells if c.cell_type == "code")  # the install cell says what it did, if it ran
        print("install cell output:", [o.get("text", o.get("ename")) for o in first.get("outputs", [])])
        raise
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "small settings: True" in text
    if name == "train_jacobi_forcing":
        assert "held-out Jacobi TPF" in text and os.environ["JF_JAX_NOTEBOOK_SMALL"] == "1"
