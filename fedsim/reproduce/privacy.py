"""fedsim's own question, not a paper's reproduction: does personalization keep the accuracy that user-level
differential privacy takes away? Its runs, claims and explanations are data, ``papers/privacy/`` (paper.yaml,
claims.yaml, why.md: what is asked and why), read as any paper is; its page, docs/privacy.md's section, reads the runs
through ``report.yaml``: the epsilons, each method's runs and accuracy, Local and the clip norm's proxy. This module
reads that file, checks it against the paper's runs and names what the report and the tests read."""
from __future__ import annotations

from pydantic import field_validator

from fedsim.config.base import Section
from fedsim.errors import ConfigError
from fedsim.reproduce.claims import Metric, Paper
from fedsim.reproduce.paper_files import PAPERS_DIR, checked, load_paper, read_yaml

FOLDER = PAPERS_DIR / "privacy"


class MethodRuns(Section):
    runs: str  # the runs METHOD-eps<epsilon> of paper.yaml
    metric: Metric


class ArmRun(Section):
    label: str
    run: str


class ReportFile(Section):
    """``report.yaml``: what docs/privacy.md's table, figure and notes read of the paper's runs."""
    epsilons: list[float | None]  # None: epsilon = inf, no privacy at all
    tested: float  # the epsilon each drop test compares with inf
    seeds: int
    methods: dict[str, MethodRuns]  # label -> its runs and accuracy, in the table's order
    personalized: list[str]
    local: ArmRun
    proxy: ArmRun

    @field_validator("epsilons")
    @classmethod
    def _inf_last(cls, epsilons: list[float | None]) -> list[float | None]:
        if not epsilons or epsilons[-1] is not None or None in epsilons[:-1]:
            raise ValueError("list the epsilons in rising order, then null (epsilon = inf, no privacy) last")
        return [int(e) if e is not None and float(e).is_integer() else e for e in epsilons]


def _report(paper: Paper) -> ReportFile:
    """``report.yaml``, each run it names checked to be one of ``paper``'s."""
    path = FOLDER / "report.yaml"
    spec: ReportFile = checked(path, ReportFile, read_yaml(path), {})
    named = [f"{m.runs}-eps{epsilon_name(e)}" for m in spec.methods.values() for e in spec.epsilons]
    missing = [run for run in (*named, spec.local.run, spec.proxy.run) if run not in paper.runs]
    if missing:
        raise ConfigError(f"{path}: names the run {missing[0]!r}, which paper.yaml does not define")
    return spec


def epsilon_name(epsilon: float | None) -> str:
    return "inf" if epsilon is None else f"{epsilon:g}"


PAPER = load_paper("privacy", FOLDER)
REPORT = _report(PAPER)
EPSILONS: tuple[float | None, ...] = tuple(REPORT.epsilons)
PRIVATE = tuple(eps for eps in EPSILONS if eps is not None)
TESTED = int(REPORT.tested) if REPORT.tested.is_integer() else REPORT.tested
SEEDS = REPORT.seeds
METHODS: dict[str, tuple[str, Metric]] = {label: (m.runs, m.metric) for label, m in REPORT.methods.items()}
RUN_METHODS = tuple(dict.fromkeys(runs for runs, _ in METHODS.values()))  # each method's runs once, in order
PERSONALIZED = tuple(REPORT.personalized)
LOCAL, LOCAL_RUN = REPORT.local.label, REPORT.local.run
PROXY, PROXY_RUN = REPORT.proxy.label, REPORT.proxy.run


def arm_label(method: str, epsilon: float | None) -> str:
    return f"{method} ε={'∞' if epsilon is None else f'{epsilon:g}'}"


def run_key(method: str, epsilon: float | None) -> str:
    """The run a label's arm reads at ``epsilon`` (FedAvg+FT reads FedAvg's)."""
    return f"{METHODS[method][0]}-eps{epsilon_name(epsilon)}"
