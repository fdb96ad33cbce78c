"""Every rule that ties two sections of a run's config together, in one place. :func:`fedsim.config.validate`
runs them once each section is valid, before any data loads, so ``--dry-run``, a run, each sweep variant and a
resumed run's stored config are held to the same rules (what they ask of the population is counted from
data.num_clients, which every partition has). A rule that needs the data, a trace file, the built model or the Ray
cluster stays with what reads it (``fedsim.plan.build``, ``fedsim.plan.devices``, ``fedsim.engine.session``).

This is the config package's one import from a layer above (``fedsim.algorithms``): a method's own parameters
and what it supports are its class's. Imported where used, as ``fedsim.algorithms`` imports config sections."""
from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from pydantic import ValidationError

from fedsim.config.base import format_error
from fedsim.config.privacy import MAX_ACCOUNTED_ROUNDS, default_delta
from fedsim.config.schema import RunConfig
from fedsim.errors import ConfigError

if TYPE_CHECKING:
    from fedsim.algorithms import Algorithm


def check_sections(cfg: RunConfig) -> None:
    """Refuse a config whose sections disagree with one line naming the field and the fix. Fills in the
    method's parameters with their defaults, so config.yaml and checkpoints say exactly what ran."""
    method = method_with_its_parameters(cfg)
    if cfg.server.aggregator != "mean" and method.aggregation == "replies":
        raise ConfigError(f"server.aggregator: {cfg.algorithm.name} combines its clients' replies itself; robust "
                          "rules replace the mean of the FedAvg family's methods; leave server.aggregator: mean")
    if cfg.logging.wandb.x_axis == "sim_time" and cfg.system.devices is None:
        raise ConfigError("logging.wandb.x_axis: sim_time needs the virtual clock; set system.devices (e.g. "
                          "system.devices.preset=uniform) or x_axis=round")
    if cfg.model.precision == "16-mixed" and not cfg.engine.gpus_per_worker:
        raise ConfigError("model.precision: 16-mixed needs a GPU (engine.gpus_per_worker > 0); use bf16-mixed on a CPU")
    if cfg.system.mode == "async":
        check_asynchronous(cfg, method)
    if method.own_objective and cfg.model.client:
        # A method with an objective of its own runs the network's forward, not the module's training_step.
        raise ConfigError(f"algorithm.name: {method.name} trains with its own objective ({method.own_objective}) "
                          f"on the network's forward, which would bypass model.client {cfg.model.client}'s "
                          "training_step; use the built-in client (unset model.client) or a method that trains "
                          "through the module")
    if cfg.privacy is not None:
        check_privacy(cfg, method)
    check_accounting(cfg)
    check_population(cfg)
    check_work(cfg)
    if cfg.tune is not None:
        check_tuning(cfg)


def check_privacy(cfg: RunConfig, method: type[Algorithm]) -> None:
    """DP and secure aggregation act on the exact sum of the clients' shared weights: a method whose server takes
    that mean, under the mean rule (a robust rule sees every reply, which neither protects)."""
    from fedsim.algorithms import WEIGHTS
    what = "secure aggregation" if cfg.privacy is not None and cfg.privacy.dp == "none" else "privacy.dp"
    if method.aggregation != "sums" or set(method.uploads) != {WEIGHTS} or method.share == "none":
        raise ConfigError(f"privacy: {what} protects the mean of the clients' shared weights, and "
                          f"{cfg.algorithm.name}'s server does not take one (it "
                          f"{_what_the_server_takes(method)}); "
                          "choose a method of the FedAvg family (e.g. fedavg, fedper, fedbabu, ditto) or remove privacy")
    if cfg.server.aggregator != "mean":
        raise ConfigError(f"server.aggregator: {cfg.server.aggregator} sees every client's reply, which {what} "
                          "does not allow; set server.aggregator: mean")
    if cfg.privacy is not None and cfg.privacy.dp != "none":
        check_user_level_dp(cfg, method)


