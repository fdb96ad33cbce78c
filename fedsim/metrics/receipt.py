"""A comparison's receipt: what each arm of a table ran, read from its runs' stored configs (config.yaml), so that a
table never compares two arms without saying how each trained, what was scored, how the round was picked and over
which seeds; and which settings the arms differ in, so a difference besides the one a claim is about is named."""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedsim import safe_files, strict_yaml
from fedsim.algorithms import ALGORITHMS, Algorithm
from fedsim.config.fingerprint import LATER_DEFAULTS, flatten, result_settings
from fedsim.core import runfiles

RECEIPT = ("method", "optimizer", "lr", "momentum", "rounds", "local work", "scored", "round", "seeds")


def stored_config(run_dir: Path) -> dict:
    """A run folder's config.yaml as written ({} where it has none, or holds no mapping)."""
    path = Path(run_dir) / runfiles.CONFIG
    config = strict_yaml.load(safe_files.read_text(path)) if path.exists() else None
    return config if isinstance(config, dict) else {}


def _at(tree: dict, dotted: str, default: Any = None) -> Any:
    for key in dotted.split("."):
        if not isinstance(tree, dict) or key not in tree:
            return default
        tree = tree[key]
    return tree


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _parts(train: dict, key: str) -> str:
    """A training setting of body and head: one value where they agree."""
    body, head = _at(train, f"body.{key}", "?"), _at(train, f"head.{key}", "?")
    return _shown(body) if body == head else f"body {_shown(body)} / head {_shown(head)}"


def _method(config: dict) -> str:
    """The method and its parameters, those a run's config predates at the defaults it ran with (``_filled``), so two
    arms that ran alike read alike."""
    algorithm, _ = _filled(config.get("algorithm", "?"))
    if not isinstance(algorithm, dict):
        return str(algorithm)
    params = ", ".join(f"{k} {v}" for k, v in algorithm.items() if k != "name")
    return f"{algorithm.get('name', '?')}" + (f" ({params})" if params else "")


def _lr(train: dict) -> str:
    schedules = {_at(train, f"{part}.schedule", "constant") for part in ("body", "head")}
    return _parts(train, "lr") + ("" if schedules == {"constant"} else f", {'/'.join(sorted(schedules))} schedule")


def _local_work(config: dict) -> str:
    train = config.get("train", {})
    return (f"{_at(train, 'local_epochs', '?')} epoch(s) of batch {_at(train, 'batch_size', '?')}, "
            f"f = {_shown(_at(train, 'fraction', '?'))}")


def scored(config: dict, metric: str) -> str:
    """What an accuracy of a run of ``config`` scores: the model each client holds, or that model personalized as
    its eval section says."""
    if metric == "acc":
        return "initial (the model each client holds)"
    evaluation = config.get("eval", {})
    if evaluation.get("personalize") == "own_update":
        return "personalized: the method's own client update"
    lr = evaluation.get("finetune_lr")
    return (f"personalized: fine-tuned {evaluation.get('finetune_epochs', '?')} epoch(s) of "
            f"{evaluation.get('finetune_part', '?')} at {'train' if lr is None else _shown(lr)} lr, "
            f"momentum {_shown(evaluation.get('finetune_momentum', '?'))}")


def picked(config: dict, at: str = "final") -> str:
    """How an arm's round was picked: ``at`` (the final round, or a point of the curve), and what its best round
    was picked on."""
    best = ("best round on validation" if _at(config, "data.validation", 0) else
            "best round on test, shown as PFLlib reports it, not a selection")
    return f"{at}; {best}"


# A line of the optimizers a run set up (fedsim.models.lightning.describe_optimizers, summary.json's "optimizers"):
# "body: Adam (optimizer 0, group 0, 4 tensors): lr 0.01, betas (0.9, 0.999), eps 1e-08, weight_decay 0".
OPTIMIZER_LINE = re.compile(r"^(?P<parts>[\w+]+): (?P<kind>\w+) \([^)]*\): (?P<settings>.*)$")


def ran_optimizers(lines: list[str], train: dict) -> dict[str, str]:
    """The receipt's optimizer, lr (with train's round schedule, which scales every optimizer's rates) and momentum
    as the run's optimizers were set up, per part where the parts differ."""
    rows = [m.groupdict() for line in lines if (m := OPTIMIZER_LINE.match(line))]

    def per_part(value: Callable[[dict[str, str]], str]) -> str:
        shown = {row["parts"]: value(row) for row in rows}
        return next(iter(shown.values())) if len(set(shown.values())) == 1 else " / ".join(
            f"{parts} {v}" for parts, v in shown.items())

    def setting(name: str) -> Callable[[dict[str, str]], str]:
        def value(row: dict[str, str]) -> str:  # Adam's momentum is its betas
            found = re.search(rf"\b{name} ([^,]+)", row["settings"]) or re.search(r"\b(betas \([^)]*\))",
                                                                                   row["settings"])
            return found.group(1) if found else "-"
        return value

    lr = per_part(setting("lr"))
    schedules = {_at(train, f"{part}.schedule", "constant") for part in ("body", "head")}
    return {"optimizer": per_part(lambda row: row["kind"]),
            "lr": lr + ("" if schedules == {"constant"} else f", {'/'.join(sorted(schedules))} schedule"),
            "momentum": per_part(setting("momentum"))}


