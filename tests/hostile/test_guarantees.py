"""Privacy settings whose guarantee would say nothing (issue 66, item 3): DP over fewer than 2 clients that may
train, or a delta of at least 1/N, is refused in one line instead of printed as an epsilon. No Ray is started here."""
import pytest
from conftest import refused, write_probe

UNIFORM = "train: {weighting: uniform}\n"
VACUOUS = [
    ("one client", UNIFORM + "data: {num_clients: 1, options: {num_clients: 1}}\nprivacy: {noise_multiplier: 1.0}",
     "privacy.dp: 1 client may train"),
    ("all but one held out as unseen", UNIFORM + "eval: {unseen: 7}\nprivacy: {noise_multiplier: 1.0}",
     "privacy.dp: 1 client may train"),
    ("one client, the budget calibrated", UNIFORM + "data: {num_clients: 1, options: {num_clients: 1}}\n"
     "privacy: {target_epsilon: 8}", "privacy.dp: 1 client may train"),
    ("local DP over one client", UNIFORM + "data: {num_clients: 1, options: {num_clients: 1}}\n"
     "privacy: {dp: local, noise_multiplier: 1.0}", "privacy.dp: 1 client may train"),
    ("delta of 1/N", UNIFORM + "privacy: {noise_multiplier: 1.0, delta: 0.125}", "privacy.delta: 0.125 is at least 1/N"),
    ("delta above 1/N", UNIFORM + "privacy: {noise_multiplier: 1.0, delta: 0.5}", "privacy.delta: 0.5 is at least 1/N"),
]


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry run"])
@pytest.mark.parametrize("case,extra,fragment", VACUOUS, ids=[c[0] for c in VACUOUS])
def test_a_vacuous_guarantee_is_refused_in_one_line(case, extra, fragment, dry_run, in_tmp, capsys):
    refused(capsys, in_tmp, ["run", str(write_probe(in_tmp, extra)), *(["--dry-run"] if dry_run else [])], fragment)
