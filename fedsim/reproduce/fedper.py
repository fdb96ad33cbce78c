"""The FedPer paper (Arivazhagan et al. 2019, arXiv:1912.00818), claim by claim."""
from dataclasses import replace

from fedsim.reproduce.claims import Arm, Claim, Overrides, Paper, Setting, Test, gap_trend, greater

FEDPER_FT = {"name": "fedper_ft", "head_epochs": 1}  # Knowl 8: the personal layers alone for 1 epoch first

RUNS: dict[str, Overrides] = {
    "k4-fedavg": {"algorithm": "fedavg"},
    "k4-fedper": {},
    "k8-fedavg": {"algorithm": "fedavg", "data.k": 8},
    "k8-fedper": {"data.k": 8},
    "k10-fedavg": {"algorithm": "fedavg", "data.k": 10},
    "k10-fedper": {"data.k": 10},
    "kp1": {"model.personal_layers": 1},  # the base run at CPU scale (same settings, one folder)
    "kp2": {"model.personal_layers": 2},
    "kp3": {"model.personal_layers": 3},
    "kp4": {"model.personal_layers": 4},
    "conflicting-fedavg": {"algorithm": "fedavg", "data.partition": "conflicting"},
    "conflicting-fedper": {"data.partition": "conflicting"},
    # Half the classes keep their labels at every client, half a per-client permutation: FedAvg can learn the agreed
    # half, so its level is a measurement, not chance by construction.
    "conflicting-half-fedavg": {"algorithm": "fedavg", "data.partition": {"name": "conflicting", "agreed": 0.5}},
    "conflicting-half-fedper": {"data.partition": {"name": "conflicting", "agreed": 0.5}},
    "linear-base": {"model.name": "linear_base"},
    "local": {"algorithm": "local"},
    "c100-fedper": {"data.dataset": "cifar100", "data.k": 20},
    "c100-fedper-ft": {"data.dataset": "cifar100", "data.k": 20, "algorithm": FEDPER_FT},
    "c100-linear-base": {"data.dataset": "cifar100", "data.k": 20, "model.name": "linear_base"},
    "c100-local": {"data.dataset": "cifar100", "data.k": 20, "algorithm": "local"},
}

CONVERGED = 0.9  # "converges": reaches 90% of its own final client mean
ONE_ROUND = 1.0  # the convergence test's equivalence margin, in rounds: one evaluation step

# Why local-only training can match FedPer at CPU scale (shown only where that half of Knowl 7 does not hold).
DEEP_MODEL = ("The paper's reason local training fails is that a client's data is too small for a deep model "
              "(ResNet-34: 21.3 M parameters); the CPU scale's 4-conv CNN has 0.14 M, few enough to fit 500 "
              "images alone, so this half of the claim is likely a regime effect of the model cut, not a "
              "disagreement. The deep-model test is `--scale paper` (not run here: it needs a GPU cluster).")

