"""Numbers that would never finish or end in a dependency's traceback (issue 66, item 2): each is refused where it is
parsed, in one line naming the setting, before anything is written; `--dry-run` included. No Ray is started here."""
import pytest
from conftest import refused, tune_tree, write_probe, write_yaml

UNIFORM = "train: {weighting: uniform}\n"
DIGITS = "9" * 5000
NUMBERS = [
    ("a budget over a million rounds", "train: {weighting: uniform, rounds: 1000000}\n"
     "privacy: {target_epsilon: 8}", "train.rounds: 1,000,000 rounds under privacy.accountant rdp"),
    ("pld over 501 rounds", "train: {weighting: uniform, sampling: poisson, rounds: 501}\n"
     "privacy: {noise_multiplier: 1.0, accountant: pld}", "train.rounds: 501 rounds under privacy.accountant pld"),
    ("a noise multiplier of 5e-324", UNIFORM + "privacy: {noise_multiplier: 5.0e-324}", "privacy.noise_multiplier"),
    ("a noise multiplier of 1e-300", UNIFORM + "privacy: {noise_multiplier: 1.0e-300}", "privacy.noise_multiplier"),
    ("a noise multiplier of 1e300", UNIFORM + "privacy: {noise_multiplier: 1.0e+300}", "privacy.noise_multiplier"),
    ("a count noise of 1e7", UNIFORM + "privacy: {noise_multiplier: 1.0, adaptive: {count_noise: 1.0e+7}}",
     "privacy.adaptive.count_noise"),
]


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry run"])
@pytest.mark.parametrize("case,extra,fragment", NUMBERS, ids=[c[0] for c in NUMBERS])
def test_an_unbounded_number_is_refused_in_one_line(case, extra, fragment, dry_run, in_tmp, capsys):
    refused(capsys, in_tmp, ["run", str(write_probe(in_tmp, extra)), *(["--dry-run"] if dry_run else [])], fragment)


def test_a_5000_digit_integer_names_its_key_and_line(in_tmp, capsys):
    path = write_probe(in_tmp)
    path.write_text(path.read_text().replace("rounds: 2", f"rounds: {DIGITS}"))
    refused(capsys, in_tmp, ["run", str(path)], "rounds: an integer of 5,000 digits")


def test_a_5000_digit_override_names_its_key(in_tmp, capsys):
    refused(capsys, in_tmp, ["run", str(write_probe(in_tmp)), f"train.rounds={DIGITS}"],
            "override train.rounds: line 1: an integer of 5,000 digits")


TUNING = [("a hundred million final seeds", {"final_seeds": 100_000_000}, "tune.final_seeds: the tuning has"),
          ("a billion trials", {"trials": 1_000_000_000}, "tune.trials"),
          ("trials past the sweep's run bound", {"trials": 9000, "seeds": [0, 1, 2, 3, 4]},
           "tune.trials: the tuning has 135,036 runs")]  # 3 x (9,000 + 2 own) x 5 + 3 x 2


@pytest.mark.parametrize("case,tune,fragment", TUNING, ids=[c[0] for c in TUNING])
def test_tuning_is_counted_before_it_expands(case, tune, fragment, in_tmp, capsys):
    path = write_yaml(in_tmp / "tune.yaml", tune_tree(in_tmp / "runs", **tune))
    refused(capsys, in_tmp, ["tune", str(path), "--dry-run"], fragment)
