"""A run folder's layout (fedsim/core/runfiles.py): the config a folder stored is compared with a run's as that run
names it, by the settings a resume may not change (``fedsim run --resume`` and a sweep's status both ask)."""
from conftest import synthetic_tree

from fedsim.config import validate
from fedsim.core import runfiles


def test_a_stored_config_is_compared_by_what_a_resume_may_not_change(tmp_path):
    cfg = validate(synthetic_tree(tmp_path, "run"))
    moved = cfg.model_dump() | {"name": "elsewhere", "out_dir": "/another/folder"}  # a folder copied or renamed
    stored, changed = runfiles.compare_stored(moved, cfg)
    assert changed == [] and (stored.name, stored.out_dir) == (cfg.name, cfg.out_dir)
    assert runfiles.compare_stored(cfg.model_dump() | {"seed": cfg.seed + 1}, cfg)[1] == ["seed"]
    extended = cfg.model_dump()
    extended["train"]["rounds"] += 5  # a constant learning rate: the run may be extended
    stored, changed = runfiles.compare_stored(extended, cfg)
    assert changed == [] and stored.train.rounds == cfg.train.rounds + 5



def test_an_init_from_beside_the_run_is_compared_relative_to_its_runs_folder(tmp_path):
    """A runs folder moved whole (kept reproduction runs on a fresh clone): a run that started from a sibling run
    names it at another absolute path, which is not a change; another folder, or a sibling of another name, is."""
    cfg = validate(synthetic_tree(tmp_path, "run", **{"model.init_from": str(tmp_path / "first")}))
    moved = cfg.model_dump() | {"out_dir": "/machine/runs"}
    moved["model"]["init_from"] = "/machine/runs/first"
    stored, changed = runfiles.compare_stored(moved, cfg)
    assert changed == [] and stored.model.init_from == str(tmp_path / "first")
    for elsewhere in ("/machine/other/first", "/machine/runs/second", "/machine/runs"):
        moved["model"]["init_from"] = elsewhere
        assert runfiles.compare_stored(moved, cfg)[1] == ["model.init_from"]
    # Recorded relative to the directory fedsim ran from (kept runs, `fedsim reproduce`): the same sibling.
    moved = cfg.model_dump() | {"out_dir": "runs/reproduce"}
    moved["model"]["init_from"] = "runs/reproduce/first"
    assert runfiles.compare_stored(moved, cfg)[1] == []
    # A folder resumed where it was moved to keeps the path it stored: compared as it is, never re-anchored.
    kept = cfg.model_dump() | {"out_dir": "/machine/runs"}
    assert runfiles.compare_stored(kept, cfg)[1] == []
