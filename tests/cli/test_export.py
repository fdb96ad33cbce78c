"""``fedsim export`` (fedsim/cli/export.py): each client's complete model out of a run, loaded into the module as a
user loads it, scores that client's test data exactly as the run logged it: FedPer's shared body and personal head
joined, FedBABU's fine-tuned model, a user's LightningModule through ``load_from_checkpoint``."""
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import fedsim_cli, lightning_tree, per_client, synthetic_tree, write_yaml

from fedsim.cli.main import main
from fedsim.config import validate
from fedsim.data import load_dataset, to_float
from fedsim.errors import ConfigError
from fedsim.data.partition import Partition
from fedsim.models import build_model
from fedsim.models.lightning import FedClient, build_client, split_keys
from fedsim.simulate import run


def _finished(tree: dict):
    cfg = validate(tree)
    run(cfg)
    return cfg, Path(cfg.out_dir) / cfg.name


def _data(cfg):
    return load_dataset(cfg.data.dataset, cfg.data.root, cfg.data.download, options=cfg.data.options)


def _accuracy(module: torch.nn.Module, cfg, run_dir: Path, client: int) -> float:
    """The module's accuracy on the client's test data, as a user computes it: plain torch, no fedsim loop."""
    data = _data(cfg)
    partition = Partition.load(run_dir / "partition.npz")
    test = partition.test[client]
    labels = data.test_y[test] if partition.label_maps is None else partition.label_maps[client][data.test_y[test]]
    module.eval()
    with torch.no_grad():
        predicted = module(torch.as_tensor(to_float(data.test_x[test], data.mean, data.std))).argmax(dim=1).numpy()
    return float(np.float32(np.mean(predicted == labels)))


def _logged(run_dir: Path, round_idx: int, metric: str) -> dict[int, float]:
    return {r["client"]: r[metric] for r in per_client(run_dir) if r["round"] == round_idx}


@pytest.mark.parametrize("algorithm, fine_tuned", [("fedper", False), ("fedbabu", True)])
def test_an_exported_client_scores_its_test_data_exactly_as_the_run_logged(tmp_path, local_ray, algorithm, fine_tuned):
    cfg, run_dir = _finished(synthetic_tree(tmp_path, algorithm, algorithm=algorithm, **{"train.rounds": 2,
                                                                                         "train.eval_every": 1}))
    metric, data = "acc_personalized" if fine_tuned else "acc", _data(cfg)
    for round_idx in (1, 2):  # the run keeps both checkpoints
        out = tmp_path / f"export-{round_idx}"
        assert main(["export", str(run_dir), "--round", str(round_idx), "--out", str(out),
                     *(["--fine-tuned"] if fine_tuned else [])]) == 0
        logged = _logged(run_dir, round_idx, metric)
        for client in range(cfg.data.num_clients):
            module = build_client(cfg.model, data.num_classes, data.input_shape)  # FedClient around the mlp
            module.load_state_dict(torch.load(out / f"client-{client}.pt"))
            assert _accuracy(module, cfg, run_dir, client) == logged[client], (round_idx, client)
            restored = FedClient.load_from_checkpoint(out / f"client-{client}.ckpt",
                                                      net=build_model("mlp", data.num_classes, data.input_shape))
            assert restored.state_dict().keys() == module.state_dict().keys()
            assert all(torch.equal(restored.state_dict()[k], v) for k, v in module.state_dict().items())
    # Shared and personal parts joined: FedPer's clients differ in their heads only; fine-tuned FedBABU models
    # (eval.finetune_part: full) in their bodies too.
    head = {f"net.{key}" for key in split_keys(module, cfg.model).head}
    first, second = (torch.load(out / f"client-{c}.pt") for c in (0, 1))
    differ = {key for key in first if not torch.equal(first[key], second[key])}
    assert differ and (differ <= head) != fine_tuned


def test_a_round_no_checkpoint_keeps_is_refused_naming_the_kept_ones(tmp_path, local_ray, capsys):
    cfg, run_dir = _finished(synthetic_tree(tmp_path, "kept", **{"train.rounds": 3, "train.eval_every": 3,
                                                                  "engine.full_checkpoint_every": 1}))
    assert main(["export", str(run_dir), "--round", "1"]) == 2
    err = capsys.readouterr().err
    assert "round 1 is not kept" in err and "rounds kept: 2, 3;" in err
    assert main(["export", str(run_dir), "--clients", "9"]) == 2
    assert "--clients: 9 is not a client" in capsys.readouterr().err
    assert main(["export", str(run_dir)]) == 0  # the newest: round 3, the run's final models
    assert sorted(p.name for p in (run_dir / "export" / "round-0003").iterdir()) == \
        sorted(f"client-{c}.{ext}" for c in range(cfg.data.num_clients) for ext in ("pt", "ckpt"))


