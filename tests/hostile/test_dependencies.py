"""Bad input that used to reach the user as a dependency's own error (issue 66, item 4): Python's, the OS's, tarfile's
or a traceback. Each is one line naming the setting or file and the fix, exit 2, before anything is written. No Ray
is started here."""
import json
import math
import tarfile

import pytest
from conftest import make_run, refused, write_probe

from fedsim.errors import ConfigError


@pytest.mark.parametrize("out, fragment", [("", "--out: '' is not a folder name"),
                                           ("a\nb", "is not a folder name"),
                                           ("FILE", "exists and is not a folder")])
def test_export_out_that_is_no_folder_is_refused_before_the_run_is_read(in_tmp, capsys, out, fragment):
    (in_tmp / "FILE").write_text("")
    refused(capsys, in_tmp, ["export", str(in_tmp / "missing-run"), "--out", out], fragment)


def test_an_out_dir_with_a_newline_names_out_dir(in_tmp, capsys):
    refused(capsys, in_tmp, ["run", str(write_probe(in_tmp, out_dir=f"{in_tmp}/a\nb"))],
            "out_dir: holds a control character")


def test_a_data_root_that_is_a_link_loop_names_data_root(in_tmp, capsys, monkeypatch):
    (in_tmp / "loop1").symlink_to(in_tmp / "loop2")
    (in_tmp / "loop2").symlink_to(in_tmp / "loop1")
    monkeypatch.setenv("FEDSIM_DATA", str(in_tmp / "loop1"))
    refused(capsys, in_tmp, ["run", str(write_probe(in_tmp, "data: {dataset: cifar10, num_clients: 8}"))],
            "data.root: ")


def test_a_metrics_row_whose_client_is_a_list_is_named_by_export(tmp_path):
    from fedsim.cli.export import logged_accuracies

    run_dir = make_run(tmp_path, "r", "fedavg", [[0.5, 0.6]])
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"round": 1, "client": [0, 1], "acc": 0.5}) + "\n")
    with pytest.raises(ConfigError, match=r"metrics\.jsonl:3: not a client record \(client \[0, 1\]"):
        logged_accuracies(run_dir, 1, "acc")


@pytest.mark.parametrize("mtime", [math.nan, 1e300, -1.0], ids=["NaN", "1e300", "negative"])
def test_an_archive_member_with_an_impossible_time_is_refused(tmp_path, mtime):
    from fedsim.reproduce import archive

    run_dir = make_run(tmp_path / "made", "r", "fedavg", [[0.5, 0.6]])
    kept = tmp_path / "kept"
    kept.mkdir()
    with tarfile.open(archive.path_of(kept, "r"), "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name in archive.KEPT:
            info = tar.gettarinfo(run_dir / name, arcname=name)
            if math.isnan(mtime):  # tarfile writes no NaN itself: its PAX header as another writer would
                info.pax_headers = {"mtime": "nan"}
            else:
                info.mtime = mtime
            with open(run_dir / name, "rb") as f:
                tar.addfile(info, f)
    runs = tmp_path / "runs"
    runs.mkdir()
    with pytest.raises(ConfigError, match="has the time") as err:
        archive.restore(kept, runs, "r")
    assert "\n" not in str(err.value) and list(runs.iterdir()) == []