def check_user_level_dp(cfg: RunConfig, method: type[Algorithm]) -> None:
    """What DP's guarantee needs of the run (fedsim.privacy.mechanism): equal weights (a client's weight bounds how far
    it moves the mean), synchronous rounds, and adaptive clipping only where the server adds the noise."""
    from fedsim.algorithms import WEIGHTS
    assert cfg.privacy is not None
    if (method.uploads[WEIGHTS] or cfg.train.weighting) != "uniform":
        raise ConfigError("train.weighting: samples lets a client's sample count scale its update, which privacy.dp's "
                          "clip norm does not bound; set train.weighting: uniform")
    if cfg.system.mode == "async":
        raise ConfigError("system.mode: async steps on stale updates, which privacy.dp does not account; use mode sync")
    if cfg.model.batchnorm == "averaged":
        raise ConfigError("model.batchnorm: averaged puts BatchNorm's running statistics into the clipped, noised "
                          "update (they would dominate its norm, and a noised variance can turn negative); leave "
                          "model.batchnorm unset (under DP: local_statistics) or set personal or batch_stats")
    if cfg.privacy.dp == "local" and cfg.privacy.adaptive is not None:
        raise ConfigError("privacy.adaptive: adaptive clipping steers the clip norm by a count the server noises, "
                          "which local DP has not; remove privacy.adaptive or set privacy.dp: central")


def check_accounting(cfg: RunConfig) -> None:
    """What the accountant can state (fedsim.privacy.accountant): who takes part must be the sampler's draw alone.
    The virtual clock picks participants itself (availability, deadlines, dropouts: they depend on each device's
    trace and speed, not only on the seed's draw), so neither Poisson sampling nor DP runs on it: the sampling rate
    an accountant would read is not the one the run has. dp-accounting's PLD has no fixed-size event."""
    if cfg.system.devices is not None and cfg.train.sampling == "poisson":
        raise ConfigError("train.sampling: poisson draws who takes part, and the virtual clock (system.devices) "
                          "picks participants itself; set train.sampling: fixed or remove system.devices")
    p = cfg.privacy
    if p is None or p.dp == "none":
        return
    if cfg.system.devices is not None:
        raise ConfigError("privacy.dp: the virtual clock (system.devices) decides who takes part by availability, "
                          "deadlines and dropouts, which no accountant's sampling describes, so epsilon could not be "
                          "stated; remove system.devices, or set privacy.dp: none")
    if p.dp == "central" and p.accountant == "pld" and cfg.train.sampling == "fixed":
        raise ConfigError("privacy.accountant: pld has no accounting for fixed-size sampling without replacement "
                          "(dp-accounting's PLD accountant lacks that event); set train.sampling: poisson or "
                          "privacy.accountant: rdp")
    check_guarantee_not_vacuous(cfg)
    most = MAX_ACCOUNTED_ROUNDS[p.accountant]
    if cfg.train.rounds > most:
        raise ConfigError(f"train.rounds: {cfg.train.rounds:,} rounds under privacy.accountant {p.accountant}, past the "
                          f"{most:,} whose epsilon after each round it computes in bounded time; lower train.rounds"
                          + (" or use privacy.accountant: rdp (up to "
                             f"{MAX_ACCOUNTED_ROUNDS['rdp']:,} rounds)" if p.accountant == "pld" else ""))
    if cfg.train.on_nonfinite == "drop" and not (p.dp == "central" and cfg.train.sampling == "poisson"):
        # Central DP under Poisson sampling divides by the public q x N: a dropped client's update counts as zero,
        # which is within the clip ball, so the mechanism is the one accounted. Under fixed-size sampling the
        # mean's denominator (the kept clients) would depend on a client's data; under local DP a client's
        # release would be its noised update or a visible "dropped", which no Gaussian mechanism describes.
        where = "local DP" if p.dp == "local" else "fixed-size sampling"
        raise ConfigError(f"train.on_nonfinite: drop makes whether a client's update counts depend on its data, which "
                          f"the accountant does not model under {where}; set train.on_nonfinite: stop"
                          + (" or train.sampling: poisson" if p.dp == "central" else ""))


def trainable_clients(cfg: RunConfig) -> int:
    """The clients that may train: data.num_clients less those eval.unseen holds out."""
    return cfg.data.num_clients - cfg.eval.held_out(cfg.data.num_clients)