def test_a_users_lightning_module_loads_from_checkpoint_only_with_trust(tmp_path, capsys):
    from user_plugins import TwoPartModule

    tree = lightning_tree(tmp_path, "TwoPartModule")
    ran = fedsim_cli("run", str(write_yaml(tmp_path / "lm.yaml", tree)), "--quiet")  # its workers import tests/
    assert ran.returncode == 0, ran.stderr
    cfg, run_dir = validate(tree), tmp_path / tree["name"]
    assert main(["export", str(run_dir), "--clients", "1"]) == 2
    assert "--trust-plugins" in capsys.readouterr().err
    assert main(["export", str(run_dir), "train.rounds=5", "--clients", "1", "--trust-plugins"]) == 2
    assert "train.rounds: fedsim export takes only the plug-ins the run's config names" in capsys.readouterr().err
    assert main(["export", str(run_dir), "--clients", "1", "--fine-tuned", "--trust-plugins"]) == 0
    logged = _logged(run_dir, 2, "acc_personalized")[1]
    assert f"(acc_personalized {100 * logged:.2f}%; the run logged {100 * logged:.2f}%)" in capsys.readouterr().out
    module = TwoPartModule.load_from_checkpoint(run_dir / "export" / "round-0002-fine-tuned" / "client-1.ckpt")
    assert _accuracy(module, cfg, run_dir, 1) == logged


def test_the_refusal_of_a_folders_code_names_export_and_only_the_fixes_export_takes(tmp_path, capsys):
    run_dir = tmp_path / "lm"
    run_dir.mkdir()
    write_yaml(run_dir / "config.yaml", lightning_tree(tmp_path, "TwoPartModule"))
    assert main(["export", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "fedsim export imports it only if you trust this folder: pass --trust-plugins, or give " in err, err
    fix = err.rsplit("or give ", 1)[1].split(" on the command line")[0]  # KEY=PLUGIN, as export's arguments take it
    assert main(["export", str(run_dir), fix]) == 2  # accepted: refused next for the plug-in the folder names after it
    assert fix not in capsys.readouterr().err


def test_the_documented_re_score_of_an_exported_client_with_client_split_is_exact(tmp_path, capsys, monkeypatch):
    """docs/configuration.md's example, run as written on a run of a user's module trusted by naming it: the
    accuracy of the exported model on client_split's tensors is the one metrics.jsonl holds, bit for bit."""
    tree = lightning_tree(tmp_path, "TwoPartModule", **{"data.validation": 0.2})
    ran = fedsim_cli("run", str(write_yaml(tmp_path / "lm.yaml", tree)), "--quiet")  # its workers import tests/
    assert ran.returncode == 0, ran.stderr
    run_dir = tmp_path / tree["name"]
    plugins = [f"{key}={value}" for key, value in (("model.client", "user_plugins:TwoPartModule"),
                                                   ("data.dataset", "user_plugins:blobs"),
                                                   ("data.partition", "user_plugins:round_robin"))]
    assert main(["export", str(run_dir), *plugins, "--clients", "2"]) == 0  # trusted by naming its code
    text = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    example = text.split("re-scores exactly:\n\n```python\n")[1].split("```")[0]
    # The page's module, run and client 3 at round 10 -> this test's, client 2 (its accuracy below 100%) at round 2.
    for documented, here in (("my_module", "user_plugins"), ("SmallCNN", "TwoPartModule"), ("client-3", "client-2"),
                             ("runs/own-module", str(run_dir)), ("round-0010", "round-0002"),
                             (', 3, "test"', ', 2, "test"'), ("client 3:", "client 2:")):
        assert documented in example
        example = example.replace(documented, here)
    capsys.readouterr()
    namespace: dict = {}
    exec(compile(example, "configuration.md", "exec"), namespace)
    record = [r for r in per_client(run_dir) if r["round"] == 2 and r["client"] == 2][0]
    assert namespace["accuracy"] == record["acc"] < 1
    assert capsys.readouterr().out.strip() == f"client 2: {100 * record['acc']:.2f}%"

    from fedsim.data import client_split

    x, y = client_split(run_dir, 2, "validation", trust_plugins=True)
    assert len(y) == record["n_validation"]
    with pytest.raises(ValueError, match="split 'val' is none of train, validation, test"):
        client_split(run_dir, 2, "val", trust_plugins=True)
    with pytest.raises(ConfigError, match="client_split imports it only if you trust this folder"):
        client_split(run_dir, 2, "test")


def test_fine_tuned_is_refused_where_evaluation_does_not_personalize(tmp_path, capsys):
    tree = synthetic_tree(tmp_path, "plain", **{"eval.finetune_epochs": 0})
    write_yaml(tmp_path / "plain" / "config.yaml", tree)  # all a refusal before any file is read needs
    assert main(["export", str(tmp_path / "plain"), "--fine-tuned"]) == 2
    assert "--fine-tuned:" in capsys.readouterr().err


def test_a_model_scored_with_logits_beside_the_networks_is_refused():
    """FedRoD scores with its generic and personal logits added: the network alone is not the scored model."""
    from types import SimpleNamespace

    from fedsim.cli.export import _take
    from fedsim.errors import ConfigError

    runtime = SimpleNamespace(algorithm=SimpleNamespace(name="fedrod"))
    seen = _take(runtime, "initial", {})
    seen(SimpleNamespace(logit_adjustment=None), "fine_tuned")  # another stage: not taken, nothing checked
    with pytest.raises(ConfigError, match="fedrod: scores each client with its own logits"):
        seen(SimpleNamespace(logit_adjustment=lambda representation, logits: logits), "initial")
