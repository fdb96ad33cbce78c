"""fedsim's own question, not a paper's reproduction: does personalization keep the accuracy that user-level
differential privacy takes away? Bietti et al. (ICML 2022, "Personalization Improves Privacy-Accuracy Tradeoffs in
Federated Learning", arXiv:2202.05318) argue it does: a private global model pays for its noise, local learning is
perfectly private, and coordinating the two improves the tradeoff. Their method (PPSGD, a global model plus local
offsets) is not fedsim's; the question is asked here of FedPer, FedBABU and Ditto.

Every DP arm is one method at one privacy level: central DP (DP-FedAvg) with the noise multiplier calibrated by the
accountant to privacy.target_epsilon, or epsilon = inf (no privacy section: no clipping, no noise, everything else
the same). The runs of one method differ only in that noise multiplier. Two baselines bound the question, as
Bietti et al.'s argument needs: Local (each client alone: private for free, one run per seed, the same at every
epsilon) and FedAvg+FT (FedAvg's global model fine-tuned by each client at evaluation with FedBABU's budget, read
from the FedAvg runs). A personalized method's claim can fail two ways: it keeps less of its non-private accuracy
than FedAvg+FT between epsilon = inf and epsilon = 1, or it falls to Local (or below) at some epsilon, where
sharing bought nothing (a method that ignores the global model passes the first test and fails the second).

The clip norm is chosen before the runs from a proxy population, not from the evaluated clients: a non-private
FedAvg run on CIFAR-100 with the same model and training (``clip-proxy``), whose update norms the report prints."""
from __future__ import annotations

from fedsim.reproduce.claims import Arm, Claim, Metric, Overrides, Paper, gap_shrinks, greater, trend

BABU = {"name": "fedbabu", "head_init": "orthogonal_scaled"}  # FedBABU's head as the FedBABU paper's runs draw it

EPSILONS: tuple[float | None, ...] = (1, 2, 4, 8, None)  # None: epsilon = inf, no privacy at all
PRIVATE = tuple(eps for eps in EPSILONS if eps is not None)
TESTED = 1  # the epsilon the drop test compares with inf: the strongest privacy of the sweep
SEEDS = 3  # fixed before the runs (the issue asks for at least 3)
FINETUNE: Overrides = {"eval.finetune_epochs": 5}  # FedBABU's evaluation budget, given to FedAvg+FT alike

# The DP runs: method -> its overrides; each runs at every epsilon.
RUN_METHODS: dict[str, Overrides] = {
    "fedavg": {"algorithm": "fedavg", **FINETUNE},  # read twice: its global model and fine-tuned (FedAvg+FT)
    "fedper": {"algorithm": "fedper"},
    "fedbabu": {"algorithm": BABU, **FINETUNE},
    "ditto": {"algorithm": "ditto"},
}
# label -> (its runs' method, the accuracy it is read through). FedBABU and FedAvg+FT are read as the FedBABU authors
# score: after each client fine-tunes the received model on its own data at evaluation (local: it costs no privacy).
METHODS: dict[str, tuple[str, Metric]] = {
    "FedAvg": ("fedavg", "acc"),
    "FedAvg+FT": ("fedavg", "acc_personalized"),
    "FedPer": ("fedper", "acc"),
    "FedBABU": ("fedbabu", "acc_personalized"),
    "Ditto": ("ditto", "acc"),
}
PERSONALIZED = ("FedPer", "FedBABU", "Ditto")
LOCAL, LOCAL_RUN = "Local", "local"  # shares nothing: DP has nothing to protect, one run per seed
PROXY, PROXY_RUN = "FedAvg on the proxy population (CIFAR-100, no noise)", "clip-proxy"
# The proxy: the base setting on CIFAR-100's images instead of CIFAR-10's, FedAvg with DP's clipping and noise
# switched off (a clip norm no update reaches, noise 0), so its rounds record the update norms a clip norm is
# chosen from (rounds.jsonl's privacy.update_norm_mean) without reading the evaluated clients' data.
PROXY_OVERRIDES: Overrides = {"algorithm": "fedavg", "data.dataset": "cifar100", "privacy.target_epsilon": None,
                              "privacy.noise_multiplier": 0.0, "privacy.clip_norm": 1000.0}


def epsilon_name(epsilon: float | None) -> str:
    return "inf" if epsilon is None else f"{epsilon:g}"


def arm_label(method: str, epsilon: float | None) -> str:
    return f"{method} ε={'∞' if epsilon is None else f'{epsilon:g}'}"


def run_key(method: str, epsilon: float | None) -> str:
    """The run a label's arm reads at ``epsilon`` (FedAvg+FT reads FedAvg's)."""
    return f"{METHODS[method][0]}-eps{epsilon_name(epsilon)}"


def privacy_overrides(epsilon: float | None) -> Overrides:
    """The base config's privacy section as it is (central DP, clip norm, accountant), its budget set to
    ``epsilon``; or none at all for epsilon = inf."""
    return {"privacy": None} if epsilon is None else {"privacy.target_epsilon": epsilon}


RUNS: dict[str, Overrides] = {
    PROXY_RUN: PROXY_OVERRIDES,  # first: the clip norm of every other run was read from it
    **{f"{method}-eps{epsilon_name(eps)}": {**overrides, **privacy_overrides(eps)}
       for method, overrides in RUN_METHODS.items() for eps in EPSILONS},
    LOCAL_RUN: {"algorithm": "local", "privacy": None},
}