def check_guarantee_not_vacuous(cfg: RunConfig) -> None:
    """A guarantee over one client, or with delta >= 1/N (the mechanism may then expose some client's data
    outright), says nothing; both are refused rather than printed as an epsilon."""
    p = cfg.privacy
    assert p is not None
    trainable = trainable_clients(cfg)
    if trainable < 2:
        raise ConfigError(f"privacy.dp: {trainable} client may train (data.num_clients less eval.unseen), and DP over "
                          "one client protects nobody from anybody; let at least 2 clients train or remove privacy")
    if p.delta is not None and p.delta >= 1 / trainable:
        raise ConfigError(f"privacy.delta: {p.delta:g} is at least 1/N = {1 / trainable:.3g} for the {trainable} "
                          "clients that may train, so the guarantee allows one client's data to leak whole; set it "
                          f"well below 1/N (e.g. {default_delta(trainable):.3g}) or leave it null")


def _what_the_server_takes(method: type[Algorithm]) -> str:
    if method.share == "none":
        return "shares nothing"
    if method.aggregation != "sums":
        return "combines its clients' replies itself"
    return "uploads " + ", ".join(method.uploads)


def check_tuning(cfg: RunConfig) -> None:
    """``fedsim tune`` selects on the validation split only, and draws its own runs (no sweep beside it)."""
    if not cfg.data.validation:
        raise ConfigError("data.validation: fedsim tune chooses each method's settings on the validation split, and "
                          "this config has none; set data.validation (e.g. 0.1)")
    if cfg.sweep:
        raise ConfigError("sweep: fedsim tune draws its own runs from tune (methods, trials, seeds, space); remove "
                          "the sweep section, or run `fedsim sweep` on a copy without tune")


def method_with_its_parameters(cfg: RunConfig) -> type[Algorithm]:
    """The class of ``algorithm.name``, its parameters validated by its ``Params`` and stored back with their
    defaults filled in."""
    from fedsim.algorithms import algorithm_class

    try:
        method = algorithm_class(cfg.algorithm.name)
        params = method.Params.model_validate(cfg.algorithm.params)
    except ValidationError as err:
        line = format_error(err, prefix="algorithm", model=method.Params)
        raise ConfigError(_named(f"{cfg.algorithm.name}: {line}")) from None
    except ValueError as err:
        raise ConfigError(_named(str(err))) from None
    cfg.algorithm.__pydantic_extra__ = params.model_dump(by_alias=True)
    return method


def _named(message: str) -> str:
    """As validation words a config-wide message: as is when it names its field (``key: ...``)."""
    return message if re.match(r"^[\w.]+: ", message) else f"config: {message}"


def check_asynchronous(cfg: RunConfig, method: type[Algorithm]) -> None:
    """system.mode=async applies FedBuff's step to the global weights: a method must send and receive only them
    and leave the server's update as the plain average, which takes the mean of the replies."""
    if not steps_asynchronously(method):
        raise ConfigError(f"system.mode: async applies FedBuff's step to the weights alone; {method.name} also "
                          "sends or keeps server state of its own (or its own server update); use a method of the "
                          f"FedAvg family ({', '.join(asynchronous_methods())}) or mode sync")
    if cfg.server.aggregator != "mean":
        raise ConfigError(f"server.aggregator: {cfg.server.aggregator} needs the round's replies together; FedBuff's "
                          "steps (system.mode=async) take the mean; use mode sync or aggregator mean")


def check_population(cfg: RunConfig) -> None:
    """What the sections ask of the run's data.num_clients: eval.unseen leaves clients to train; FedBuff's buffer
    and clients at once fit those that train (a client reports at most once per step); the method's parameters
    (IFCA's clusters) and Krum's replies per round, counted at f x N (dropped or late clients can still leave a
    round short, which then fails naming the fix)."""
    from fedsim.algorithms import build_algorithm

    num_clients, unseen = cfg.data.num_clients, cfg.eval.unseen
    held_out = cfg.eval.held_out(num_clients)
    if unseen is not None and not 1 <= held_out < num_clients:
        raise ConfigError(f"eval.unseen: {unseen} holds out {held_out} of the {num_clients} clients; hold out at least "
                          "one and leave at least one to train")
    trainable = trainable_clients(cfg)
    for key in ("async_buffer", "concurrency"):
        value = getattr(cfg.system, key)
        if cfg.system.mode == "async" and value is not None and value > trainable:
            raise ConfigError(f"system.{key}: {value} is more than the {trainable} clients that train; at most "
                              f"{trainable}")
    per_round = max(1, round(cfg.train.fraction * trainable))
    algorithm = build_algorithm(cfg)
    try:
        algorithm.check_run(trainable, per_round)
    except ValueError as err:
        raise ConfigError(f"{algorithm.name}: {err}") from None
    s = cfg.server
    if s.aggregator == "krum" and per_round < 2 * s.byzantine + 3:
        raise ConfigError(f"server.byzantine: krum with f={s.byzantine} needs at least {2 * s.byzantine + 3} clients a "
                          f"round, this run samples {per_round}; lower server.byzantine or raise train.fraction")
    if s.aggregator == "krum" and s.krum_select > per_round - s.byzantine:
        raise ConfigError(f"server.krum_select: {s.krum_select} is more than the {per_round - s.byzantine} replies "
                          f"Multi-Krum may average (clients a round {per_round} - server.byzantine {s.byzantine})")


