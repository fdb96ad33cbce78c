"""Hostile configs (issue 47, items 6-8): values that pass a type check but would fail after the run folder is
written, never finish, or reach the OS as something else. Each probe runs `fedsim run` in-process and must end in one
line naming the field (or file) and the fix, exit code 2, with no run folder and nothing in the working directory."""
import os

import pytest
from conftest import cli_env, fedsim_cli, refused, unblocking, write_probe


# -- values that passed validation and failed once the folder was written (item 6) ----------------------------------
# (case id, YAML over PROBE_BASE, fragment of the one line)
LATE_FAILURES = [
    ("heartbeat of 1e300 s", "engine: {heartbeat_timeout_s: 1.0e+300}", "engine.heartbeat_timeout_s"),
    ("round timeout of 1e300 s", "engine: {round_timeout_s: 1.0e+300}", "engine.round_timeout_s"),
    ("resource wait of 1e300 s", "engine: {wait_for_resources_s: 1.0e+300}", "engine.wait_for_resources_s"),
]


@pytest.mark.parametrize("case,extra,fragment", LATE_FAILURES, ids=[c[0] for c in LATE_FAILURES])
def test_a_value_that_would_fail_mid_run_is_refused_first(case, extra, fragment, in_tmp, capsys):
    refused(capsys, in_tmp, ["run", str(write_probe(in_tmp, extra))], fragment)


@pytest.mark.parametrize("inside", [False, True], ids=["spill_dir is a file", "spill_dir inside a file"])
def test_a_spill_dir_that_cannot_be_a_folder_is_refused_before_the_run_folder(inside, in_tmp, capsys):
    blocker = in_tmp / "a-file"
    blocker.write_text("")
    spill = blocker / "state" if inside else blocker
    err = refused(capsys, in_tmp, ["run", str(write_probe(in_tmp, f"engine: {{spill_dir: '{spill}'}}"))],
                  "engine.spill_dir: ")
    assert "not a folder" in err and str(blocker) in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder")
def test_an_unwritable_spill_dir_is_refused_before_the_run_folder(in_tmp, capsys):
    locked = in_tmp / "locked"
    locked.mkdir(mode=0o500)
    refused(capsys, in_tmp, ["run", str(write_probe(in_tmp, f"engine: {{spill_dir: '{locked / 'state'}'}}"))],
            "is not writable")


# -- YAML that is no config (item 7) ---------------------------------------------------------------------------------
YAML_TEXTS = [
    ("a key that is a list", "seed: 1\n? [a, b]\n: 3\n", "line 2: a key is a list"),
    ("a key that is a mapping", "? {a: 1}\n: 3\n", "line 1: a key is a mapping"),
    ("a flow key that is a list", "train: {[rounds]: 3}\n", "a key is a list"),
    ("a nested key that is a list", "train:\n  ? [rounds, local_epochs]\n  : 3\n", "line 2: a key is a list"),
]


@pytest.mark.parametrize("case,text,fragment", YAML_TEXTS, ids=[c[0] for c in YAML_TEXTS])
def test_a_key_that_names_no_setting_is_one_line(case, text, fragment, in_tmp, capsys):
    path = in_tmp / "cfg.yaml"
    path.write_text(text)
    err = refused(capsys, in_tmp, ["run", str(path)], fragment)
    assert str(path) in err


ENCODINGS = [("latin-1", "name: caf\xe9\n".encode("latin-1")), ("utf-16", "name: x\n".encode("utf-16")),
             ("binary", bytes(range(256)))]


@pytest.mark.parametrize("case,data", ENCODINGS, ids=[c[0] for c in ENCODINGS])
def test_a_config_that_is_not_utf8_names_the_file_and_the_fix(case, data, in_tmp, capsys):
    path = in_tmp / "cfg.yaml"
    path.write_bytes(data)
    err = refused(capsys, in_tmp, ["run", str(path)], "save the file as UTF-8")
    assert str(path) in err and "not UTF-8" in err


def test_an_override_key_that_is_a_list_is_one_line(in_tmp, capsys):
    refused(capsys, in_tmp, ["run", str(write_probe(in_tmp, "")), "train={[rounds]: 3}"], "a key is a list")


