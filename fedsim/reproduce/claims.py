"""What a reproduction is made of: runs (overrides of one base config), arms (a run read through one
metric), and claims (a paper's statement plus the tests that decide it).

A test is a linear contrast of arm statistics, computed per seed (arms of one seed share the partition
and the initial weights, so the contrast is paired), then averaged over seeds with a 95% t-interval:
it *holds* when the whole interval lies above its threshold, *fails* when the whole interval lies
below, and is *inconclusive* otherwise. A claim is reproduced when every test holds."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

Overrides = dict[str, Any | Callable[[dict], Any]]  # dotted key -> value, or a function of the base config


@dataclass(frozen=True)
class RunFolder:
    """An override value: the folder of another of the paper's runs at the same scale and seed, e.g. LG-FedAvg's
    ``model.init_from`` = its seed's FedAvg run, as the FedBABU authors' run_lg_fedavg.sh starts it. The runner plans
    that run first (seed-major, dependency first) and refuses to start this one until it has finished."""
    key: str  # a key of the paper's runs
Metric = Literal["acc", "acc_personalized"]


@dataclass(frozen=True)
class Arm:
    label: str
    run: str  # a key of the paper's runs
    metric: Metric = "acc"


@dataclass(frozen=True)
class Test:
    """sum(coefficient x statistic of arm) > above, in accuracy points; ``stat`` is the statistic of the
    per-client accuracies of a run: their mean, or their std (the spread across clients)."""
    text: str
    terms: tuple[tuple[str, float], ...]  # (arm label, coefficient)
    above: float = 0.0
    stat: Literal["mean", "std"] = "mean"


def greater(a: str, b: str, by: float = 0.0, stat: Literal["mean", "std"] = "mean") -> Test:
    """a - b > by points (``stat`` of both)."""
    what = "client std of " if stat == "std" else ""
    return Test(f"{what}{a} − {what}{b} > {by:g}", ((a, 1.0), (b, -1.0)), by, stat)


def at_most(a: str, value: float) -> Test:
    """a < value points."""
    return Test(f"{a} < {value:g}", ((a, -1.0),), -value)


def gap_shrinks(wide: tuple[str, str], narrow: tuple[str, str]) -> Test:
    """(wide[0] - wide[1]) - (narrow[0] - narrow[1]) > 0: the first gap is the larger."""
    return Test(f"({wide[0]} − {wide[1]}) − ({narrow[0]} − {narrow[1]}) > 0",
                ((wide[0], 1.0), (wide[1], -1.0), (narrow[0], -1.0), (narrow[1], 1.0)))


@dataclass(frozen=True)
class Claim:
    id: str
    title: str
    paper_says: str  # the paper's statement, with its number where it gives one
    arms: tuple[Arm, ...]
    tests: tuple[Test, ...]
    regime: str  # what of the paper's setting this claim keeps, and what it cuts or changes
    paper_number: str = "-"  # the paper's own figure for the headline table, where it gives one
    explanation: str = ""  # why it does not reproduce here (regime, cut, or a real difference); shown when it does not

    def arm(self, label: str) -> Arm:
        return next(a for a in self.arms if a.label == label)


@dataclass(frozen=True)
class Paper:
    key: str
    title: str
    bases: dict[str, str]  # scale -> base config, relative to fedsim/reproduce/configs/
    runs: dict[str, Overrides]
    claims: tuple[Claim, ...]
    scale_notes: dict[str, str] = field(default_factory=dict)  # scale -> what that scale cuts from the paper
    # scale -> run key -> overrides on top of the run's own, for a run whose setting is not the scale's base
    # (the PFLlib cross-check keeps its own clients and model at every scale)
    scaled: dict[str, dict[str, Overrides]] = field(default_factory=dict)

    def overrides(self, key: str, scale: str) -> Overrides:
        return {**self.runs[key], **self.scaled.get(scale, {}).get(key, {})}

    def claim(self, claim_id: str) -> Claim:
        for claim in self.claims:
            if claim.id == claim_id:
                return claim
        raise ValueError(f"--only: {self.key} has no claim {claim_id!r}; choose one of "
                         f"{[c.id for c in self.claims]}")

    def runs_of(self, claims: tuple[Claim, ...]) -> list[str]:
        """The runs these claims need, each once, in the order the paper lists them."""
        wanted = {arm.run for claim in claims for arm in claim.arms}
        return [key for key in self.runs if key in wanted]
