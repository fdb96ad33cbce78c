"""A leaderboard is a board file (settings, rows, base configs) beside its page's passages: the CIFAR-100 board's plan
is the one its lane runs, unchanged by the boards beside it; the Shakespeare board plans its rows on natural text
clients, and its page, without PFLlib numbers, has no PFLlib columns; the speakers board plans the adapter rows on
MiniLM, each row's split of the trainable tensors its own."""
import hashlib
import zlib

import pytest
from conftest import finished_leaderboard_run as finish

from fedsim.cli.main import main
from fedsim.config import results_fingerprint
from fedsim.errors import ConfigError
from fedsim.reproduce import leaderboard

# The CIFAR-100 board's every run (stage 1, stage 2 and finals under stand-in validation scores): its name, seed and
# results fingerprint (what a kept run must match to count), as computed on main without boards (commit 3b4182b).
# A leaderboard lane runs this plan for days: a change here renames or invalidates its kept runs.
CIFAR100_PLAN = (646, "a0d178f1b88a8b395881db42ebfd097bec516fee43754d45f4360bc2594c1a99")
SMALL = ["tune.grid={step: [0.05, 0.1], momentum: [0.0]}", "tune.own_trials=0", "tune.rounds=2", "tune.final_rounds=4",
         "tune.final_seeds=2"]


def _fingerprints(full: leaderboard.Plan) -> list[str]:
    return [f"{item.config.name} {item.seed} {results_fingerprint(item.config.model_dump())}" for item in full.runs]


def test_the_cifar100_boards_plan_is_the_one_its_lane_runs(tmp_path):
    runs, kept, seen = tmp_path / "runs", tmp_path / "kept", []
    for _ in range(3):  # stage 1, then stage 2 at its choices, then the finals
        full = leaderboard.plan("cpu", runs, kept)
        seen += _fingerprints(full)
        for item in full.runs:
            if not item.folder.exists():
                finish(item, test=0.5, validation=0.1 + 0.01 * (zlib.crc32(item.key.encode()) % 7))
    assert not full.waiting() and len(full.finals) == 190
    distinct = sorted(set(seen))
    assert (len(distinct), hashlib.sha256("\n".join(distinct).encode()).hexdigest()) == CIFAR100_PLAN, \
        "the CIFAR-100 board's runs changed: its lane's kept runs would no longer be its plan's"


def test_the_shakespeare_board_plans_its_rows_on_natural_text_clients(tmp_path):
    board = leaderboard.named_board("shakespeare")
    full = leaderboard.plan("cpu", tmp_path, tmp_path / "kept", board=board)
    rows = [s.entry.name for s in full.searches]
    assert rows == ["fedavg", "fedavg_ft", "local", "fedper", "fedrep", "fedbabu", "lg_fedavg", "ditto"]
    assert full.tune.final_seeds == 5  # the base's tune.methods (what `fedsim tune` reads) are the board's rows
    assert leaderboard.base_file("cpu", board=board)["tune"]["methods"] == list(dict.fromkeys(e.method
                                                                                        for e in board.entries))
    first = full.search[0].config
    assert first.name == "leaderboard_shakespeare-cpu-natural-fedavg-t0-s1000"
    assert (first.data.dataset, first.data.partition.name) == ("shakespeare", "natural") and first.data.validation
    fedrep = next(s for s in full.searches if s.entry.name == "fedrep")
    assert fedrep.own == {}  # the row fixes the head epochs: its stage 2 refines the step
    assert {i.config.algorithm.params["head_epochs"] for trial in fedrep.runs for i in trial} == {1}
    ditto = next(s for s in full.searches if s.entry.name == "ditto")
    assert "algorithm.lambda" in ditto.own
    with pytest.raises(ConfigError, match=r"^--scale: 'paper' is not one of \['cpu'\]$"):
        leaderboard.plan("paper", tmp_path, tmp_path / "kept", board=board)
    with pytest.raises(ConfigError, match=r"^--board: 'mnist' is not one of \['cifar100', 'shakespeare', 'speakers'\]$"):
        leaderboard.named_board("mnist")


def test_the_shakespeare_page_has_no_pfllib_columns_and_shows_its_figure(tmp_path, monkeypatch):
    """One command runs the board's search and finals (a stand-in for the runner) and writes its page: every table
    row has the header's cells, none of them PFLlib's, the page says why, and its figure is linked and drawn."""

    def complete(items, kept, max_concurrent=None, say=None):
        for item in items:
            if item.result() is None:
                finish(item, test=0.4 + 0.1 * item.seed, validation=0.3)

    monkeypatch.setattr(leaderboard, "complete", complete)
    report = tmp_path / "docs" / "board.md"
    assert main(["reproduce", "leaderboard", "--board", "shakespeare", "--only", "fedper", "--runs",
                 str(tmp_path / "runs"), "--kept", str(tmp_path / "kept"), "--report", str(report), *SMALL]) == 0
    text = report.read_text()
    assert text.startswith("# Text leaderboard: Shakespeare (cpu scale)")
    assert "fedsim reproduce leaderboard --board shakespeare --scale cpu" in text
    assert "PFLlib's leaderboard has no Shakespeare numbers" in text and "PFLlib %" not in text
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| method | scored |"))
    header, table = lines[start], lines[start + 2:lines.index("", start)]
    assert len(table) == 8 and {row.count("|") for row in table} == {header.count("|")} == {13}
    assert "| 45.00 ± " in next(row for row in table if row.startswith("| `fedper`"))  # seeds 0, 1: 40 and 50
    assert "![Each row's accuracy over the rounds](images/board-cpu.png)" in text
    assert (report.parent / "images" / "board-cpu.png").stat().st_size > 0


