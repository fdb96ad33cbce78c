"""fedsim/client/rehearsal.py: one training step of the client module in the driver, before Ray starts."""
from conftest import lightning_tree, plan_for

from fedsim.client.rehearsal import rehearse
from fedsim.config import validate


def test_the_rehearsal_writes_nothing_into_the_run_folder(tmp_path):
    """A ModelCheckpoint under the Trainer loop saves at the end of every fit: the rehearsal's lands in a scratch
    folder, so --dry-run leaves the run folder unwritten and the run that follows is not refused as existing."""
    tree = lightning_tree(tmp_path, "TwoPartModule", model__client_loop="trainer",
                          model__callbacks=["pytorch_lightning.callbacks.ModelCheckpoint"])
    plan = plan_for(validate(tree))
    rehearse(plan)
    assert not (tmp_path / plan.cfg.name).exists()


def test_throughput_times_the_modules_steps_and_leaves_the_run_folder_unwritten(tmp_path):
    from fedsim.client.rehearsal import throughput

    plan = plan_for(validate(lightning_tree(tmp_path, "TwoPartModule")))
    rate = throughput(plan)
    assert rate is not None and rate > 0
    assert not (tmp_path / plan.cfg.name).exists()
