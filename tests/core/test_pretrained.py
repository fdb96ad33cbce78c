"""The pretrained encoder's files: found without importing the package's code, each checked against its sha256."""
import os
import shutil
import sys

import pytest

from fedsim.core import pretrained
from fedsim.errors import ConfigError, DataError


def test_the_files_are_found_and_their_hashes_match_without_running_the_package():
    sys.modules.pop(pretrained.PACKAGE, None)
    for name in pretrained.SHA256:
        assert pretrained.checked_file(name).is_file()
    assert pretrained.PACKAGE not in sys.modules


def test_a_changed_weights_file_is_refused_by_name(tmp_path, monkeypatch):
    copy = tmp_path / "model"
    copy.mkdir()
    shutil.copy(pretrained.minilm_folder() / "config.json", copy)
    with open(copy / "config.json", "a") as handle:
        handle.write(" ")
    monkeypatch.setattr(pretrained, "minilm_folder", lambda: copy)
    with pytest.raises(DataError, match=r"config.json has sha256 .* not the pinned .* reinstall"):
        pretrained.checked_file("config.json")


def test_a_missing_package_is_refused_with_the_install_fix(monkeypatch):
    monkeypatch.setattr(pretrained, "DISTRIBUTION", "gt-no-such-package")
    with pytest.raises(ConfigError, match=r"model.name: minilm .* not installed; pip install 'fedsim\[text\]'"):
        pretrained.minilm_folder()


def test_the_offline_switches_are_set(monkeypatch):
    for name in pretrained.OFFLINE_ENV:
        monkeypatch.delenv(name, raising=False)
    pretrained.force_offline()
    assert all(os.environ[name] == "1" for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def test_a_hub_imported_before_the_switches_goes_offline_too(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    pretrained.force_offline()
    assert constants.HF_HUB_OFFLINE is True
