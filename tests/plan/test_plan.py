"""What a RunPlan derives from its config and method."""
import pytest
from conftest import synthetic_tree

from fedsim.algorithms import algorithm_class
from fedsim.config import validate
from fedsim.plan import Population, RunPlan


@pytest.mark.parametrize("algorithm, evaluation, reported", [
    ("fedbabu", {"finetune_epochs": 1}, "acc_personalized"),  # FedBABU's protocol: the head tuned at evaluation
    ("fedprox_babu", {"finetune_epochs": 1}, "acc_personalized"),
    ("fedbabu", {"finetune_epochs": 0}, "acc"),  # not measured: the initial one
    ("fedper", {"finetune_epochs": 1}, "acc"),  # the model each client holds
    ("fedrep", {"personalize": "own_update", "finetune_epochs": 5}, "acc_personalized"),
])
def test_the_reported_accuracy_is_the_one_the_methods_protocol_reports(tmp_path, algorithm, evaluation, reported):
    cfg = validate(synthetic_tree(tmp_path, algorithm=algorithm, eval=evaluation))
    plan = RunPlan(cfg, algorithm_class(algorithm)(), None, (), 2, (1, 1, 1), Population(0))
    assert plan.reported_accuracy == reported


def test_images_that_are_not_square_plan_with_cnn4_and_a_model_sized_for_squares_is_refused(tmp_path, monkeypatch):
    import numpy as np
    from conftest import plan_for
    from PIL import Image

    from fedsim.errors import ConfigError

    monkeypatch.setenv("FEDSIM_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    for c in ("a", "b"):  # a torchvision-style folder of class folders: 48x40 images, no train/ and test/
        (tmp_path / "img" / c).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(rng.integers(0, 256, (48, 40, 3), dtype=np.uint8)).save(tmp_path / "img" / c / f"{i}.png")
    tree = synthetic_tree(tmp_path, data={"dataset": "imagefolder", "root": str(tmp_path / "img"), "test_split": 0.34,
                                          "partition": "iid", "num_clients": 2}, model={"name": "cnn4"})
    plan = plan_for(validate(tree))
    assert plan.input_shape == (3, 48, 40) and plan.test_sizes == [2, 2] and plan.train_sizes == [4, 4]
    tree["model"] = {"name": "user_plugins:square_only"}
    with pytest.raises(ConfigError, match=r"model.name: user_plugins:square_only cannot take the data's 3x48x40"):
        plan_for(validate(tree))


def test_the_noise_multiplier_is_read_from_one_place(tmp_path):
    from conftest import plan_for

    tree = synthetic_tree(tmp_path, **{"train.weighting": "uniform", "train.fraction": 0.5})
    tree["privacy"] = {"noise_multiplier": 0.8, "clip_norm": 2.0, "adaptive": {"count_noise": 1.0}}
    plan = plan_for(validate(tree))
    dp = plan.privacy.mechanism
    assert plan.privacy.summary["noise_multiplier"] == dp.noise_multiplier == 0.8 and dp.clip_norm == 2.0 and dp.central
    assert dp.cohort == 4 and not dp.poisson and dp.update_multiplier > 0.8
    assert plan.for_workers().user_level_dp == dp  # calibrated once, on the driver: a worker's plan holds no clients
    del tree["privacy"]
    plan = plan_for(validate(tree))
    assert plan.privacy is None and plan.for_workers().user_level_dp is None