CLAIMS: tuple[Claim, ...] = (
    Claim("k4", "FedPer beats FedAvg under k = 4 and is fairer",
          "Knowl 4: with at most k = 4 classes per client (CIFAR-10, 10 clients), FedPer reaches a much higher "
          "client-averaged accuracy than FedAvg and substantially lower variance across clients (figures, no "
          "table).",
          (Arm("FedAvg", "k4-fedavg"), Arm("FedPer", "k4-fedper")),
          (greater("FedPer", "FedAvg", by=10), greater("FedAvg", "FedPer", stat="std")),
          "CIFAR-10, 10 clients, k = 4, e = 4, lr 0.01, gamma_j = n_j / sum n, K_P = 1, as the paper; 4-conv CNN "
          "instead of ResNet-34/MobileNet-v1.",
          paper_number="no number in the paper (figures); Flower's FedPer baseline (adap/flower baselines/fedper, "
                       "read by eye from its plots; 50 rounds, images at 224 px): FedAvg ~68, FedPer ~91.5 "
                       "(MobileNet-v1), FedAvg ~67, FedPer ~89 (ResNet-34)",
          # Read from the CPU scale's kept runs (fedper-cpu-k4-fedavg/fedper-sgd-s0..s4), all 5 seeds finished.
          explanation="At the paper's plain SGD the accuracy half holds in every seed (FedPer ahead by 21.3 to 28.5 "
                      "points) and the fairness half is not decided: FedAvg's client std is above FedPer's in 4 of 5 "
                      "seeds (by 1.4 to 8.3 points) and 3.0 below it in seed 2, an interval ([-2.34, 7.81]) that "
                      "covers both 0 and the 2-point margin. At the CPU base's momentum 0.9 (untested context) "
                      "FedAvg's clients spread far more (client std 8.1 to 22.2 against 4.8 to 13.1 at plain SGD) and "
                      "both halves hold: the fairness half rests on the optimizer at this scale.",
          peer_gap="Not measured here, so unexplained by measurement: fedsim's plain-SGD levels (FedAvg ~46, FedPer "
                   "~71.5) are ~20 points under Flower's, whose run differs in three ways, each a candidate: 50 "
                   "rounds against 10, all of each client's images against 10% of them (500 a client), and "
                   "MobileNet-v1 / ResNet-34 on 224-px images against the 4-conv CNN at 32 px. The gap FedPer − "
                   "FedAvg, which the claim tests, is of Flower's size (+25 against +22 to +23.5). The paper scale "
                   "(`--scale paper`: MobileNet-v1, all images, 100 rounds) removes all three; it needs a GPU "
                   "cluster and was not run."),
    Claim("k-sweep", "The gap closes as k grows to 10",
          "Knowl 4: as the partition approaches IID (k = 4 -> 8 -> 10) FedPer's advantage narrows towards FedAvg.",
          (Arm("FedAvg k=4", "k4-fedavg"), Arm("FedPer k=4", "k4-fedper"), Arm("FedAvg k=8", "k8-fedavg"),
           Arm("FedPer k=8", "k8-fedper"), Arm("FedAvg k=10", "k10-fedavg"), Arm("FedPer k=10", "k10-fedper")),
          # One trend: the slope of the paired gap FedPer − FedAvg over k = 10, 8, 4 (its rank) is positive, i.e.
          # the gap falls as k grows; a linear contrast of the six arms.
          (gap_trend((("FedPer k=10", "FedAvg k=10"), ("FedPer k=8", "FedAvg k=8"), ("FedPer k=4", "FedAvg k=4")),
                     "the gap FedPer − FedAvg falls as k grows: slope over k = 10 → 8 → 4 > 0 per step"),),
          "As claim k4, with k in {4, 8, 10}; tested as one trend over the three gaps (k by rank). The paper says "
          "the advantage narrows, not that FedPer falls below FedAvg at k = 10; the arm table shows where it ends.",
          paper_number="Flower's FedPer baseline (read by eye from its plots), FedPer − FedAvg at k = 4 / 8 / 10: "
                       "+23.5 / +3.5 / 0 (MobileNet-v1), +22 / +3.5 / −8.5 (ResNet-34)"),
    Claim("kp-sweep", "K_P >= 1 is the decisive gain; deeper is not better",
          "Knowl 6: personalizing at least the classifier is what matters; on CIFAR-10 K_P = 2 is best, on "
          "CIFAR-100 K_P = 1, so accuracy does not rise with depth.",
          (Arm("K_P=0 (FedAvg)", "k4-fedavg"), Arm("K_P=1", "kp1"), Arm("K_P=2", "kp2"), Arm("K_P=3", "kp3"),
           Arm("K_P=4", "kp4")),
          # Not monotone: past the paper's best CIFAR-10 depth (K_P = 2) accuracy falls again. K_P = 1 against FedAvg
          # is claim k4's first test (the same two runs), so it is not repeated here: K_P = 0 is an untested row.
          (greater("K_P=2", "K_P=4"),),
          "As claim k4; K_P counts the classifier and the last conv blocks of the 4-conv CNN (4 leaves one conv "
          "block shared). The decisive K_P >= 1 gain over FedAvg (K_P = 0) is tested once, in claim k4.",
          paper_number="Flower's FedPer baseline (MobileNet-v1, k = 4, 25 rounds, read by eye from its plots): "
                       "1 block + classifier ~89.5, 2 blocks ~88.5, 3 blocks ~87; FedAvg ~57",
          # Levels read from the CPU scale's kept plain-SGD runs (fedper-cpu-k4-fedavg-sgd, kp1..kp4-sgd, s0..s4).
          peer_gap="Not measured here, so unexplained by measurement: fedsim's plain-SGD levels (K_P = 1 / 2 / 3 "
                   "~71.5 / ~71 / ~71, FedAvg ~46) are 16 to 18 points under Flower's personal depths and ~11 under "
                   "its FedAvg, whose run differs in the candidates claim k4 names: 25 rounds against 10, all of each "
                   "client's images against 10% of them, and MobileNet-v1's blocks on 224-px images against the "
                   "4-conv CNN's at 32 px. The shape the claim tests is Flower's: depths 1 to 3 within a point or "
                   "two, falling slowly with depth (here K_P = 4, one conv block left shared, 3.4 points under "
                   "K_P = 1)."),
    Claim("conflicting", "Conflicting labels: FedPer far above FedAvg",
          "Knowl 5 (FLICKR-AES, ratings 1-5, 30 clients): FedAvg stays at random-guessing level (about 15-20%), "
          "FedPer reaches about 40%.",
          (Arm("FedAvg", "conflicting-half-fedavg"), Arm("FedPer", "conflicting-half-fedper"),
           Arm("FedAvg, all permuted", "conflicting-fedavg"), Arm("FedPer, all permuted", "conflicting-fedper")),
          (greater("FedPer", "FedAvg", by=10),),
          "Stand-in for FLICKR-AES: CIFAR-10 (10 clients, 4-conv CNN, e = 4) where half the classes keep their "
          "labels at every client and the other half are relabelled by a per-client permutation "
          "(data.partition conflicting, agreed = 0.5), so FedAvg can learn the agreed half and its level is a "
          "measurement. The untested rows are the fully permuted partition (agreed = 0): there FedAvg is at chance "
          "by construction and any personal head absorbs a permutation, so they check mechanics only.",
          paper_number="paper (FLICKR-AES, 5 rating classes): FedAvg 15-20%, FedPer ~40%; Flower's FedPer baseline "
                       "(FLICKR-AES, 35 rounds, read by eye): FedPer ~40 vs FedAvg ~31 (MobileNet-v1), ~50 vs ~36 "
                       "(ResNet-34)",
          # Levels read from the CPU scale's kept plain-SGD runs (fedper-cpu-conflicting-half-*-sgd-s0..s4).
          peer_gap="Levels not comparable by construction: the paper's and Flower's numbers are FLICKR-AES (5 "
                   "rating classes, 30 clients), which fedsim does not hold, and the CIFAR-10 stand-in's levels "
                   "(FedAvg ~33, FedPer ~48 at plain SGD) follow from its design (agreed = 0.5 leaves FedAvg the "
                   "agreed half to learn). What carries over is the gap the claim tests: FedPer +15 over FedAvg "
                   "here, against +9 (MobileNet-v1) and +14 (ResNet-34) in Flower's runs and +20 to +25 in the "
                   "paper's."),
    Claim("base-necessary", "A deep shared base beats a linear base and local-only training",
          "Knowl 7: on CIFAR-100 (and FLICKR-AES) a single linear base layer degrades accuracy significantly; "
          "purely local training is poor because each client's data is too small for a deep model.",
          (Arm("FedPer", "c100-fedper"), Arm("FedPer, linear base", "c100-linear-base"),
           Arm("local only", "c100-local")),
          (greater("FedPer", "FedPer, linear base"), greater("FedPer", "local only")),
          "CIFAR-100 as the paper: 10 clients with k = 20 classes each, 500 training images per client; linear "
          "base = one Linear(3072, 256) + ReLU before the same personal classifier.",
          paper_number="none exists: Knowl 7 is a figure without numbers in the paper's text, and no named peer "
                       "(Flower's FedPer baseline, PFLlib, FL-bench) runs a linear base",
          explanation=DEEP_MODEL),
    Claim("base-necessary-cifar10", "The same on CIFAR-10 with k = 4 (a setting the paper does not report)",
          "Knowl 7 reports CIFAR-100 and FLICKR-AES only; fedsim also runs its k = 4 CIFAR-10 setting.",
          (Arm("FedPer", "k4-fedper"), Arm("FedPer, linear base", "linear-base"), Arm("local only", "local")),
          (greater("FedPer", "FedPer, linear base"), greater("FedPer", "local only")),
          "CIFAR-10 k = 4 as claim k4: each client holds 500 images of at most 4 classes.",
          paper_number="none exists: the paper does not run this setting; local-only against FedPer at k = 4 "
                       "appears in no named peer's published results",
          counts=False, outside="a setting the paper does not report: Knowl 7 reports CIFAR-100 and FLICKR-AES only"),
    Claim("pre-finetune", "Pre-fine-tuning the personal layers helps on CIFAR-100",
          "Knowl 8: on CIFAR-100, one epoch on the personal layers alone at the start of each round gives "
          "higher client accuracy than plain FedPer (no change on FLICKR-AES).",
          (Arm("FedPer", "c100-fedper"), Arm("FedPer + pre-fine-tuning", "c100-fedper-ft")),
          (greater("FedPer + pre-fine-tuning", "FedPer"),),
          "CIFAR-100, 10 clients with k = 20 classes each, 500 training images per client.",
          paper_number="none exists: Knowl 8 is a figure without numbers in the paper's text, and no named peer "
                       "publishes FedPer with pre-fine-tuning"),
    # Issue 48 item 2: Knowl 4's convergence speed as rounds to a fixed fraction of each run's own final accuracy, read
    # from each run's curve (train.eval_every = 1 at both scales), apart from the level (claim k4's test).
    Claim("convergence", "FedPer converges faster than FedAvg under k = 4",
          "Knowl 4: under severe non-IID conditions (k = 4) 'FedPer converges significantly faster and attains a "
          "higher client-averaged test accuracy at steady state than FedAvg' (CIFAR-10, 10 clients; figures, no "
          "numbers).",
          (Arm("FedPer, rounds to 90%", "k4-fedper", to_fraction=CONVERGED),
           Arm("FedAvg, rounds to 90%", "k4-fedavg", to_fraction=CONVERGED),
           Arm("FedPer, final", "k4-fedper"), Arm("FedAvg, final", "k4-fedavg")),
          (Test("FedAvg's − FedPer's rounds to 90% of their own final > 0",
                (("FedAvg, rounds to 90%", 1.0), ("FedPer, rounds to 90%", -1.0)), margin=ONE_ROUND,
                subject="FedAvg's − FedPer's rounds to 90% of their own final", unit="rounds"),),
          "Claim k4's runs (CPU scale: 10 rounds, evaluated every round), read along their curves: per seed, each "
          "method's rounds to reach 90% of its own final-round client mean, so speed is measured apart from the "
          "level (claim k4's test, not repeated here); the seeds' paired differences decide. The equivalence "
          "margin is one round, the resolution of a curve evaluated every round. The final rows are untested.",
          paper_number="none for the speed: Knowl 4 is a figure without numbers, and Flower's FedPer baseline "
                       "publishes curves, of which only the end points are read (claim k4); no peer states rounds "
                       "to an accuracy",
          seeds=5),
)

