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


def test_the_readmes_notebook_command_runs_it_with_what_the_notebook_extra_installs(tmp_path):
    import re
    import shutil
    import subprocess
    import tomllib

    readme = (NOTEBOOK.parents[1] / "README.md").read_text()
    assert "notebooks/fairness.ipynb" in readme  # linked from the README
    [command] = re.findall(r"`(jupyter execute --inplace\s+notebooks/fairness\.ipynb)`", readme)
    extras = tomllib.loads((NOTEBOOK.parents[1] / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"nbclient", "ipykernel"} <= {re.split(r"[<>=\[]", req)[0] for req in extras["notebook"]}  # jupyter execute
    (tmp_path / "notebooks").mkdir()
    shutil.copy(NOTEBOOK, tmp_path / "notebooks")
    runs = os.pathsep.join(map(str, two_runs(tmp_path / "runs")))
    env = {**os.environ, "FEDSIM_RUNS": runs, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-m", *command.split()], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    executed = nbformat.read(tmp_path / "notebooks" / "fairness.ipynb", as_version=4)
    assert any("fedper-run" in out.get("text", "") for cell in executed.cells for out in cell.get("outputs", []))