def steps_asynchronously(method: type[Algorithm]) -> bool:
    """Whether a method sends and receives the weights alone and its server takes their plain average."""
    from fedsim.algorithms import WEIGHTS, Algorithm

    return (method.broadcast == (WEIGHTS,) and set(method.uploads) == {WEIGHTS} and not method.server_slots
            and method.server_update is Algorithm.server_update and method.aggregation == "sums"
            and not method.broadcasts_by_group() and method.server_state is Algorithm.server_state)


def asynchronous_methods() -> list[str]:
    from fedsim.algorithms import ALGORITHMS

    return sorted(name for name, cls in ALGORITHMS.items() if steps_asynchronously(cls))


# A client-epoch is one client's pass over its training data, in local training or in evaluation's fine-tuning. Even
# at a millisecond each (a few samples through a small MLP) 10^12 of them take 30 years of one core: a run asking
# for more could never finish, whatever its cluster, and is a typo (train.rounds: 1e26) rather than a plan.
MAX_CLIENT_EPOCHS = 10**12


def client_epochs(cfg: RunConfig) -> tuple[int, int]:
    """(local training, fine-tuning) client-epochs the run asks for, counted from the config alone (before data
    loads): every round's reports times train.local_epochs, and every evaluation's clients times
    eval.finetune_epochs (all clients: an upper bound when eval.clients scores a cohort)."""
    t = cfg.train
    reports, _ = reports_a_round(cfg)
    evaluations = t.rounds // t.eval_every + 1  # every eval_every rounds, and the final round
    return t.rounds * reports * t.local_epochs, evaluations * cfg.data.num_clients * cfg.eval.finetune_epochs


def reports_a_round(cfg: RunConfig) -> tuple[int, str]:
    """How many clients train in a round (a server step, under system.mode=async), and the setting that says so."""
    if cfg.system.mode == "async":
        return cfg.system.async_buffer, "system.async_buffer"
    trainable = cfg.data.num_clients - cfg.eval.held_out(cfg.data.num_clients)
    selected = max(1, round(cfg.train.fraction * trainable))
    return math.ceil(selected * (1 + cfg.system.over_selection)), "data.num_clients"


def check_work(cfg: RunConfig) -> None:
    """Refuse a run that could never finish, with the estimate, naming the largest of the settings that multiply."""
    training, finetuning = client_epochs(cfg)
    if training + finetuning <= MAX_CLIENT_EPOCHS:
        return
    t, e, clients = cfg.train, cfg.eval, cfg.data.num_clients
    reports, key = reports_a_round(cfg)
    factors = {"train.rounds": t.rounds, key: reports, "train.local_epochs": t.local_epochs,
               "data.num_clients": clients, "eval.finetune_epochs": e.finetune_epochs}
    largest = max(factors, key=lambda name: factors[name])
    raise ConfigError(f"{largest}: the run asks for {training + finetuning:.3g} client-epochs ({training:.3g} of local "
                      f"training: train.rounds {t.rounds:.3g} x {reports:.3g} clients a round x train.local_epochs "
                      f"{t.local_epochs:.3g}; {finetuning:.3g} of fine-tuning: {clients:.3g} clients x "
                      f"eval.finetune_epochs {e.finetune_epochs:.3g} at each evaluation), past the "
                      f"{MAX_CLIENT_EPOCHS:.0e} any run could finish (30 years of one core at a millisecond each); "
                      f"lower {largest}")