CPU_OPTIMIZER_WHY = ("with 10 of the paper's 100 rounds, momentum's ~10x effective step (lr / (1 - m) = 0.1) was to "
                     "stand in for the cut rounds")
# The CPU scale's claims are decided at the paper's optimizer (Algorithm 1 line 5: W - lr grad, lr 0.01), batch 50
# kept; the base's momentum 0.9 runs (what decided them before) are shown beside, untested. At paper scale the base is
# already plain SGD (batch 128), so its runs are read as declared.
PLAIN_SGD = Setting("-sgd", "plain SGD (the paper's)", {"train.body.momentum": 0.0, "train.head.momentum": 0.0})
CPU_MOMENTUM = Setting("", "momentum 0.9 (untested context)", counts=False)
# Stated in every claim: the optimizer, and both scales average BatchNorm's running statistics with the base, which
# the paper does not address.
OPTIMIZER_AND_BN = ("Optimizer and BatchNorm: the paper states plain SGD (Algorithm 1: W - lr grad, lr 0.01; no "
                    "batch size) and says nothing of BatchNorm. Both scales decide the claim at plain SGD, lr 0.01 (the "
                    "CPU scale at batch 50, the paper scale at batch 128, Flower's FedPer baseline); the CPU scale "
                    "also shows, untested, its base's SGD momentum 0.9 (" + CPU_OPTIMIZER_WHY + "). At both scales "
                    "BatchNorm's running statistics belong to the base and are averaged with it (model.batchnorm "
                    "averaged, as Flower's FedPer baseline averages the base's state dict); the paper's ResNet-34 and "
                    "MobileNet-v1 have BatchNorm, but it does not say how their statistics are shared.")
CLAIMS = tuple(replace(claim, regime=f"{claim.regime} {OPTIMIZER_AND_BN}") for claim in CLAIMS)

PAPER = Paper(
    key="fedper", title="Federated Learning with Personalization Layers (Arivazhagan et al., 2019)",
    bases={"cpu": "cpu/fedper_cifar10.yaml", "paper": "paper/fedper_mobilenet_cifar10.yaml"},
    runs=RUNS, claims=CLAIMS, settings={"cpu": (PLAIN_SGD, CPU_MOMENTUM)},
    scale_notes={
        "cpu": "4-conv CNN instead of ResNet-34/MobileNet-v1; 10% of the training images (500 per client) and 20% "
               "of the test images; 10 rounds instead of 100; batch 50 (the paper gives none). Every claim is "
               "decided at the paper's optimizer (plain SGD, lr 0.01: Algorithm 1) and shown beside it, untested, at "
               "SGD momentum 0.9, the base's optimizer that decided them before (" + CPU_OPTIMIZER_WHY + ").",
        "paper": "MobileNet-v1 (the paper also runs ResNet-34: fedsim/reproduce/configs/paper/fedper_resnet34_cifar10.yaml), "
                 "all images, 100 rounds, e = 4, lr 0.01."},
)
