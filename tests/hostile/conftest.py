"""The hostile-input suite (issue 47): what a run folder, a ledger, a config, a plug-in string, an archive, a data
file, a signal or a cluster setting can do to fedsim, one file per category (``test_<category>.py``; the categories
of docs/reliability.md). Each test is a probe: it passes when fedsim held (refused in one line, wrote nothing it
must not, stayed bounded). At the end of a session one line per category, ``hostile <category>: P held / T probes``,
so CI's log shows the counts."""
from __future__ import annotations

from collections import defaultdict

import pytest

SUITE = "hostile"  # this folder's name, which a probe's node id starts with (tests/hostile/test_x.py::...)


def category_of(nodeid: str) -> str | None:
    """``tests/hostile/test_configs.py::test_x[case]`` -> ``configs``; None for a test outside the suite."""
    folder, _, file = nodeid.split("::", 1)[0].rpartition("/")
    if folder.rpartition("/")[2] != SUITE or not (file.startswith("test_") and file.endswith(".py")):
        return None
    return file[len("test_"):-len(".py")]


@pytest.hookimpl(tryfirst=True)  # before -m selects by marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each probe is marked ``hostile`` with its category (``pytest -m hostile`` runs the suite alone)."""
    for item in items:
        category = category_of(item.nodeid)
        if category is not None:
            item.add_marker(pytest.mark.hostile(category))
            item.user_properties.append(("hostile_category", category))


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """The working directory is tmp_path (an empty or relative out_dir would land there); no Ray cluster named."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return tmp_path


class HostileTally:
    """Counts the probes of each category as their reports arrive and prints the counts at the end. Registered by
    tests/conftest.py, so it runs where the summary is printed: under xdist that is the controller, which sees
    every report but never collects this folder (so never loads this conftest as one)."""

    def __init__(self) -> None:
        self.outcomes: dict[str, dict[str, str]] = defaultdict(dict)  # category -> node id -> its worst outcome

    def pytest_configure(self, config: pytest.Config) -> None:
        config.addinivalue_line("markers", "hostile(category): a probe of the hostile-input suite (tests/hostile)")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        category = category_of(report.nodeid)
        if category is None:
            return
        seen = self.outcomes[category]
        if report.failed or seen.get(report.nodeid) == "failed":
            seen[report.nodeid] = "failed"  # a failed setup or teardown is a probe that did not hold
        elif report.skipped:
            seen[report.nodeid] = "skipped"
        elif report.when == "call":
            seen[report.nodeid] = "passed"

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.outcomes:
            return
        terminalreporter.section("hostile-input suite")
        for category in sorted(self.outcomes):
            outcomes = list(self.outcomes[category].values())
            held, skipped = outcomes.count("passed"), outcomes.count("skipped")
            extra = f" ({skipped} skipped)" if skipped else ""
            terminalreporter.write_line(f"hostile {category}: {held} held / {len(outcomes)} probes{extra}")
