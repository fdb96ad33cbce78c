"""``fedsim reproduce leaderboard``: the personalized methods on a board's settings (``--board``: ``cifar100``, every
method on PFLlib's two CIFAR-100 label-skew settings; ``shakespeare``, text clients; ``speakers``, LoRA adapters on a
pretrained encoder), each at its own settings from an
equal-budget search chosen on validation, then run at several seeds. A board is a file, ``papers/<board>/
leaderboard.yaml`` (its settings, rows, base configs) beside its page's passages (``page.md``): nothing here is
specific to one data set.

Planned from the base config's ``tune`` section (the budget ``fedsim tune`` states, the same for every method):
the **search** runs each method's two stages (``fedsim.sweep.search``: the shared grid at the method's own
defaults, then its own parameters at its stage-1 choice, from a stream of its own) at the search seeds; once a
method's trials in a setting have finished, the trial with the highest mean validation accuracy at the final round
is chosen (validation scores only: ``fedsim.sweep.tune.choose``), and the **finals** run the chosen settings at
seeds 0..final_seeds-1 for ``tune.final_rounds``, whose test accuracy the table reports. The runs are ordinary run folders brought to completion by the reproduction
runner: an interrupted leaderboard resumes where it stopped, and each finished run is kept (``--kept``) as it
finishes, so the leaderboard continues on another machine. The table is written by ``leaderboard_table``."""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError, field_validator

from fedsim.config import Distribution, TuneConfig, load_tree, merge_trees, parse_overrides, validate
from fedsim.config.base import Section
from fedsim.errors import ConfigError, TrainingDiverged, TuningIncomplete
from fedsim.reproduce.diverged import Diverged
from fedsim.reproduce.paper_files import PAPERS_DIR, checked, passages, read_yaml
from fedsim.reproduce.restore import restore_kept
from fedsim.reproduce.runner import CONFIGS, PlannedRun, configure, execute
from fedsim.sweep import search as design
from fedsim.sweep.tune import Choice, budget_text, choose, method_tree, selection_key, validation_part

KEY = "leaderboard"
BOARD_FILE = PAPERS_DIR / "leaderboard" / "leaderboard.yaml"
BOARDS = {"cifar100": BOARD_FILE, "shakespeare": PAPERS_DIR / "leaderboard_shakespeare" / "leaderboard.yaml",
          "speakers": PAPERS_DIR / "leaderboard_speakers" / "leaderboard.yaml"}


class Entry(Section):
    """A row of the leaderboard: its method, its name where a method has two rows (FedAvg and FedAvg+FT), its config
    overrides (settings outside the search: the evaluation it is scored by), PFLlib's name for it, and what PFLlib's
    number scores where that is not what this row reports (PFLlib's column is then left out of the row: the
    quantities differ)."""
    method: str
    row: str | None = None  # the row's name, where it is not the method's
    overrides: dict[str, Any] = {}
    pfllib: str | None = None  # the row of PFLlib's leaderboard, where it has one
    pfllib_scores: str | None = None  # what PFLlib's number scores, where it is not what this row reports

    @property
    def name(self) -> str:
        return self.row or self.method


class BoardSetting(Section):
    title: str
    overrides: dict[str, Any]


class PFLlib(Section):
    """PFLlib's leaderboard, set beside fedsim's: its rounds, its protocol in words, its numbers (its name of a
    method -> setting -> its number as it prints it)."""
    rounds: int
    protocol: str
    numbers: dict[str, dict[str, str]]


class Board(Section):
    """What a board's ``leaderboard.yaml`` declares (checked as it is read), and the folder of its page's passages."""
    key: str = KEY  # its runs' names start with it: another board's runs are never this one's
    heading: str = "Leaderboard"  # the page's title
    report: str = "docs/leaderboard.md"  # the page's default path
    bases: dict[str, str]  # scale -> base config, relative to fedsim/reproduce/configs/
    settings: dict[str, BoardSetting]
    entries: list[Entry]
    pfllib: PFLlib | None = None  # PFLlib's numbers, where PFLlib has a leaderboard of this board's data
    sizing: dict[str, str] = {}  # scale -> how it was sized
    folder: Path = Path()  # set as it is read: where page.md stands

    @field_validator("key")
    @classmethod
    def _one_word(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z0-9_]+", value):  # run names split on "-"
            raise ValueError("lower-case letters, digits and _ only")
        return value


