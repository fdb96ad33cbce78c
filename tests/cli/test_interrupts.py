"""Ctrl-C and SIGTERM during a run: one line with the resume command, which works as printed."""
import pytest
from conftest import lightning_tree, synthetic_tree

from fedsim.cli.interrupts import Interrupted, Terminated, interrupts_named
from fedsim.config import validate


@pytest.mark.parametrize("tree, flag", [(synthetic_tree, ""), (lightning_tree, " --trust-plugins")])
def test_the_resume_command_names_trust_plugins_when_the_config_names_code(tmp_path, tree, flag):
    cfg = validate(tree(tmp_path, "TwoPartModule") if tree is lightning_tree else tree(tmp_path, "x"))
    with pytest.raises(Interrupted) as info:
        with interrupts_named(cfg):
            raise Terminated()
    assert info.value.exit_code == 143
    assert str(info.value) == f"interrupted; continue with `fedsim run --resume {tmp_path / cfg.name}{flag}`"
