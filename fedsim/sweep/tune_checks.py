"""What ``fedsim tune`` refuses before it draws a trial: a tuning of more runs or work than could finish, and a
searched key the runs would never read (a module's own optimizers ignore train.body / train.head)."""
from __future__ import annotations

from fedsim.config import Distribution, RunConfig, TuneConfig
from fedsim.errors import ConfigError
from fedsim.sweep.expand import Bounded, refuse_beyond_bounds

SHARED_KEYS = {"lr": ("train.body.lr", "train.head.lr"), "momentum": ("train.body.momentum", "train.head.momentum"),
               "local_epochs": ("train.local_epochs",)}


def refuse_endless_tuning(base: RunConfig, tune: TuneConfig) -> None:
    """Counted before any trial is drawn: tuning of more runs, or more work, than a sweep may have is refused with the
    count, naming the setting that makes most of it (``base``: a run at the tuning's rounds)."""
    methods = len(tune.methods)
    shared = tune.trials if tune.grid is None else len(tune.grid.step) * len(tune.grid.momentum)
    trials = shared + tune.own_trials  # at most: a method ignoring a shared setting runs fewer
    search, final = methods * trials * len(tune.seeds), methods * tune.final_seeds
    where = ("tune.final_seeds" if final > search else "tune.trials" if tune.grid is None else "tune.grid")
    counted = (f"{methods} methods x ({trials} trials x {len(tune.seeds)} seeds + {tune.final_seeds} final "
               "seeds)")
    refuse_beyond_bounds(base, search + final, Bounded(where, "tuning", counted, "tune fewer trials or seeds",
                                                       "tune fewer or shorter runs"))


OPTIMIZER_SETTINGS = ("optimizer", "lr", "momentum", "weight_decay")  # of train.body / train.head: fedsim's optimizers'


def refuse_unused_keys(client: str | None, space: dict[str, Distribution]) -> None:
    """A key the runs would not use is refused: every trial would train alike, and the table would report a choice
    that never ran. A module with its own configure_optimizers takes none of fedsim's optimizer settings
    (train.body / train.head give it only the round schedule, docs/lightning.md); ``model.client_args.<name>`` must
    be an argument of the module's ``__init__``."""
    from fedsim.models.lightning import class_overrides, load_client_class

    cls = load_client_class(client)
    _refuse_unknown_arguments(cls, space)
    if client is None or not class_overrides(cls, "configure_optimizers"):
        return
    for key in space:
        for dotted in SHARED_KEYS.get(key, (key,)):
            section, part, setting = (dotted.split(".") + ["", ""])[:3]
            if section == "train" and part in ("body", "head") and setting in OPTIMIZER_SETTINGS:
                raise ConfigError(f"tune.space.{key}: {client} makes its own optimizers in configure_optimizers, "
                                  f"which {dotted} (fedsim's own optimizers' setting) never reaches, so every trial "
                                  "would train alike; tune the module's own argument instead (e.g. "
                                  "tune.space: {model.client_args.lr: {loguniform: [0.0001, 0.1]}})")


def _refuse_unknown_arguments(cls: type, space: dict[str, Distribution]) -> None:
    """``model.client_args.<name>`` keys name arguments of the client module's ``__init__`` (one taking
    ``**kwargs`` takes any)."""
    import inspect

    prefix = "model.client_args."
    taken = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in taken.values()):
        return
    for key in space:
        name = key.removeprefix(prefix)
        if key.startswith(prefix) and name not in taken:
            arguments = ", ".join(taken)
            raise ConfigError(f"tune.space.{key}: {cls.__name__}.__init__ takes no {name!r} (it takes {arguments}); "
                              "tune one of its arguments")