def test_the_speakers_board_plans_the_adapter_rows_and_the_floor(tmp_path):
    board = leaderboard.named_board("speakers")
    full = leaderboard.plan("cpu", tmp_path, tmp_path / "kept", board=board)
    rows = {s.entry.name: s for s in full.searches}
    assert list(rows) == ["fedavg_lora", "fedper_lora", "fedsa_lora", "fedbabu_lora", "local_lora", "ditto_lora",
                          "floor"]
    assert full.tune.final_seeds == 5 and full.tune.grid is not None
    assert leaderboard.base_file("cpu", board=board)["tune"]["methods"] == list(dict.fromkeys(e.method
                                                                                        for e in board.entries))
    first = full.search[0].config
    assert first.name == "leaderboard_speakers-cpu-plays-fedavg_lora-t0-s1000"
    assert (first.data.dataset, first.model.name, first.train.body.optimizer) == ("shakespeare_speakers", "minilm",
                                                                                  "adam")
    assert first.data.validation and first.train.fraction == 1.0  # every play every round: no head left untrained

    def configs(row: str) -> list:
        return [item.config for trial in rows[row].runs for item in trial]

    # every row searches the same stage-1 steps, whatever it trains
    assert all({c.train.body.lr for c in configs(row)[:2]} == {0.001, 0.003} for row in rows)
    fedsa = configs("fedsa_lora")
    assert {c.algorithm.name for c in fedsa} == {"fedper"}
    assert {(tuple(c.model.parts.body), tuple(c.model.parts.head)) for c in fedsa} == \
        {(("*lora_A*",), ("*lora_B*", "classifier.*"))}
    assert all(c.model.parts is None for row in rows if row != "fedsa_lora" for c in configs(row))
    floor = configs("floor")
    assert {c.algorithm.name for c in floor} == {"local"}
    assert all(c.model.options["target_modules"] == [] for c in floor)
    assert all(c.model.options["target_modules"] == ["query", "value"] for row in rows if row != "floor"
               for c in configs(row))
    assert {c.eval.finetune_epochs for c in configs("fedbabu_lora")} == {1}
    assert {c.eval.finetune_epochs for row in rows if row != "fedbabu_lora" for c in configs(row)} == {0}
    assert "algorithm.lambda" in rows["ditto_lora"].own


def test_the_speakers_page_states_its_cut_and_has_a_row_for_the_floor(tmp_path, monkeypatch):
    """The page's protocol is filled from the runs' config (plays, speakers, tokens, the cut), and the floor, run
    here by a stand-in for the runner, is the table's one finished row."""

    def complete(items, kept, max_concurrent=None, say=None):
        for item in items:
            if item.result() is None:
                finish(item, test=0.3, validation=0.2)

    monkeypatch.setattr(leaderboard, "complete", complete)
    report = tmp_path / "docs" / "board.md"
    assert main(["reproduce", "leaderboard", "--board", "speakers", "--only", "floor", "--runs", str(tmp_path / "runs"),
                 "--kept", str(tmp_path / "kept"), "--report", str(report), *SMALL]) == 0
    text = report.read_text()
    assert text.startswith("# Adapter leaderboard: speaker attribution (cpu scale)")
    assert "6 plays (['hamlet', 'macbeth', 'othello', 'lear', 'romeo_and_juliet', 'julius_caesar']" in text
    assert "labelling its 6 most frequent speakers" in text and "cut to 32 tokens" in text
    assert "**The cut**: 10% of each play's training speeches" in text and "PFLlib %" not in text
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| method | scored |"))
    table = lines[start + 2:lines.index("", start)]
    assert [row.split("|")[1].strip() for row in table] == [f"`{e.name}`" for e in
                                                            leaderboard.named_board("speakers").entries]
    assert [row.split("|")[1].strip() for row in table if "| 30.00 ± " in row] == ["`floor`"]  # the one row run


@pytest.mark.parametrize("args, message", [
    (["reproduce", "fedper", "--board", "speakers"], "--board: only the leaderboard has boards, not fedper"),
    (["reproduce", "leaderboard", "--figures", "figs"], "--figures: the leaderboard draws its figure into images/"),
])
def test_an_option_the_command_does_not_read_is_refused_in_one_line(tmp_path, capsys, args, message):
    assert main([*args, "--dry-run", "--runs", str(tmp_path / "runs"), "--kept", str(tmp_path / "kept")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