# -- absurd or special values (item 8) -------------------------------------------------------------------------------
ABSURD = [
    ("1e26 rounds (an integer)", "train: {rounds: 100000000000000000000000000}",
     "train.rounds: the run asks for 4e+26 client-epochs"),
    ("1e26 rounds (a float)", "train: {rounds: 1.0e+26}", "train.rounds: the run asks for"),
    ("1e20 local epochs", "train: {local_epochs: 100000000000000000000}", "train.local_epochs: the run asks for"),
    ("1e20 fine-tune epochs", "eval: {finetune_epochs: 100000000000000000000}", "eval.finetune_epochs: the run asks for"),
    ("1e26 clients", "data: {num_clients: 100000000000000000000000000}", "data.num_clients: the run asks for"),
    ("1e12 rounds of 4 clients", "train: {rounds: 1000000000000}", "past the 1e+12 any run could finish"),
    ("a batch past 64 bits", "train: {batch_size: 1000000000000000000000000000000}",
     "train.batch_size: 1e+30 is beyond a 64-bit integer"),
    ("checkpoints every 1e30 rounds", "engine: {checkpoint_every: 1.0e+30}", "engine.checkpoint_every: 1e+30 is beyond"),
    ("a negative milestone", "train: {body: {schedule: step, milestones: [-0.5]}}",
     "train.body.milestones: -0.5 is not a fraction of train.rounds"),
    ("a milestone in rounds", "train: {head: {schedule: step, milestones: [50]}}", "train.head.milestones: 50 is not"),
    ("an empty out_dir", "out_dir: ''", "out_dir: is empty, which would write the run folder into the working"),
    ("a blank out_dir", "out_dir: '  '", "out_dir: is empty"),
    ("an infinite method parameter", "algorithm: {name: fedprox, mu: .inf}", "algorithm.mu"),
    ("a NaN method parameter", "algorithm: {name: ditto, lambda: .nan}", "algorithm.lambda"),
    ("an infinite step-schedule factor", "train: {body: {gamma: .inf}}", "train.body.gamma"),
    ("a billion torch threads", "engine: {threads_per_worker: 1000000000}", "engine.threads_per_worker"),
    ("a W&B tag W&B refuses", "logging: {wandb: {tags: [''], mode: offline}}", "logging.wandb.tags: '' has 0 characters"),
    ("a W&B tag of 65 characters", f"logging: {{wandb: {{tags: [{'t' * 65}]}}}}", "W&B takes tags of 1 to 64"),
    ("a device of 5e-324 samples/s", "system: {devices: {speed: 5.0e-324}}", "system.devices.speed"),
    ("a device spread past float", "system: {devices: {preset: lognormal, sigma: 1000}}", "system.devices.sigma"),
    ("a billion synthetic draws", "sweep: {train.body.lr: {uniform: [0.01, 0.1]}}\nsearch: {samples: 1000000000}",
     "search.samples: the sweep has 1,000,000,000 runs"),
]
NUL_FIELDS = ["out_dir", "data.root", "model.init_from", "engine.spill_dir", "system.devices.trace",
              "logging.wandb.project", "model.client", "data.dataset"]


@pytest.mark.parametrize("case,extra,fragment", ABSURD, ids=[c[0] for c in ABSURD])
def test_an_absurd_value_is_refused_where_it_is_parsed(case, extra, fragment, in_tmp, capsys):
    refused(capsys, in_tmp, ["run", str(write_probe(in_tmp, extra))], fragment)


@pytest.mark.parametrize("field", NUL_FIELDS)
def test_a_nul_byte_in_a_path_or_name_names_its_field(field, in_tmp, capsys):
    path = write_probe(in_tmp, **{field: f"{in_tmp}/a\0b"})
    refused(capsys, in_tmp, ["run", str(path)], f"{field}: holds a NUL byte")


SYNTHETIC_OPTIONS = [("alpha", ".inf"), ("beta", ".nan"), ("alpha", "-1"), ("num_clients", ".inf"),
                     ("num_clients", "1000000000"), ("seed", "-1")]


@pytest.mark.parametrize("key,value", SYNTHETIC_OPTIONS, ids=[f"{k}={v}" for k, v in SYNTHETIC_OPTIONS])
def test_a_synthetic_option_out_of_range_names_its_key(key, value, in_tmp, capsys):
    refused(capsys, in_tmp, ["run", str(write_probe(in_tmp, f"data: {{options: {{{key}: {value}}}}}"))],
            f"data.options.{key}: ")


def test_synthetic_inputs_past_float32_name_beta(in_tmp, capsys):
    refused(capsys, in_tmp, ["run", str(write_probe(in_tmp, "data: {options: {num_clients: 8, beta: 1.0e+300}}"))],
            "data.options.beta: 1e+300 spreads the inputs past float32's range")


TRACES = [("a devices trace", "system: {devices: {trace: TRACE}}", "system.devices.trace"),
          ("an availability trace", "system: {devices: {preset: uniform}, availability: {pattern: trace, trace: TRACE}}",
           "system.availability.trace")]