def receipt(configs: list[dict], metrics: list[str], at: str = "final",
            optimizers: list[str] | None = None) -> dict[str, str]:
    """An arm's receipt from the stored configs of its seeds (which share every other setting); ``metrics``: the
    accuracies its table shows; ``optimizers``: the optimizers its runs set up (summary.json's), which replace the
    config's train.body / train.head where given (a module's own configure_optimizers does not read those)."""
    first = configs[0] if configs else {}
    train = first.get("train", {})
    seeds = sorted(c["seed"] for c in configs if isinstance(c.get("seed"), int))
    trained = (ran_optimizers(optimizers, train) if optimizers else
               {"optimizer": _parts(train, "optimizer"), "lr": _lr(train), "momentum": _parts(train, "momentum")})
    trained |= {key: "not used by the method" for key in _unused_settings(first) if key in trained}
    return {"method": _method(first), **trained, "rounds": str(_at(train, "rounds", "?")),
            "local work": _local_work(first), "scored": "; ".join(scored(first, m) for m in metrics),
            "round": picked(first, at),
            "seeds": ", ".join(map(str, seeds)) or "-"}


def _unused_settings(config: dict) -> frozenset[str]:
    """The shared settings the run's built-in method never reads (Per-FedAvg's and pFedMe's momentum): a receipt
    shows no value the training did not use."""
    method = _builtin_method(config.get("algorithm"))
    return method.unused_settings if method is not None else frozenset()


def _builtin_method(section: Any) -> type[Algorithm] | None:
    """The built-in method a stored algorithm section names (None for a plug-in's: never imported to read it)."""
    name = section.get("name") if isinstance(section, dict) else None
    return ALGORITHMS.get(name) if isinstance(name, str) else None


def _filled(section: Any) -> tuple[Any, bool]:
    """A stored algorithm section with its built-in method's parameters that it lacks at their defaults, as
    validating it fills them (what a resume of that run reads: ``runfiles.compare_stored``; a parameter added to a
    method after a run was written is absent from its config.yaml, and the run ran at its default); and whether they
    were filled, so every parameter the method has is there. A plug-in method's stay as written: a run folder is
    input, and the code it names is never imported to read it."""
    method = _builtin_method(section)
    if method is None or not isinstance(section, dict):
        return section, False
    try:
        params = method.Params.model_validate({k: v for k, v in section.items() if k != "name"})
    except ValueError:  # pydantic's ValidationError: parameters no longer valid, kept as written
        return section, False
    return {"name": section["name"], **params.model_dump(by_alias=True)}, True


def _settings(config: dict) -> tuple[dict[str, object], bool]:
    """A stored config's result settings as dotted keys, its method's parameters filled (``_filled``), and whether
    they were."""
    section, filled = _filled(config.get("algorithm"))
    if filled:
        config = {**config, "algorithm": section}
    return flatten(result_settings({**config, "engine": config.get("engine", {})})), filled


def receipt_table(arms: list[tuple[str, dict[str, str]]]) -> list[str]:
    """Markdown: one row per (label, receipt)."""
    return ["| arm | " + " | ".join(RECEIPT) + " |", "|" + "---|" * (len(RECEIPT) + 1),
            *(f"| {label} | " + " | ".join(r.get(key, "-") for key in RECEIPT) + " |" for label, r in arms)]


def differences(configs: list[dict]) -> list[str]:
    """The settings that change results (``result_settings``) whose values differ between the arms' configs, seed
    aside: what a comparison of these arms is also about. A setting a run's config predates reads as its legacy
    default (``LATER_DEFAULTS``), and a method parameter as the method's default, the values that run ran with, so
    an older arm does not seem to differ in it. A method's parameter is compared between the arms whose method has
    it: an arm of a method without it differs in algorithm.name, which is named."""
    arms = [_settings(c) for c in configs]
    keys = sorted(set().union(*(flat for flat, _ in arms)) - {"seed"}) if arms else []

    def values(key: str) -> set[str]:  # an arm whose method's parameters are all there and lack this one has none
        return {repr(flat.get(key, LATER_DEFAULTS.get(key))) for flat, filled in arms
                if key in flat or not (filled and key.startswith("algorithm."))}

    return [k for k in keys if len(values(k)) > 1]
