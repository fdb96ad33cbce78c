"""A paper's reproduction read from its folder, ``fedsim/reproduce/papers/<paper>/``: ``paper.yaml`` (title, base
configs, what each scale cuts, the settings its claims are read at, its runs), ``claims.yaml`` (each claim: the
paper's statement, the arms, the tests, what fedsim's setting keeps and cuts, the numbers set beside it) and any
Markdown files of named passages (``## name`` and its text), which a text field cites as ``{{name}}``.

Every file is checked as it is read: a typo is one line naming the file and the field. Two values an override may
hold beyond a config value: ``{$run: KEY}``, the folder of another of the paper's runs at the same seed
(``RunFolder``), and ``{$from_base: EXPRESSION}``, a number computed from the scale's base config (``FromBase``)."""
from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError, field_validator, model_validator

from fedsim import strict_yaml
from fedsim.config.base import SHORT, Section
from fedsim.errors import ConfigError, YamlError
from fedsim.reproduce.claims import (MARGIN, Arm, Claim, Metric, Overrides, Page, Paper, RunFolder, Setting, Stat,
                                     Test, at_most, gap_shrinks, gap_trend, greater, trend)

PAPERS_DIR = Path(__file__).resolve().parent / "papers"
CITED = re.compile(r"\{\{([\w.-]+)\}\}")
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)

_OPERATORS: dict[type, Callable[[Any, Any], Any]] = {ast.Add: operator.add, ast.Sub: operator.sub,
                                                      ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}
_FUNCTIONS: dict[str, Callable[..., Any]] = {"max": max, "min": min}


@dataclass(frozen=True)
class FromBase:
    """An override value computed from the scale's base config: integer arithmetic (+ - * //, max, min) over its
    dotted keys, e.g. ``max(1, train.rounds * train.local_epochs // 10)``."""
    expression: str

    def __post_init__(self) -> None:
        self._evaluate(ast.parse(self.expression, mode="eval").body, None)  # checked once, without a base

    def __call__(self, base: dict) -> Any:
        return self._evaluate(ast.parse(self.expression, mode="eval").body, base)

    def _evaluate(self, node: ast.AST, base: dict | None) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](self._evaluate(node.left, base), self._evaluate(node.right, base))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
                and not node.keywords):
            return _FUNCTIONS[node.func.id](*(self._evaluate(arg, base) for arg in node.args))
        if isinstance(node, (ast.Name, ast.Attribute)):
            return 1 if base is None else self._read(ast.unparse(node), base)
        raise ValueError(f"{self.expression!r}: only whole numbers, dotted keys of the base config, + - * //, "
                         "max and min")

    def _read(self, dotted: str, base: dict) -> Any:
        value: Any = base
        for part in dotted.split("."):
            if not isinstance(value, dict) or part not in value:
                raise ConfigError(f"$from_base {self.expression!r}: the base config has no {dotted}")
            value = value[part]
        return value


