"""What of the GPU check can be checked without a GPU: the data subset, the CUDA determinism settings, the
record comparison and the paper slice's per-round work."""
import os
import sys
import zipfile
from pathlib import Path


BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))


def test_subset_takes_first_files_of_every_class():
    from gpu_subset import subset_members

    names = ["train/", "train/cat/", "train/cat/0002.png", "train/cat/0000.png", "train/cat/0001.png",
             "train/dog/0000.png", "test/cat/0000.png", "test/cat/0001.png", "readme.txt"]
    assert subset_members(names, {"train": 2, "test": 1}) == [
        "test/cat/0000.png", "train/cat/0000.png", "train/cat/0001.png", "train/dog/0000.png"]


def test_subset_zip_loads_as_the_dataset(tmp_path, data_root, monkeypatch):
    """Same name, same layout: fedsim reads the subset as CIFAR-10, with the per-class counts asked for."""
    import numpy as np

    from gpu_subset import write_subset

    from fedsim.data import load_dataset

    monkeypatch.setenv("FEDSIM_CACHE", str(tmp_path / "cache"))
    (tmp_path / "data").mkdir()
    assert write_subset(data_root / "cifar10-jpeg.zip", tmp_path / "data" / "cifar10-jpeg.zip", 3, 2) == 50
    with zipfile.ZipFile(tmp_path / "data" / "cifar10-jpeg.zip") as zf:
        assert zf.infolist()[0].compress_type == zipfile.ZIP_STORED
    data = load_dataset("cifar10", tmp_path / "data")
    assert np.bincount(data.train_y).tolist() == [3] * 10 and np.bincount(data.test_y).tolist() == [2] * 10


def test_make_cuda_deterministic(monkeypatch):
    import torch

    from fedsim.client.device import CUBLAS_WORKSPACE, make_cuda_deterministic

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
              torch.utils.deterministic.fill_uninitialized_memory)
    try:
        make_cuda_deterministic()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert not torch.utils.deterministic.fill_uninitialized_memory  # no NaN fill kernel per new tensor
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = before[2], before[3]
        torch.utils.deterministic.fill_uninitialized_memory = before[4]


def test_same_records_names_the_first_difference():
    from gpu_check import Measured, same_records

    a, b = Measured("a", 4, 0.0), Measured("b", 1, 0.0)
    a.records = [{"round": 2, "client": c, "acc": 0.5} for c in range(3)]
    b.records = [dict(r) for r in a.records]
    assert same_records(a, b)["identical"]
    b.records[1]["acc"] = 0.5000001
    assert same_records(a, b) == {"runs": ["a (4 workers)", "b (1 workers)"], "records": 3, "identical": False,
                                  "first_difference": (2, 1)}


def test_paper_slice_keeps_the_papers_work_per_round(tmp_path, data_root, monkeypatch):
    """The slice's round is the paper's round: 10 sampled clients x 500 images x tau = 4 at batch 50, and
    fine-tuning 5 epochs on each scored client, on the CIFAR-100 subset gpu_subset.py makes (made here)."""
    from gpu_check import PAPER, paper_slice
    from gpu_subset import SOURCES, write_subset

    subset = tmp_path / "subset"
    subset.mkdir()
    write_subset(data_root / SOURCES["cifar100"], subset / SOURCES["cifar100"], 50, 10)  # gpu_subset's defaults

    from fedsim.config import load_tree
    from fedsim.sweep.expand import expand_sweep
    from fedsim.engine.estimate import estimate

    monkeypatch.setenv("FEDSIM_DATA", str(data_root))
    paper = estimate(next(c for c in expand_sweep(load_tree(PAPER)) if c.algorithm.name == "fedbabu"))
    monkeypatch.setenv("FEDSIM_DATA", str(subset))
    cut = estimate(paper_slice(tmp_path, workers=4, gpu=0.25, rounds=10))
    assert (cut.model, cut.clients, cut.sampled_per_round, paper.sampled_per_round) == ("mobilenet_v1", 10, 10, 10)
    assert cut.train_sample_steps // cut.rounds == paper.train_sample_steps // paper.rounds == 10 * 500 * 4
    assert cut.train_sgd_steps // cut.rounds == paper.train_sgd_steps // paper.rounds
    assert cut.finetune_sample_steps == paper.finetune_sample_steps // 10  # 10 of the paper's 100 clients
