"""What a reproduction is made of: runs (overrides of one base config), arms (a run read through one
metric), and claims (a paper's statement plus the tests that decide it).

A test is a linear contrast of arm statistics, computed per seed (arms of one seed share the partition
and the initial weights, so the contrast is paired), then averaged over seeds with a 95% t-interval.
It *holds* when the whole interval lies above its threshold, *fails* when the whole interval lies below the
threshold (the opposite direction), shows *no effect ≥ margin* when the interval lies below the threshold plus
the test's equivalence margin otherwise (any effect there is smaller than the smallest the claim counts: neither
a confirmation nor a refutation), and is *inconclusive* otherwise, and always while fewer seeds have finished
than the claim fixes. A claim is reproduced when every test holds.

Each claim fixes its seeds (0..seeds-1) before it runs; they are never grown until a test clears."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

Overrides = dict[str, Any | Callable[[dict], Any]]  # dotted key -> value, or a function of the base config

# The equivalence margin, in accuracy points: a test "a − b > by" shows no effect ≥ margin when its interval lies
# below by + MARGIN (and fails when it lies below by).
# Why 2: (1) it is about the seed-to-seed spread of one run's client mean on the CPU settings. Over the 3-seed runs
# behind the last REPRODUCTION.md (reproduction/fedper-cpu.json and fedbabu-cpu.json: 44 arms, 32 paired tests)
# the standard deviation over seeds of an arm's client-mean accuracy has median 1.67 points (quartiles 1.1-2.6,
# range 0.2-5.1), and that of a paired test's contrast median 1.36 (quartiles 0.9-2.4, range 0.2-9.5): a
# difference under 2 points is within one seed's noise. (2) It is about the smallest gain the papers present as an
# improvement: both state their claims as directions in figures and tables, and the smallest effects fedsim's claims
# test (FedBABU's orthogonal head and FedPer's pre-fine-tuning, about 3 points here; K_P = 2 over 4, 3.7) are
# above it. An effect that is real but under 2 points can still hold (its interval above the threshold); one
# whose interval lies wholly below threshold + 2 (not wholly below the threshold) is no effect of 2 points or more.
MARGIN = 2.0
Stat = Literal["mean", "std"]


@dataclass(frozen=True)
class RunFolder:
    """An override value: the folder of another of the paper's runs at the same scale and seed, e.g. LG-FedAvg's
    ``model.init_from`` = its seed's FedAvg run, as the FedBABU authors' run_lg_fedavg.sh starts it. The runner plans
    that run first (seed-major, dependency first) and refuses to start this one until it has finished."""
    key: str  # a key of the paper's runs
Metric = Literal["acc", "acc_personalized"]
Page = Literal["reproduction", "privacy"]


@dataclass(frozen=True)
class Arm:
    """A run read through one metric. The report shows its final-round and best-round client mean; tests use
    the final round."""
    label: str
    run: str  # a key of the paper's runs
    metric: Metric = "acc"
    # A point on the run's curve instead of its final round, for claims about convergence speed (FedPer's Knowl 4):
    # the per-client accuracies of evaluation round ``round`` (an int), or of that fraction of the run's rounds (a
    # float in (0, 1), rounded up: 0.5 = halfway at any scale), from metrics.jsonl; the run must evaluate that round.
    round: int | float | None = None
    # Speed instead of level: per seed, the first evaluation round whose client mean reaches this fraction of the
    # run's own final client mean (one value, in rounds; the run must evaluate every round it counts).
    to_fraction: float | None = None


@dataclass(frozen=True)
class Test:
    """sum(coefficient x statistic of arm) > above, in accuracy points (points per step for a trend); ``stat``
    is the statistic of the per-client accuracies of a run: their mean, or their std (the spread across
    clients). ``margin``: the test fails when the interval lies wholly below above + margin. ``subject``: the
    contrast in words, for the report's "fails if" (the text's left side when empty); ``unit``: what one unit of
    the contrast is ("" = points); ``steps``: for a trend, the steps its margin is spread over (0 otherwise)."""
    text: str
    terms: tuple[tuple[str, float], ...]  # (arm label, coefficient)
    above: float = 0.0
    stat: Stat = "mean"
    margin: float = 0.0
    subject: str = ""
    unit: str = ""
    steps: int = 0

    @property
    def upper_bound(self) -> bool:
        """"a < value", computed as -a > -value (and shown as a's value)."""
        return all(coef < 0 for _, coef in self.terms)

    def fails_if(self) -> str:
        """What result would have failed this test (the opposite direction), and what would have shown no effect as
        large as the margin, in the test's own terms."""
        subject = self.subject or self.text.rsplit(" > ", 1)[0].rsplit(" < ", 1)[0]
        unit = f" {self.unit}" if self.unit else ""
        if self.upper_bound:
            bound = -self.above - self.margin
            fails = f"fails if the interval of {subject} lies above {-self.above:.3g}{unit}"
            return fails + (f"; no effect ≥ margin if it lies above {bound:.3g} ({-self.above:g} − margin "
                            f"{self.margin:g})" if self.margin else "")
        bound = self.above + self.margin
        margin = (f"margin {self.margin * self.steps:g} over {self.steps} step{'s' if self.steps > 1 else ''}"
                  if self.steps else f"margin {self.margin:.3g}")
        fails = f"fails if the interval of {subject} lies below {self.above:+.3g}{unit}"
        return fails + (f"; no effect ≥ margin if it lies below {bound:+.3g} ({self.above:g} + {margin})"
                        if self.margin else "")


def greater(a: str, b: str, by: float = 0.0, stat: Stat = "mean", margin: float = MARGIN) -> Test:
    """a - b > by points (``stat`` of both); fails when the interval of a - b lies below by + margin."""
    what = "client std of " if stat == "std" else ""
    return Test(f"{what}{a} − {what}{b} > {by:g}", ((a, 1.0), (b, -1.0)), by, stat, margin)


def at_most(a: str, value: float, margin: float = MARGIN) -> Test:
    """a < value points; fails when the interval of a lies above value - margin."""
    return Test(f"{a} < {value:g}", ((a, -1.0),), -value, margin=margin)


def gap_shrinks(wide: tuple[str, str], narrow: tuple[str, str], margin: float = MARGIN) -> Test:
    """(wide[0] - wide[1]) - (narrow[0] - narrow[1]) > 0: the first gap is the larger."""
    return Test(f"({wide[0]} − {wide[1]}) − ({narrow[0]} − {narrow[1]}) > 0",
                ((wide[0], 1.0), (wide[1], -1.0), (narrow[0], -1.0), (narrow[1], 1.0)), margin=margin)


def slope_coefficients(n: int) -> tuple[float, ...]:
    """The least-squares slope of n values on their ranks 0..n-1 as a linear contrast: sum_i c_i x_i with
    c_i = (i - mean) / sum_j (j - mean)^2 (so it is a paired contrast like any other test)."""
    if n < 2:
        raise ValueError("a trend needs at least two arms")
    mean = (n - 1) / 2
    ss = sum((i - mean) ** 2 for i in range(n))
    return tuple((i - mean) / ss for i in range(n))


def trend(labels: tuple[str, ...], text: str | None = None, margin: float = MARGIN) -> Test:
    """A monotone claim over ordered arms as one test: per seed, the least-squares slope of the arms' client mean
    on their rank (0, 1, ...), in points per step; holds when the interval of the mean slope lies above 0, fails
    when it lies below margin / (len(labels) - 1) per step (a total rise over the range below the margin)."""
    coefs = slope_coefficients(len(labels))
    per_step = margin / (len(labels) - 1)
    return Test(text or f"slope over {' → '.join(labels)} > 0 per step", tuple(zip(labels, coefs)), 0.0,
                margin=per_step, subject=f"the slope over {' → '.join(labels)}", unit="per step",
                steps=len(labels) - 1)


def gap_trend(gaps: tuple[tuple[str, str], ...], text: str | None = None, margin: float = MARGIN) -> Test:
    """``trend`` of the gaps a − b, each (a, b), ordered so the claim says they rise: the slope of the paired
    gaps on their rank, a linear contrast of the 2 x len(gaps) arms."""
    coefs = slope_coefficients(len(gaps))
    terms = tuple(term for (a, b), c in zip(gaps, coefs) for term in ((a, c), (b, -c)))
    names = " → ".join(f"({a} − {b})" for a, b in gaps)
    return Test(text or f"slope over {names} > 0 per step", terms, 0.0, margin=margin / (len(gaps) - 1),
                subject=f"the slope over {names}", unit="per step", steps=len(gaps) - 1)


@dataclass(frozen=True)
class Claim:
    id: str
    title: str
    paper_says: str  # the paper's statement, with its number where it gives one
    arms: tuple[Arm, ...]
    tests: tuple[Test, ...]
    regime: str  # what of the paper's setting this claim keeps, and what it cuts or changes
    paper_number: str = "-"  # the paper's or a named peer's figure (with its source) to set beside fedsim's
    explanation: str = ""  # why it does not reproduce here (regime, cut, or a real difference); shown when it does not
    # Where fedsim's level and the peer's number differ by more than the seed spread: the protocol differences that
    # could explain it, each said measured or not (or that the difference is unexplained); always shown.
    peer_gap: str = ""
    seeds: int = 5  # fixed before it runs: its verdict uses seeds 0..seeds-1, and is inconclusive until all finished
    counts: bool = True  # False: shown but outside the verdict count and the headline's tally (``outside`` says why)
    # Why a claim is outside the tally where it is not a smoke check: a setting the paper does not report, or a
    # verdict resting on fedsim's reading of a table it could not read.
    outside: str = ""
    # False: the claim is read at its declared runs only, never at the paper's other settings (``Paper.settings``):
    # its own setting is its point (App. F uncut at the authors' optimizer; App. D varies the momentum itself).
    at_settings: bool = True

    def arm(self, label: str) -> Arm:
        return next(a for a in self.arms if a.label == label)


@dataclass(frozen=True)
class Setting:
    """One setting a paper's claims are read at: every run of a claim again under ``run key + suffix``, with
    ``overrides`` on top of its own (e.g. the optimizer), and the claim's tests computed there. ``counts``: False
    for context, shown beside the counted settings and never deciding the verdict."""
    suffix: str  # "" = the runs as declared
    label: str
    overrides: Overrides = field(default_factory=dict)
    counts: bool = True


AS_DECLARED = Setting("", "as declared")


def at_setting(runs: dict[str, Overrides], keys: list[str], setting: Setting) -> dict[str, Overrides]:
    """The runs ``keys`` at ``setting``: each run's overrides, then the setting's, under key + suffix; a run that
    starts from another (``RunFolder``) starts from that run at the same setting."""
    def moved(value: Any) -> Any:
        return RunFolder(value.key + setting.suffix) if isinstance(value, RunFolder) else value

    return {key + setting.suffix: {**{k: moved(v) for k, v in runs[key].items()}, **setting.overrides}
            for key in keys}


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
    # scale -> the settings each claim (``at_settings``) is read at; a scale not named reads the runs as declared
    settings: dict[str, tuple[Setting, ...]] = field(default_factory=dict)
    # The page its verdicts are written to: REPRODUCTION.md's section ("reproduction") or docs/privacy.md's ("privacy")
    page: Page = "reproduction"

    def __post_init__(self) -> None:
        """The runs of every setting join ``runs`` (so each scale's configs are built and checked alike)."""
        varied = [arm.run for claim in self.claims if claim.at_settings for arm in claim.arms]
        keys = [key for key in self.runs if key in varied]
        extra = {key: value for settings in self.settings.values() for setting in settings if setting.suffix
                 for key, value in at_setting(self.runs, keys, setting).items()}
        taken = sorted(set(extra) & set(self.runs))
        if taken:  # a declared run would silently stand in for the run at that setting
            raise ValueError(f"{self.key}: run {taken[0]!r} is declared and also a run at a setting; rename one")
        object.__setattr__(self, "runs", {**self.runs, **extra})

    def settings_of(self, claim: Claim, scale: str) -> tuple[Setting, ...]:
        return self.settings.get(scale, (AS_DECLARED,)) if claim.at_settings else (AS_DECLARED,)

    def overrides(self, key: str, scale: str) -> Overrides:
        return {**self.runs[key], **self.scaled.get(scale, {}).get(key, {})}

    def claim(self, claim_id: str) -> Claim:
        for claim in self.claims:
            if claim.id == claim_id:
                return claim
        raise ValueError(f"--only: {self.key} has no claim {claim_id!r}; choose one of "
                         f"{[c.id for c in self.claims]}")

    def runs_of(self, claims: tuple[Claim, ...], scale: str) -> list[str]:
        """The runs these claims need at this scale (at each of their settings), each once, in the paper's order."""
        wanted = {arm.run + s.suffix for claim in claims for s in self.settings_of(claim, scale) for arm in claim.arms}
        return [key for key in self.runs if key in wanted]

    def seeds_of(self, claims: tuple[Claim, ...], scale: str, at_most: int | None = None) -> dict[str, int]:
        """Run key -> how many seeds (0..n-1) the claims reading it fix (the most of them), capped at ``at_most``."""
        seeds: dict[str, int] = {}
        for claim in claims:
            for key in (arm.run + s.suffix for s in self.settings_of(claim, scale) for arm in claim.arms):
                seeds[key] = max(seeds.get(key, 0), claim.seeds)
        return {key: min(n, at_most) if at_most is not None else n for key, n in seeds.items()}