def load_board(path: Path = BOARD_FILE) -> Board:
    board: Board = checked(path, Board, read_yaml(path), passages(path.parent))
    return board.model_copy(update={"folder": path.parent})


def named_board(name: str) -> Board:
    """``--board NAME``'s board."""
    if name not in BOARDS:
        raise ConfigError(f"--board: {name!r} is not one of {sorted(BOARDS)}")
    return load_board(BOARDS[name])


BOARD = load_board()  # the CIFAR-100 board, the default


def base_file(scale: str, configs: Path = CONFIGS, board: Board = BOARD) -> dict:
    """The scale's base config as written: a run's settings and the search's budget (``tune``)."""
    if scale not in board.bases:
        raise ConfigError(f"--scale: {scale!r} is not one of {sorted(board.bases)}")
    return load_tree(configs / board.bases[scale])


def entries(only: str | None, board: Board = BOARD) -> tuple[Entry, ...]:
    """Every entry, or (``--only``) one row (named by its row name: ``fedavg``, ``fedavg_ft``)."""
    if only is None:
        return tuple(board.entries)
    chosen = tuple(e for e in board.entries if e.name == only)
    if not chosen:
        raise ConfigError(f"--only: the leaderboard has no method {only!r}; choose one of "
                          f"{[e.name for e in board.entries]}")
    return chosen


def run_key(setting: str, entry: Entry) -> str:
    """A final run's key (its setting and row); a search run's adds its trial (``-t<k>``, ``-o<k>``)."""
    return f"{setting}-{entry.name}"


@dataclass(frozen=True)
class Search:
    """One row's search in one setting: its own space, the settings of each trial (the first ``first`` stage 1's,
    then stage 2's once stage 1 has chosen) and each trial's runs (one per search seed), and its choice once every
    trial has finished or diverged (None before; ``failed``: why no trial could be chosen)."""
    setting: str
    entry: Entry
    own: dict[str, Distribution]
    trials: list[dict[str, Any]]
    runs: list[list[PlannedRun]]
    first: int
    choice: Choice | None = None
    failed: str | None = None

    def trial_name(self, k: int) -> str:
        return design.trial_label(k, self.first)


@dataclass(frozen=True)
class Plan:
    """The leaderboard's runs: the search (every method's trials), the finals of each method chosen so far, and
    the budget it was planned with."""
    tune: TuneConfig
    rounds: int
    final_rounds: int
    searches: list[Search]
    finals: list[PlannedRun]
    board: Board

    @property
    def search(self) -> list[PlannedRun]:
        """The search runs, trial-major (every method's trial 0 first), so an interrupted search has drawn every
        method's trials as evenly as it could."""
        count = max((len(s.runs) for s in self.searches), default=0)
        return [item for k in range(count) for s in self.searches if k < len(s.runs) for item in s.runs[k]]

    @property
    def runs(self) -> list[PlannedRun]:
        return self.search + self.finals

    def waiting(self) -> list[Search]:
        """The searches whose finals cannot be planned yet (a trial still to run)."""
        return [s for s in self.searches if s.choice is None and s.failed is None]

    def budget(self) -> str:
        first = {s.entry.name: s.first for s in self.searches}
        return budget_text(self.tune, self.rounds, self.final_rounds, first) + " per row and setting"


