import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from conftest import two_runs

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "fairness.ipynb"


def test_fairness_notebook_runs_on_given_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSIM_RUNS", os.pathsep.join(map(str, two_runs(tmp_path))))  # the kernel inherits it
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # Probe: the kernel must be this venv's interpreter, so it tests the fedsim installed here, not another one.
    nb.cells.append(nbformat.v4.new_code_cell("import sys\nprint(sys.prefix)"))
    NotebookClient(nb, kernel_name="python3", timeout=60, allow_errors=True,
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()

    outputs = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [f"{o.ename}: {o.evalue}" for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2  # fairness curves, final per-client bars
    printed = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stdout")
    # The summary table lists the FEDSIM_RUNS runs (not the default quickstart ones) with summarize's numbers.
    assert "fedavg-run" in printed and "fedper-run" in printed and "quickstart" not in printed
    assert "50.00" in printed and "0.833" in printed
    assert nb.cells[-1].outputs[0].text.strip() == sys.prefix
