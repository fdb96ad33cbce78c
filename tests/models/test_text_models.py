"""The character models (fedsim.models.text) as split networks, under both client loops and in a whole run on
Shakespeare clients."""
import json

import numpy as np
import pytest
import torch
from conftest import crash_mid_run, fedsim_cli, per_client, plan_for, shakespeare_tree, train_one, write_yaml

from fedsim.algorithms import WEIGHTS
from fedsim.cli.main import main
from fedsim.client.runtime import ClientRuntime
from fedsim.config import ModelConfig, validate
from fedsim.engine.runfolder_checks import load_run_config
from fedsim.errors import ConfigError
from fedsim.models import build_model
from fedsim.models.lightning import build_client
from fedsim.models.packed import why_unpackable
from fedsim.simulate import run

WINDOWS = torch.randint(0, 80, (3, 1, 1, 80)).float()


@pytest.mark.parametrize("name, width, depth", [("char_lstm", 256, 2), ("char_transformer", 64, 2)])
def test_a_character_model_ends_in_the_output_layer_over_the_vocabulary(name, width, depth):
    net = build_model(name, 80, (1, 1, 80))
    assert net(WINDOWS).shape == (3, 80) and net.features(WINDOWS).shape == (3, width)
    assert len(net.blocks) == depth and net.output_layer is net.classifier
    assert net.split_keys(1)[1] == ["classifier.weight", "classifier.bias"]  # the personal head by default
    assert why_unpackable(net) is not None  # engine.pack trains their clients one after another
    base, head = net.split_keys(2)
    assert all(k.startswith((f"blocks.{depth - 1}.", "classifier.")) for k in head)
    assert all(k.startswith(("stem.", "blocks.0.")) for k in base)


def test_leafs_lstm_has_its_sizes():
    net = build_model("char_lstm", 80, (1, 1, 80))
    assert net.stem[1].weight.shape == (80, 8)
    assert [(b.lstm.input_size, b.lstm.hidden_size) for b in net.blocks] == [(8, 256), (256, 256)]


def test_model_options_size_the_text_models():
    lstm = build_model("char_lstm", 80, (1, 1, 80), options={"embedding": 4, "hidden": 16, "layers": 3})
    assert lstm.stem[1].weight.shape == (80, 4) and lstm(WINDOWS).shape == (3, 80)
    assert [(b.lstm.input_size, b.lstm.hidden_size) for b in lstm.blocks] == [(4, 16), (16, 16), (16, 16)]
    transformer = build_model("char_transformer", 80, (1, 1, 80), options={"width": 16, "heads": 2, "layers": 1})
    assert len(transformer.blocks) == 1 and transformer.features(WINDOWS).shape == (3, 16)
    layer = transformer.blocks[0].layer.self_attn
    assert (layer.embed_dim, layer.num_heads) == (16, 2)


@pytest.mark.parametrize("name, options, message", [
    ("char_lstm", {"hiden": 16}, "model.options: char_lstm has no size 'hiden'; give embedding, hidden, layers"),
    ("char_lstm", {"layers": 0}, "model.options.layers: char_lstm needs a whole number >= 1, got 0"),
    ("char_lstm", {"hidden": 2.5}, "model.options.hidden: char_lstm needs a whole number >= 1, got 2.5"),
    ("char_transformer", {"heads": 5}, "model.options.heads: 5 heads do not divide width 64"),
    ("cnn4", {"hidden": 16}, "model.options: cnn4 takes no options"),
])
def test_bad_model_options_name_their_field(name, options, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        build_model(name, 80, (1, 1, 80) if name != "cnn4" else (3, 32, 32), options=options)


def test_model_options_are_refused_beside_a_module_of_the_users_own():
    model = ModelConfig(client="user_plugins:TwoPartModule", options={"hidden": 16})
    with pytest.raises(ConfigError, match="^model.options: options of model.name's model \\(sizes, LoRA settings\\), which TwoPartModule"):
        build_client(model, 80, (1, 1, 80))


def test_the_transformer_is_causal():
    net = build_model("char_transformer", 80, (1, 1, 80)).eval()
    changed = WINDOWS.clone()
    changed[:, :, :, -1] = (changed[:, :, :, -1] + 1) % 80  # only the last character differs
    with torch.no_grad():
        embedded, moved = net.stem(WINDOWS), net.stem(changed)
        early, late = net.blocks[0](embedded), net.blocks[0](moved)
    assert torch.equal(early[:, :-1], late[:, :-1]) and not torch.equal(early[:, -1], late[:, -1])


def runtime(tmp_path, data_root, model: str, loop: str) -> ClientRuntime:
    plan = plan_for(validate(shakespeare_tree(tmp_path, data_root, model, algorithm="fedavg",
                                              model__client_loop=loop)))
    return ClientRuntime(plan, dict(enumerate(plan.clients)))


@pytest.mark.parametrize("model", ["user_plugins:tiny_char_lstm", "user_plugins:tiny_char_transformer"])
def test_the_fabric_and_trainer_loops_train_a_character_model_alike(tmp_path, data_root, model):
    fabric, trainer = (runtime(tmp_path, data_root, model, loop) for loop in ("fabric", "trainer"))
    start = {WEIGHTS: fabric.plan.model.initial["shared"]}
    (a, loss_a), (b, loss_b) = train_one(fabric, start, 0, 1), train_one(trainer, start, 0, 1)
    assert np.isfinite(loss_a) and loss_a == loss_b and all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a[WEIGHTS], start[WEIGHTS])