def tuning(tree: dict[str, Any], board: Board = BOARD) -> TuneConfig:
    """The base config's ``tune`` section (budget and shared space) with the leaderboard's methods."""
    section = tree.get("tune")
    if not isinstance(section, dict):
        raise ConfigError("tune: the leaderboard's base config needs a tune section (trials, seeds, final_seeds, "
                          "space): the budget every method is searched with")
    try:
        return TuneConfig.model_validate({**section, "methods": list(dict.fromkeys(e.method for e in board.entries))})
    except ValidationError as err:
        first = err.errors()[0]
        raise ConfigError(f"tune.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def plan(scale: str, runs_dir: Path, kept: Path, overrides: Sequence[str] = (), only: str | None = None,
         final_seeds: int | None = None, configs: Path = CONFIGS, board: Board = BOARD) -> Plan:
    """Every search run, and the finals of each method whose search has ended (chosen from its runs' validation
    scores in ``runs_dir``; a run recorded in ``kept``'s ledger as diverged is a failed trial). ``overrides``
    (key=value) apply to the base (``tune.*`` included) before anything is drawn; ``final_seeds`` replaces
    tune.final_seeds. Finals are seed-major (all of seed 0 first), so a partial leaderboard ranks every chosen
    method at fewer seeds."""
    tree = merge_trees(base_file(scale, configs, board), parse_overrides(list(overrides)))
    tune = tuning(tree, board)
    if final_seeds is not None:
        tune = tune.model_copy(update={"final_seeds": final_seeds})
    run_tree = {k: v for k, v in tree.items() if k != "tune"}
    rounds = tune.rounds or validate(run_tree).train.rounds
    final_rounds = tune.final_rounds or rounds
    finals_tree = configure(run_tree, {"train.rounds": final_rounds})
    run_tree = configure(run_tree, {"train.rounds": rounds})
    diverged = Diverged(kept)
    seed = validate(run_tree).seed  # the search's streams' seed, read once
    shared = design.shared_trials(tune, seed)
    where = Where(board, scale, runs_dir)
    searches = [_search(where, run_tree, setting, entry, tune, seed, shared, diverged)
                for setting in board.settings for entry in entries(only, board)]
    finals = [_final(where, finals_tree, s, seed) for seed in range(tune.final_seeds)
              for s in searches if s.choice is not None]
    return Plan(tune, rounds, final_rounds, searches, finals, board)


@dataclass(frozen=True)
class Where:
    """The board, scale and runs folder a plan's runs are made for (their settings and names)."""
    board: Board
    scale: str
    runs_dir: Path

    def tree(self, run_tree: dict[str, Any], setting: str, entry: Entry, values: dict[str, Any]) -> dict[str, Any]:
        # the row's method parameters go into the method's section, which method_tree sets whole
        overrides = {**self.board.settings[setting].overrides,
                     **{key: value for key, value in entry.overrides.items() if not key.startswith(design.OWN_PREFIX)}}
        return method_tree(configure(run_tree, overrides), {"name": entry.method, **_own_fixed(entry)}, values)

    def named(self, tree: dict[str, Any], name: str, seed: int) -> Any:
        return validate({**tree, "name": f"{self.board.key}-{self.scale}-{name}-s{seed}", "seed": seed,
                         "out_dir": str(self.runs_dir)})


def _search(where: Where, run_tree: dict[str, Any], setting: str, entry: Entry, tune: TuneConfig, seed: int,
            shared: list[dict[str, Any]], diverged: Diverged) -> Search:
    """The row's search as far as its finished runs let it be planned: stage 1; stage 2 once stage 1 has ended
    (at its choice); the choice over both once every trial has ended."""
    trials = design.for_method(entry.method, shared)
    own = design.own_space(entry.method, _own_fixed(entry))
    search = Search(setting, entry, own, trials, _trial_runs(where, run_tree, setting, entry, tune, trials, "t"),
                    len(trials))
    first = _ended(search, diverged)
    if not isinstance(first, Choice):
        return first
    added = design.own_trials(seed, entry.method, own, trials[first.trial], tune.own_trials)
    search = Search(setting, entry, own, trials + added, search.runs + _trial_runs(
        where, run_tree, setting, entry, tune, added, "o"), len(trials))
    both = _ended(search, diverged)
    return both if not isinstance(both, Choice) else replace(search, choice=both)