def override_value(value: Any) -> Any:
    """A value of ``paper.yaml`` as the runner takes it: ``{$run: KEY}`` and ``{$from_base: ...}`` made into
    ``RunFolder`` and ``FromBase``, wherever they stand."""
    if isinstance(value, dict) and len(value) == 1 and next(iter(value)).startswith("$"):
        [(kind, argument)] = value.items()
        if kind == "$run" and isinstance(argument, str):
            return RunFolder(argument)
        if kind == "$from_base" and isinstance(argument, str):
            return FromBase(argument)
        raise ValueError(f"{kind}: expected $run: RUN_KEY or $from_base: EXPRESSION (text)")
    if isinstance(value, dict):
        return {key: override_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [override_value(item) for item in value]
    return value


class ArmFile(Section):
    label: str
    run: str
    metric: Metric = "acc"
    round: int | float | None = None
    to_fraction: float | None = None


# Each kind of test and the options it takes.
OPTIONS: dict[str, set[str]] = {"greater": {"by", "stat", "margin"}, "at_most": {"margin"},
                                "trend": {"text", "margin"}, "gap_trend": {"text", "margin"},
                                "gap_shrinks": {"margin"},
                                "contrast": {"text", "by", "stat", "margin", "subject", "unit"}}


class TestFile(Section):
    """One test, by its kind (exactly one of them), with that kind's options."""
    greater: tuple[str, str] | None = None  # a − b > by
    at_most: tuple[str, float] | None = None  # a < value
    trend: list[str] | None = None  # the slope over the arms, in order, > 0
    gap_trend: list[tuple[str, str]] | None = None  # the slope over the gaps a − b, in order, > 0
    gap_shrinks: tuple[tuple[str, str], tuple[str, str]] | None = None  # the first gap a − b is the larger
    contrast: dict[str, float] | None = None  # sum of coefficient x arm > by (text, subject and unit say what)
    text: str | None = None
    by: int | float = 0.0
    stat: Stat = "mean"
    margin: float = MARGIN
    subject: str = ""
    unit: str = ""

    @field_validator("by", mode="before")
    @classmethod
    def _a_number(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("expected a number")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> TestFile:
        kinds = [kind for kind in OPTIONS if getattr(self, kind) is not None]
        if len(kinds) != 1:
            raise ValueError(f"a test is exactly one of {', '.join(OPTIONS)} (got {', '.join(kinds) or 'none'})")
        unknown = sorted(self.model_fields_set - {kinds[0]} - OPTIONS[kinds[0]])
        if unknown:
            raise ValueError(f"{kinds[0]}: takes no {unknown[0]} (its options: {', '.join(sorted(OPTIONS[kinds[0]]))})")
        if self.contrast is not None and self.text is None:
            raise ValueError("contrast: a contrast needs its text")
        return self

    def test(self) -> Test:
        if self.greater is not None:
            return greater(*self.greater, by=self.by, stat=self.stat, margin=self.margin)
        if self.at_most is not None:
            return at_most(*self.at_most, margin=self.margin)
        if self.trend is not None:
            return trend(tuple(self.trend), self.text, self.margin)
        if self.gap_trend is not None:
            return gap_trend(tuple(self.gap_trend), self.text, self.margin)
        if self.gap_shrinks is not None:
            return gap_shrinks(*self.gap_shrinks, margin=self.margin)
        assert self.contrast is not None and self.text is not None
        return Test(self.text, tuple(self.contrast.items()), self.by, self.stat, self.margin, self.subject,
                    self.unit)


class ClaimFile(Section):
    title: str
    paper_says: str
    arms: list[ArmFile]
    tests: list[TestFile]
    regime: str
    paper_number: str = "-"
    explanation: str = ""
    peer_gap: str = ""
    seeds: int = 5
    counts: bool = True
    outside: str = ""
    at_settings: bool = True

    @model_validator(mode="after")
    def _tests_read_its_arms(self) -> ClaimFile:
        labels = [arm.label for arm in self.arms]
        for i, test in enumerate(self.tests):
            unknown = [label for label, _ in test.test().terms if label not in labels]
            if unknown:
                raise ValueError(f"tests.{i} reads {unknown[0]!r}, which is not an arm of the claim "
                                 f"({', '.join(labels)})")
        return self

    def claim(self, claim_id: str) -> Claim:
        return Claim(claim_id, self.title, self.paper_says, tuple(Arm(**arm.model_dump()) for arm in self.arms),
                     tuple(test.test() for test in self.tests), self.regime, self.paper_number, self.explanation,
                     self.peer_gap, self.seeds, self.counts, self.outside, self.at_settings)


class SettingFile(Section):
    suffix: str
    label: str
    overrides: dict[str, Any] = {}
    counts: bool = True


class PaperFile(Section):
    title: str
    bases: dict[str, str]  # scale -> base config, relative to fedsim/reproduce/configs/
    scale_notes: dict[str, str] = {}
    settings: dict[str, list[SettingFile]] = {}  # scale -> the settings the claims are read at
    # scale -> run key (or KEY* for every run key that starts so) -> overrides on top of the run's own
    scaled: dict[str, dict[str, dict[str, Any]]] = {}
    runs: dict[str, dict[str, Any]]
    page: Page = "reproduction"  # the page its verdicts are written to


def read_yaml(path: Path) -> Any:
    try:
        return strict_yaml.load(strict_yaml.read_text(path))
    except (OSError, YamlError) as err:
        raise ConfigError(f"{path}: {err}") from None


def passages(folder: Path) -> dict[str, str]:
    """The named passages of every Markdown file of a paper's folder (a name defined once among them)."""
    found: dict[str, str] = {}
    for path in sorted(folder.glob("*.md")):
        for name, text in file_passages(path).items():
            if name in found:
                raise ConfigError(f"{path}: passage {name!r} is also defined in another file of {folder.name}")
            found[name] = text
    return found


def file_passages(path: Path) -> dict[str, str]:
    """A Markdown file's named passages: each ``## name`` heading's text, HTML comments (where it was read from)
    dropped, its lines joined into paragraphs; what stands before the first heading says what the file is."""
    sections = re.split(r"^## +(\S+) *$", COMMENT.sub("", path.read_text()), flags=re.MULTILINE)
    return {name: "\n\n".join(" ".join(p.split("\n")) for p in re.split(r"\n\s*\n", body.strip()))
            for name, body in zip(sections[1::2], sections[2::2])}


def cited(value: Any, texts: dict[str, str], where: str) -> Any:
    """``value`` with every ``{{name}}`` in its text replaced by that passage (itself cited through)."""
    if isinstance(value, dict):
        return {key: cited(item, texts, f"{where}.{key}" if where else str(key)) for key, item in value.items()}
    if isinstance(value, list):
        return [cited(item, texts, f"{where}.{i}") for i, item in enumerate(value)]
    if not isinstance(value, str):
        return value

    def passage(match: re.Match) -> str:
        if match.group(1) not in texts:
            raise ConfigError(f"{where}: cites {{{{{match.group(1)}}}}}, which no Markdown file of the paper defines"
                              f" (defined: {', '.join(sorted(texts)) or 'none'})")
        return cited(texts[match.group(1)], texts, where)

    return CITED.sub(passage, value)


def checked(path: Path, model: type[Section], tree: Any, texts: dict[str, str], where: str = "") -> Any:
    """``tree`` (read from ``path``, at field ``where``) as ``model``, its passages cited in; an error is one line
    naming the file and the field."""
    try:
        return model.model_validate(cited(tree, texts, where))
    except ValidationError as err:
        raise ConfigError(f"{path}: {one_line(err, where)}") from None
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def one_line(err: ValidationError, where: str) -> str:
    """The first error of ``err``: the dotted field (under ``where``), what is wrong, and the value it got."""
    first = err.errors()[0]
    field = ".".join(str(part) for part in (where, *first["loc"]) if part != "")
    message = first["msg"].removeprefix("Value error, ")
    whole = isinstance(first.get("input"), dict)  # the section itself: a missing field, or a rule across fields
    got = "" if whole else f" (got {SHORT.repr(first.get('input'))})"
    return f"{field}: {message}{got}" if field else f"{message}{got}"


def overrides_of(path: Path, where: str, tree: dict[str, Any]) -> Overrides:
    try:
        return {key: override_value(value) for key, value in tree.items()}
    except (ValueError, SyntaxError) as err:
        raise ConfigError(f"{path}: {where}: {err}") from None


def scaled_runs(path: Path, scaled: dict[str, dict[str, Any]], runs: dict[str, Overrides]) -> dict[str, Overrides]:
    """``scaled``'s run keys, a trailing ``*`` standing for every run key that starts so, each checked."""
    out: dict[str, Overrides] = {}
    for pattern, overrides in scaled.items():
        keys = [k for k in runs if k.startswith(pattern[:-1])] if pattern.endswith("*") else [pattern]
        if not keys or not set(keys) <= set(runs):
            raise ConfigError(f"{path}: scaled.{pattern}: names no run of the paper")
        out |= {key: overrides_of(path, f"scaled.{pattern}", overrides) for key in keys}
    return out


def load_paper(key: str, folder: Path) -> Paper:
    """The paper ``key`` of ``folder``, every file checked."""
    texts = passages(folder)
    path = folder / "paper.yaml"
    spec: PaperFile = checked(path, PaperFile, read_yaml(path), texts)
    runs = {run: overrides_of(path, f"runs.{run}", value) for run, value in spec.runs.items()}
    settings = {scale: tuple(Setting(s.suffix, s.label, overrides_of(path, f"settings.{scale}", s.overrides), s.counts)
                             for s in chosen) for scale, chosen in spec.settings.items()}
    scaled = {scale: scaled_runs(path, value, runs) for scale, value in spec.scaled.items()}
    claims = load_claims(folder / "claims.yaml", texts, runs)
    try:
        return Paper(key, spec.title, spec.bases, runs, claims, spec.scale_notes, scaled, settings, spec.page)
    except ValueError as err:
        raise ConfigError(f"{path}: {err}") from None


def load_claims(path: Path, texts: dict[str, str], runs: dict[str, Overrides]) -> tuple[Claim, ...]:
    """``claims.yaml``: each claim by its id, in the file's order, every arm reading one of ``runs``."""
    tree = read_yaml(path)
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: the top level must map each claim's id to the claim")
    claims = tuple(checked(path, ClaimFile, value, texts, str(claim_id)).claim(str(claim_id))
                   for claim_id, value in tree.items())
    for claim in claims:
        for i, arm in enumerate(claim.arms):
            if arm.run not in runs:
                raise ConfigError(f"{path}: {claim.id}.arms.{i}.run: {arm.run!r} is not a run of paper.yaml")
    return claims


class IndexFile(Section):
    papers: list[str]


def load_papers(index: Path = PAPERS_DIR / "index.yaml") -> dict[str, Paper]:
    """Every paper ``index`` lists, by key, in its order (REPRODUCTION.md's)."""
    spec: IndexFile = checked(index, IndexFile, read_yaml(index), {})
    return {key: load_paper(key, index.parent / key) for key in spec.papers}