def test_a_tiny_run_on_three_hamlet_characters_scores_each(tmp_path, data_root):
    config = write_yaml(tmp_path / "shk.yaml", shakespeare_tree(tmp_path, data_root, data__validation=0.1))
    done = fedsim_cli("run", str(config))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [r for r in per_client(tmp_path / "shk") if r["round"] == 2]
    assert sorted(r["client"] for r in rows) == [0, 1, 2] and all(0 <= r["acc"] <= 1 for r in rows)
    for r in rows:  # per character, on test and on the validation text
        assert r["perplexity"] == pytest.approx(np.exp(r["loss"]))
        assert r["validation_perplexity"] == pytest.approx(np.exp(r["validation_loss"]))
    about = json.loads((tmp_path / "shk" / "dataset.json").read_text())["about"]  # how the clients were built
    assert about["num_clients"] == len(about["chars_per_client"]) >= 3 and about["vocabulary_size"] == 80
    shown = fedsim_cli("run", str(config), "--dry-run", "--overwrite")  # the folder exists: a dry run writes nothing
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert f"  data         variant modern, num clients {about['num_clients']}, " in shown.stdout and "vocabulary size 80" in shown.stdout


def test_the_dry_run_says_what_a_method_assuming_batchnorm_does_on_a_text_model(tmp_path, data_root, capsys):
    tree = shakespeare_tree(tmp_path, data_root, sweep={"algorithm": ["fedavg", "fedbn", "apfl"]})
    assert main(["run", str(write_yaml(tmp_path / "shk.yaml", tree)), "--dry-run"]) == 0
    blocks = capsys.readouterr().out.split(": ok (dry run")[1:]
    said = [[line.strip() for line in block.splitlines() if line.startswith("  batchnorm ")] for block in blocks]
    assert said[0] == []  # fedavg assumes nothing of BatchNorm
    assert said[1] == ["batchnorm    fedbn keeps each BatchNorm layer on its client, and this model has none: every "
                       "layer is shared, so it trains and averages as fedavg does"]
    assert len(said[2]) == 1 and said[2][0].startswith("batchnorm    apfl runs its personal model v on BatchNorm")
    tree["model"]["batchnorm"] = "personal"
    assert main(["run", str(write_yaml(tmp_path / "bn.yaml", tree)), "--dry-run"]) == 0
    assert "batchnorm    model.batchnorm: personal has nothing to act on: the model has no BatchNorm layer" in \
        capsys.readouterr().out


@pytest.mark.slow
def test_a_text_run_killed_mid_run_resumes_bit_identical(tmp_path, data_root, local_ray):
    """As the image runs (tests/engine/test_reliability.py): the CLI is killed with its Ray after round 1 of 3, a
    later process resumes the folder to the same per-client accuracy and perplexity as a run never interrupted."""
    tree = shakespeare_tree(tmp_path, data_root, "char_lstm", **{
        "name": "crashy", "train.rounds": 3, "engine.checkpoint_every": 1, "model.options": {"embedding": 4, "hidden": 16}})
    done = crash_mid_run(write_yaml(tmp_path / "shk.yaml", tree), tmp_path / "crashy", after_rounds=1)
    assert 1 <= done < 3
    straight = run(validate({**tree, "name": "straight"})).run_dir
    run(load_run_config(tmp_path / "crashy"), resume=True)
    resumed = per_client(tmp_path / "crashy")
    assert resumed == per_client(straight) and {r["round"] for r in resumed} == {1, 2, 3}
    assert all("perplexity" in r for r in resumed)