def _own_fixed(entry: Entry) -> dict[str, Any]:
    """The method parameters the row's overrides fix (not searched)."""
    return {key.removeprefix(design.OWN_PREFIX): value for key, value in entry.overrides.items()
            if key.startswith(design.OWN_PREFIX)}


def _trial_runs(where: Where, run_tree: dict[str, Any], setting: str, entry: Entry, tune: TuneConfig,
                trials: list[dict[str, Any]], stage: str) -> list[list[PlannedRun]]:
    """A stage's runs, trial by trial: ``<key>-t<k>`` in stage 1, ``<key>-o<k>`` in stage 2 (``stage``)."""
    key = run_key(setting, entry)
    runs = []
    for k, values in enumerate(trials):
        name = f"{key}-{stage}{k}"
        runs.append([PlannedRun(name, seed, where.named(where.tree(run_tree, setting, entry, values), name, seed))
                     for seed in tune.seeds])
    return runs


def _ended(search: Search, diverged: Diverged) -> Search | Choice:
    """The search's choice among its planned trials once each has finished or diverged; else the search itself
    (a trial still to run), or the search marked failed (every trial diverged)."""
    if any(item.result() is None and not diverged.of(item) for trial in search.runs for item in trial):
        return search
    scores = [[_scores(item) for item in trial] for trial in search.runs]
    try:
        return choose(search.entry.name, scores, selection_key(search.runs[0][0].config))
    except TuningIncomplete as err:
        return replace(search, failed=str(err))


def _scores(item: PlannedRun) -> dict | None:
    """A search run's validation scores alone (what the choice may read); None where it diverged."""
    summary = item.result()
    return None if summary is None else validation_part(summary)


def _final(where: Where, run_tree: dict[str, Any], search: Search, seed: int) -> PlannedRun:
    assert search.choice is not None
    key = run_key(search.setting, search.entry)
    tree = where.tree(run_tree, search.setting, search.entry, search.trials[search.choice.trial])
    return PlannedRun(key, seed, where.named(tree, key, seed))


def restored(make_plan: Callable[[], Plan], kept: Path) -> tuple[Plan, int]:
    """The plan once every run it names that the archive ``kept`` holds and the runs folder lacks is put back,
    and how many were: the search's runs first, then (their choices now read) the finals' -- so a leaderboard
    continues on another machine, or a fresh clone, from everything kept."""
    count = 0
    while True:
        full = make_plan()
        put_back = restore_kept(full.runs, kept)
        if not put_back:
            return full, count
        count += put_back


def complete(planned: list[PlannedRun], kept: Path, max_concurrent: int | None = None,
             say: Callable[[str], None] = print) -> None:
    """Bring every run to completion (the reproduction runner: finished runs skipped, interrupted ones resumed,
    each kept in ``kept`` as it finishes), recording a run that diverges instead of stopping the leaderboard.
    ``max_concurrent``: as Ray Tune trials on the current cluster (a diverged trial is then reported by Tune as
    failed, and left out of the table)."""
    if not planned:
        return
    if max_concurrent is not None:
        execute(planned, say, max_concurrent, name="-".join(planned[0].config.name.split("-")[:2]), kept=kept)
        return
    diverged = Diverged(kept)
    for i, item in enumerate(planned, 1):
        where = f"[{i}/{len(planned)}] {item.config.name}"
        why = diverged.of(item)
        if why:
            say(f"{where}: diverged before ({why}), skipped")
            continue

        def say_where(line: str) -> None:  # execute numbers its one run [1/1]: show its place in the leaderboard
            say(line.replace("[1/1] " + item.config.name, where))

        try:
            execute([item], say=say_where, kept=kept)
        except TrainingDiverged as err:
            diverged.record(item, str(err))
            say(f"{where}: diverged: {err}")