@pytest.mark.parametrize("case,extra,field", TRACES, ids=[c[0] for c in TRACES])
def test_a_trace_that_is_a_fifo_is_refused_without_reading_it(case, extra, field, in_tmp, capsys):
    fifo = in_tmp / "trace.csv"
    os.mkfifo(fifo)
    timer = unblocking(fifo)
    try:
        relative = os.path.relpath(fifo, in_tmp)  # the message names the real path, not the one written
        err = refused(capsys, in_tmp, ["run", str(write_probe(in_tmp, extra.replace("TRACE", relative)))],
                      f"{field}: {fifo} is not a regular file")
    finally:
        timer.cancel()
    assert "give a CSV file" in err


def test_init_weights_that_are_a_fifo_are_refused_without_reading_them(in_tmp, capsys):
    finished = in_tmp / "finished"
    finished.mkdir()
    os.mkfifo(finished / "model.npz")
    timer = unblocking(finished / "model.npz")
    try:
        refused(capsys, in_tmp, ["run", str(write_probe(in_tmp, model__init_from=str(finished)))],
                f"model.init_from: {finished / 'model.npz'} is not a regular file")
    finally:
        timer.cancel()


def test_a_trace_that_is_a_device_is_refused(in_tmp, capsys):
    refused(capsys, in_tmp, ["run", str(write_probe(in_tmp, "system: {devices: {trace: /dev/zero}}"))],
            "system.devices.trace: /dev/zero is not a regular file")


SWEEPS = [("a seed listed twice", "sweep: {seed: [0, 0]}", "sweep.seed: 0 is listed twice; list each value once"),
          ("a value listed twice", "sweep: {train.rounds: [2, 3, 2]}", "sweep.train.rounds: 2 is listed twice"),
          ("values that read the same", "sweep: {train.body.lr: [0.1, '0.1']}", "give the same run name")]


@pytest.mark.parametrize("case,extra,fragment", SWEEPS, ids=[c[0] for c in SWEEPS])
@pytest.mark.parametrize("command", ["run", "sweep"])
def test_a_sweep_that_repeats_a_run_is_refused(command, case, extra, fragment, in_tmp, capsys):
    argv = [command, str(write_probe(in_tmp, extra))] + (["--dry-run"] if command == "sweep" else [])
    refused(capsys, in_tmp, argv, fragment)


# -- the same, through the real process ------------------------------------------------------------------------------
SUBPROCESS = [("a heartbeat of 1e300 s", "engine: {heartbeat_timeout_s: 1.0e+300}", "engine.heartbeat_timeout_s"),
              ("a key that is a list", "? [a, b]\n: 3\n", "a key is a list")]


@pytest.mark.parametrize("case,extra,fragment", SUBPROCESS, ids=[c[0] for c in SUBPROCESS])
def test_the_command_exits_2_with_one_line(case, extra, fragment, tmp_path):
    path = write_probe(tmp_path, extra) if not extra.startswith("?") else tmp_path / "cfg.yaml"
    if extra.startswith("?"):
        path.write_text(extra)
    done = fedsim_cli("run", str(path), cwd=tmp_path, env=cli_env(), timeout=120)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and fragment in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.yaml"]


# -- bad privacy settings (issue 49, item 6): refused in one line before anything is written -------------------------
UNIFORM = "train: {weighting: uniform}\n"
PRIVACY = [
    ("negative noise", UNIFORM + "privacy: {noise_multiplier: -1.0}", "privacy.noise_multiplier"),
    ("delta of 1", UNIFORM + "privacy: {noise_multiplier: 1.0, delta: 1.0}", "privacy.delta"),
    ("a budget the given noise passes", UNIFORM + "privacy: {noise_multiplier: 0.1, target_epsilon: 0.5}",
     "privacy.target_epsilon"),
    ("DP on a method whose server takes no mean", UNIFORM + "algorithm: fedproto\nprivacy: {noise_multiplier: 1.0}",
     "privacy:"),
    ("DP with samples weighting", "privacy: {noise_multiplier: 1.0}", "train.weighting"),
    ("no noise named", UNIFORM + "privacy: {dp: central}", "privacy:"),
    ("secure aggregation under a robust rule", "server: {aggregator: median}\nprivacy: {dp: none, secure_aggregation: true}",
     "server.aggregator"),
]


@pytest.mark.parametrize("case,extra,fragment", PRIVACY, ids=[c[0] for c in PRIVACY])
def test_a_bad_privacy_setting_is_one_line(case, extra, fragment, in_tmp, capsys):
    refused(capsys, in_tmp, ["run", str(write_probe(in_tmp, extra))], fragment)
