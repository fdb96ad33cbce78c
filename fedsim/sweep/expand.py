"""A config's ``sweep`` section expanded into its runs: every combination of the listed values (the grid), crossed
with ``search.samples`` draws of its distributions, each run validated and named by its values."""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedsim.config import Distribution, RunConfig, set_dotted, validate
from fedsim.config.checks import MAX_CLIENT_EPOCHS, client_epochs
from fedsim.errors import ConfigError

SWEEP_STREAM = 0x5EE9  # the sweep's draws: a stream of their own, apart from every random choice of a run
# Every run of a sweep is validated and named before the first starts (0.57 ms each, measured), then started with
# workers of its own (seconds each): 100,000 runs are a minute of expansion and days of start-ups alone.
MAX_RUNS = 100_000


def expand_sweep(tree: dict[str, Any]) -> list[RunConfig]:
    """One validated config per run of the sweep: every combination of the listed values (the grid), crossed
    with ``search.samples`` draws of the distributions, each with its own run name (its values in order)."""
    base = validate(tree)  # validate once as written so errors name the user's keys
    if not base.sweep:
        return [base]
    grid = {k: v for k, v in base.sweep.items() if isinstance(v, list)}
    drawn = {k: v for k, v in base.sweep.items() if isinstance(v, Distribution)}
    _refuse_empty_search(grid, drawn, base.search.samples)
    _refuse_repeated_values(grid)
    _refuse_endless(base, grid, drawn)
    runs = []
    for sample in range(base.search.samples if drawn else 1):
        rng = np.random.default_rng([base.seed, SWEEP_STREAM, sample])
        draws = {key: draw(dist, rng) for key, dist in drawn.items()}
        for values in itertools.product(*grid.values()):
            chosen = {**dict(zip(grid, values)), **draws}
            runs.append(_variant(tree, base, [(key, chosen[key]) for key in base.sweep]))
    names = [run.name for run in runs]
    if len(set(names)) < len(names):
        twice = next(name for name in names if names.count(name) > 1)
        if not drawn:  # listed values that differ but read the same in a name (0.1 and '0.1', 'a b' and 'a_b')
            raise ConfigError(f"sweep: two of the listed values give the same run name ({twice}); list values that "
                              "differ as text")
        raise ConfigError(f"search.samples: two draws gave the same values ({twice}); widen the distributions or "
                          "lower search.samples")
    return runs


def draw(dist: Distribution, rng: np.random.Generator) -> Any:
    """One value of ``dist`` from ``rng``; floats kept to 6 significant digits, so the value a run trains with is
    the one its name shows."""
    kind, bounds = dist.kind, dist.bounds
    if kind == "choice":
        return bounds[int(rng.integers(len(bounds)))]
    if kind == "randint":
        return int(rng.integers(bounds[0], bounds[1]))
    value = (math.exp(rng.uniform(math.log(bounds[0]), math.log(bounds[1]))) if kind == "loguniform"
             else rng.uniform(bounds[0], bounds[1]))
    return float(f"{value:.6g}")


def _refuse_empty_search(grid: dict[str, list], drawn: dict[str, Distribution], samples: int) -> None:
    for key, values in grid.items():
        if not values:
            raise ConfigError(f"sweep.{key}: an empty list gives no runs; list at least one value, or remove the key")
    if samples > 1 and not drawn:
        raise ConfigError(f"search.samples: {samples} samples of a sweep without distributions would repeat the same "
                          "runs (a run is deterministic); add a distribution ({uniform: [lo, hi]}, ...) or list seeds "
                          "under sweep.seed")


def _refuse_repeated_values(grid: dict[str, list]) -> None:
    """A value listed twice would run the same run twice under one name (a seed listed twice: the same seed)."""
    for key, values in grid.items():
        for i, value in enumerate(values):
            if value in values[:i]:
                raise ConfigError(f"sweep.{key}: {value!r} is listed twice; list each value once")


def _refuse_endless(base: RunConfig, grid: dict[str, list], drawn: dict[str, Distribution]) -> None:
    """Counted before any run is built: a sweep of more runs, or more work, than could ever finish is refused with
    the count (each run's work as the base config's; a variant asking for more is refused as it is validated)."""
    samples = base.search.samples if drawn else 1
    runs = samples * math.prod(len(values) for values in grid.values())
    counted = " x ".join([*(f"{len(values)} sweep.{key}" for key, values in grid.items()),
                          *([f"search.samples {samples}"] if drawn else [])])
    where = "search.samples" if drawn and samples > runs // samples else "sweep"
    refuse_beyond_bounds(base, runs, Bounded(where, "sweep", counted, "split it, or list fewer values",
                                             "run fewer or shorter runs"))


@dataclass(frozen=True)
class Bounded:
    """What :func:`refuse_beyond_bounds` names: the setting that makes most of the runs, what they are (a sweep, a
    tuning), how they were counted, and the fix for too many runs and for too much work."""
    where: str
    what: str
    counted: str
    fewer: str
    shorter: str


def refuse_beyond_bounds(base: RunConfig, runs: int, bounded: Bounded) -> None:
    """Refuse ``runs`` runs of ``base``'s work when they are more than a sweep can expand, or more work than any could
    finish (counted before a run is built or a trial drawn: a billion of them would not end)."""
    b = bounded
    if runs > MAX_RUNS:
        raise ConfigError(f"{b.where}: the {b.what} has {runs:,} runs ({b.counted}), more than the {MAX_RUNS:,} a sweep "
                          f"can expand; {b.fewer}")
    work = runs * sum(client_epochs(base))
    if work > MAX_CLIENT_EPOCHS:
        raise ConfigError(f"{b.where}: the {b.what}'s {runs:,} runs ({b.counted}) ask for about {work:.3g} "
                          f"client-epochs, past the {MAX_CLIENT_EPOCHS:.0e} any sweep could finish; {b.shorter}")


def _variant(tree: dict[str, Any], base: RunConfig, chosen: list[tuple[str, Any]]) -> RunConfig:
    """The run of the sweep with the ``chosen`` values, named by them (and grouped in W&B without its seed)."""
    variant = {k: v for k, v in tree.items() if k not in ("sweep", "search")}
    for key, value in chosen:
        set_dotted(variant, key, value)
    labels = [(key, re.sub(r"[^A-Za-z0-9_.-]+", "_", _label(value))) for key, value in chosen]
    variant["name"] = "-".join([base.name, *(label for _, label in labels)])
    if base.logging.wandb.group is None:  # a variant's seeds form one W&B group (averaged there), methods never
        set_dotted(variant, "logging.wandb.group", "-".join([base.name, *(label for key, label in labels if key != "seed")]))
    try:
        return validate(variant)
    except ConfigError as err:
        raise ConfigError(f"sweep: {err} (in the run {variant['name']})") from None


def _label(value: Any) -> str:
    """A sweep value in a run name: an algorithm given as a mapping is named by its name."""
    return str(value["name"]) if isinstance(value, dict) and "name" in value else str(value)

