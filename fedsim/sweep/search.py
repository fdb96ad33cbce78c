"""The search every method gets with the same chance (``fedsim tune`` and the leaderboard), in two stages.

Stage 1, shared: the same settings for every method, each with the method's own parameters at their defaults (the
authors', so their setting is always a candidate): a grid over the effective step lr / (1 - momentum) and the
momentum (``tune.grid``), or ``tune.trials`` draws from the shared space on the tuner's shared stream. A method that
ignores a shared setting (``Algorithm.unused_settings``: Per-FedAvg and pFedMe take no momentum) runs it at its
neutral value, and the points that then coincide once: it is not given copies of one run as extra chances.

Stage 2, own: ``tune.own_trials`` settings at the method's stage-1 choice, of its own parameters (``tunable``),
distinct and other than the defaults, drawn from a stream of the method's own: independent of the shared draws (so no
own value is tied to a particular lr) and of every other method's. Where a method has fewer own settings than that
(or none), the step refined around its choice (x 2^-1/2, then x 2^1/2, ...) fills the stage, so every method gets the
same number of second-stage trials.

Why nested: a joint draw of shared and own values (the previous design) locked each own value to the lr drawn beside
it (FedRep's 10 head epochs met only three lr draws); a full factorial of every own value with every shared point
multiplies the budget by the largest own space and so is unequal. The choice of each stage is the trial with the
highest mean validation accuracy over the search seeds (``fedsim.sweep.tune.choose``)."""
from __future__ import annotations

import itertools
import zlib
from typing import Any

import numpy as np

from fedsim.algorithms import algorithm_class
from fedsim.config import Distribution, TuneConfig
from fedsim.sweep.expand import draw

TUNE_STREAM = 0x7E4E  # the tuner's shared draws: a stream of their own, apart from a run's and a sweep's
OWN_STREAM = 0x0A1E  # under TUNE_STREAM: each method's own parameters, keyed by the method's name
NEUTRAL = {"momentum": 0.0}  # what a shared setting a method ignores is set to
OWN_PREFIX = "algorithm."
REFINE = (2 ** -0.5, 2 ** 0.5)  # the step's refinement factors, nearest first; repeated outward as needed
DRAW_TRIES = 200  # draws of the own stream tried for distinct settings before counting a finite space exhausted


def trial_label(k: int, first: int) -> str:
    """Trial ``k`` as its runs are named: ``t<k>`` among stage 1's ``first`` trials, ``o<k - first>`` in stage 2."""
    return f"t{k}" if k < first else f"o{k - first}"


def _rounded(value: float) -> float:
    return float(f"{value:.6g}")  # the value a run trains with is the one its name and receipt show


def shared_trials(tune: TuneConfig, seed: int) -> list[dict[str, Any]]:
    """Stage 1's settings, the same for every method: the grid's points (step-major, each momentum at each step;
    the shared space's other keys drawn per point) or ``tune.trials`` draws of the shared space, from
    (seed, TUNE_STREAM, k)."""
    points: list[dict[str, Any]]
    if tune.grid is None:
        points = [{} for _ in range(tune.trials)]
    else:
        points = [{"lr": _rounded(step * (1 - m)), "momentum": m}
                  for step, m in itertools.product(tune.grid.step, tune.grid.momentum)]
    trials = []
    for k, point in enumerate(points):
        rng = np.random.default_rng([seed, TUNE_STREAM, k])
        trials.append({**point, **{key: draw(dist, rng) for key, dist in tune.space.items()}})
    return trials


def for_method(method: str, shared: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stage 1 as ``method`` runs it: the settings it ignores at their neutral value, each distinct point once (in
    first-seen order)."""
    unused = algorithm_class(method).unused_settings
    distinct: list[dict[str, Any]] = []
    for values in shared:
        used = {key: (NEUTRAL[key] if key in unused else value) for key, value in values.items()}
        if used not in distinct:
            distinct.append(used)
    return distinct


def own_space(method: str, fixed: dict[str, Any]) -> dict[str, Distribution]:
    """The method's own parameters that its entry does not fix, as search keys (``algorithm.<name>``)."""
    return {OWN_PREFIX + key: dist for key, dist in algorithm_class(method).tunable.items() if key not in fixed}


def own_stream(seed: int, method: str, k: int) -> np.random.Generator:
    """The method's own draws: keyed by its name (crc32, stable across processes), apart from the shared stream."""
    return np.random.default_rng([seed, TUNE_STREAM, OWN_STREAM, zlib.crc32(method.encode()), k])


def own_trials(seed: int, method: str, space: dict[str, Distribution], chosen: dict[str, Any],
               count: int) -> list[dict[str, Any]]:
    """Stage 2's ``count`` settings at the stage-1 choice ``chosen``: distinct own settings other than the
    defaults, from the method's own stream; the step refined around the choice fills what the own space lacks."""
    defaults = _defaults(method, space)
    drawn: list[dict[str, Any]] = []
    for k in range(DRAW_TRIES):
        if len(drawn) == count or not space:
            break
        rng = own_stream(seed, method, k)
        values = {key: draw(dist, rng) for key, dist in space.items()}
        if values != defaults and values not in drawn:
            drawn.append(values)
    trials = [{**chosen, **values} for values in drawn]
    return trials + refined_steps(chosen, count - len(trials))


def _defaults(method: str, space: dict[str, Distribution]) -> dict[str, Any]:
    params = algorithm_class(method).Params().model_dump(by_alias=True)
    return {key: params[key.removeprefix(OWN_PREFIX)] for key in space}


def refined_steps(chosen: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """``count`` settings at the choice with its lr scaled by the refinement factors, nearest first (none where the
    shared settings hold no lr: a module's own optimizer is tuned by its own arguments)."""
    if "lr" not in chosen or count <= 0:
        return []
    rings = [(1 + i // len(REFINE), REFINE[i % len(REFINE)]) for i in range(count)]
    return [{**chosen, "lr": _rounded(chosen["lr"] * factor ** ring)} for ring, factor in rings]
