"""The package's layers: which file imports which, read from the source (every import, also those inside a
function or under ``TYPE_CHECKING``), so a circle or an arrow that runs up a layer fails here."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

import fedsim

PACKAGE = Path(fedsim.__file__).resolve().parent
# Bottom to top. A file imports files of its own layer or of layers below it.
LAYERS = ("core", "privacy", "data", "models", "algorithms", "plan", "client", "engine", "metrics", "simulate", "sweep", "reproduce",
          "cli")
# The top-level helpers sit with the core: settings (the config package), errors, files and storage, used by every
# layer.
BASE = {"__init__", "config", "errors", "atomic", "safe_files", "plugins", "strict_yaml", "storage",
        "lean_imports"}
# The one arrow that runs back up: the config's cross-section checks read the method's own typed parameters and
# what it supports (fedsim/config/checks.py).
UPWARD_ALLOWED = {("config/checks", "algorithms/__init__")}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    return rel.as_posix()


def resolve(name: str) -> str | None:
    """``fedsim.a.b`` -> the file it names (``a/b`` or ``a/b/__init__``), None outside the package."""
    if name != "fedsim" and not name.startswith("fedsim."):
        return None
    parts = name.split(".")[1:]
    base = PACKAGE.joinpath(*parts)
    if base.with_suffix(".py").is_file():
        return "/".join(parts)
    if (base / "__init__.py").is_file():
        return "/".join([*parts, "__init__"])
    return None


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    package = ".".join(["fedsim", *path.relative_to(PACKAGE).parent.parts])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {t for a in node.names if (t := resolve(a.name))}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:  # `from fedsim import storage` names a module; `from fedsim.x import f` a file
                target = resolve(f"{base}.{alias.name}") or resolve(base)
                if target:
                    found.add(target)
    return found - {module_name(path)}


def import_graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}


def layer(module: str) -> int:
    top = module.split("/")[0]
    return -1 if top in BASE else LAYERS.index(top)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one file (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_between_files():
    assert circles(import_graph()) == []


def test_every_file_belongs_to_a_layer_and_imports_only_downward():
    graph = import_graph()
    upward = sorted((a, b) for a, targets in graph.items() for b in targets if layer(b) > layer(a))
    assert [arrow for arrow in upward if arrow not in UPWARD_ALLOWED] == []
    assert len(upward) <= 1


def test_the_client_runtime_imports_nothing_of_the_engine_nor_the_engine_of_the_client():
    """The engine starts workers through the spawn function it is given (``fedsim.simulate`` passes it)."""
    graph = import_graph()
    client, engine = ([m for m in graph if m.startswith(f"{layer}/")] for layer in ("client", "engine"))
    assert client and not [(m, t) for m in client for t in graph[m] if t.startswith("engine/")]
    assert engine and not [(m, t) for m in engine for t in graph[m] if t.startswith("client/")]


def test_core_and_the_server_side_import_no_torch():
    """The server actor's process only routes and aggregates: it is up in well under a second because
    nothing it imports pulls in torch (~3 s)."""
    modules = [f"fedsim.{m.replace('/', '.').removesuffix('.__init__')}" for m in import_graph() if m.startswith("core/")]
    modules += ["fedsim.engine.server", "fedsim.engine.backend", "fedsim.algorithms", "fedsim.client.worker"]
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nprint('torch' in sys.modules, 'dp_accounting' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"  # nor dp-accounting (~0.6 s): the plan carries DP's epsilon values



WATCHED = ("ray", "torch", "torchvision", "transformers", "matplotlib", "scipy")


def _imported_by(code: str, *args: str) -> tuple[list[str], str]:
    """(which of ``WATCHED`` a fresh process running ``code``, with ``args`` as sys.argv[1:], has imported at its
    end, its stderr)."""
    watch = f"\nimport sys\nprint('imported:', *[m for m in {WATCHED!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code + watch, *args], capture_output=True, text=True)
    return out.stdout.rpartition("imported:")[2].split(), out.stderr


def test_fedsim_help_and_a_partition_the_data_cannot_make_import_no_torch_nor_ray(tmp_path):
    """A user waits seconds for torch and Ray: ``fedsim --help`` and a split the data cannot make never load them."""
    config = tmp_path / "c.yaml"
    config.write_text("name: x\nalgorithm: fedavg\ndata: {dataset: synthetic, partition: {name: classes, k: 4}, "
                      "num_clients: 2, options: {num_clients: 2}}\nmodel: {name: mlp}\ntrain: {rounds: 1}\n")
    cli = "import sys\nfrom fedsim.cli.main import run_cli\nsys.argv[0] = 'fedsim'\ntry:\n    run_cli()\nexcept SystemExit:\n    pass"
    assert _imported_by(cli, "--help")[0] == []
    imported, errors = _imported_by(cli, "run", str(config))
    assert "data.partition.k" in errors and imported == []


def test_a_worker_imports_torchmetrics_without_its_optional_integrations_and_they_stay_findable():
    """fedsim/lean_imports.py: torchmetrics loads without torchvision's models, transformers, matplotlib and
    scipy (seconds of every worker's start-up), and lightning_utilities answers truthfully about them afterwards."""
    code = ("import fedsim.client.runtime\nfrom lightning_utilities.core.imports import RequirementCache, "
            "package_available\nassert package_available('torchvision') and RequirementCache('matplotlib')")
    assert _imported_by(code) == (["ray", "torch"], "")


@pytest.mark.parametrize("opt_out, plots", [(None, False), ("0", True)])
def test_torchmetrics_loads_whole_where_the_environment_opts_out(monkeypatch, opt_out, plots):
    """torchmetrics' own flags keep the answer its lean import gave (``Metric.plot`` says matplotlib is missing);
    ``FEDSIM_LEAN_IMPORTS=0``, which workers inherit, loads it whole for a module that needs plots, FID or BERTScore."""
    if opt_out is None:
        monkeypatch.delenv("FEDSIM_LEAN_IMPORTS", raising=False)
    else:
        monkeypatch.setenv("FEDSIM_LEAN_IMPORTS", opt_out)
    code = ("import fedsim, torchmetrics\nfrom torchmetrics.utilities.imports import _MATPLOTLIB_AVAILABLE\n"
            f"assert bool(_MATPLOTLIB_AVAILABLE) is {plots}")
    assert _imported_by(code)[1] == ""