def arm(method: str, epsilon: float | None) -> Arm:
    return Arm(arm_label(method, epsilon), run_key(method, epsilon), METHODS[method][1])


LOCAL_ARM = Arm(LOCAL, LOCAL_RUN)


# Why a claim does not hold, read from the kept runs (rewritten when they change; the report shows it beside the tests).
WHY = {
    "FedPer": "At this scale (500 clients of about 100 images, 30 rounds, about 50 clients a round) the noise on the "
              "shared body costs more than sharing gains: FedPer is above Local without DP (68.4 against 64.3) but below "
              "it at every ε up to 4 and level at 8, and it loses 17.0 points from ε = ∞ to 1 where FedAvg+FT loses "
              "13.4. The claim before this one held because it compared drops with FedAvg's global model, which loses "
              "the most (23.9).",
    "FedBABU": "FedBABU is level with Local without DP (64.2 against 64.3) and below it at every ε; its drop from ε = ∞ "
               "to 1 (12.0 points) is not shown smaller than FedAvg+FT's (13.4): the interval of the difference "
               "covers 0.",
    "Ditto": "Ditto's personal model (λ = 0.1) is Local at this scale: flat at 64.3 to 64.5 across ε and level with "
             "Local at every ε (every difference under 2 points). It keeps its accuracy under DP because it does not "
             "use the noised global model, which is what the level test was added to show.",
}


def claim(method: str) -> Claim:
    """One personalized method against FedAvg+FT's drop and Local's level (so ``--only`` runs its arms first)."""
    dp, free = arm_label(method, TESTED), arm_label(method, None)
    baseline_dp, baseline_free = arm_label("FedAvg+FT", TESTED), arm_label("FedAvg+FT", None)
    metric = "personalized (fine-tuned at evaluation)" if METHODS[method][1] == "acc_personalized" else "initial"
    return Claim(
        method.lower(), f"{method} keeps more of its accuracy under DP than FedAvg+FT and stays above Local",
        "Bietti et al. (ICML 2022): learning a private global model costs accuracy, local learning is perfectly "
        "private, and coordinating the two improves the privacy-accuracy tradeoff. Asked here of "
        f"{method}: its accuracy drop from ε = ∞ to ε = {TESTED:g} is smaller than FedAvg+FT's, and at every ε it "
        "stays above Local (else sharing bought nothing).",
        (arm("FedAvg+FT", None), arm("FedAvg+FT", TESTED), *(arm(method, eps) for eps in EPSILONS), LOCAL_ARM),
        (gap_shrinks((baseline_free, baseline_dp), (free, dp)),
         *(greater(arm_label(method, eps), LOCAL) for eps in PRIVATE)),
        f"{method}'s {metric} accuracy against FedAvg+FT's and Local's, each client scored on its own test images. "
        f"The tests, per seed in points: (FedAvg+FT ε=∞ − FedAvg+FT ε={TESTED:g}) − ({method} ε=∞ − {method} "
        f"ε={TESTED:g}) > 0, and {method} − Local > 0 at each ε of {', '.join(f'{e:g}' for e in PRIVATE)}; "
        "reproduced when every interval lies above 0.",
        paper_number="none comparable: Bietti et al. run PPSGD (a global model plus local offsets) on their own "
                     "synthetic and real-world settings; FedPer, FedBABU and Ditto under DP are fedsim's question",
        explanation=WHY[method], seeds=SEEDS)


# The check that the setting is what the question needs: DP costs FedAvg accuracy, the more the smaller epsilon. Its
# arms are every run (the table, the figure and the proxy's norms); outside the tally, it is about the setting.
NOISE_MATTERS = Claim(
    "noise-matters", "The setting makes DP cost accuracy: FedAvg's rises with ε",
    "Not a paper's statement: the setting is sized so that clipping and noise matter (many clients a round, a small "
    "model); if FedAvg lost nothing to DP, personalization would have nothing to keep.",
    (*(arm(method, eps) for method in METHODS for eps in EPSILONS), LOCAL_ARM, Arm(PROXY, PROXY_RUN)),
    (trend(tuple(arm_label("FedAvg", eps) for eps in EPSILONS),
           "FedAvg's accuracy rises with ε: slope over ε = 1 → 2 → 4 → 8 → ∞ > 0 per step"),),
    "Every run (the table, the figure and the clip norm's proxy); the test reads FedAvg's five arms, ε by rank.",
    paper_number="none: a check of fedsim's own setting", seeds=SEEDS, counts=False)

# The three claims first: `fedsim reproduce privacy --only fedper` (fedbabu, ditto) runs a verdict's runs before the
# figure's other points.
CLAIMS: tuple[Claim, ...] = (*(claim(method) for method in PERSONALIZED), NOISE_MATTERS)

PAPER = Paper(
    key="privacy",
    title="Personalization under user-level DP (fedsim's own question, after Bietti et al., ICML 2022)",
    bases={"cpu": "cpu/privacy_cifar10.yaml"}, runs=RUNS, claims=CLAIMS, page="privacy",
    scale_notes={"cpu": "The only scale, sized so that clipping and noise matter and the 66 runs fit a CPU; its "
                        "base config, fedsim/reproduce/configs/cpu/privacy_cifar10.yaml, says why each value"},
)
