"""What an installed fedsim carries: the configs and the papers' data `fedsim reproduce` reads ship inside the
package, so it reproduces the papers from a built wheel in any folder, with no source checkout around it."""
import os
import subprocess
import sys
import zipfile

from conftest import TESTS

REPO = TESTS.parent
CONFIGS = ("fedsim/reproduce/configs/cpu/fedper_cifar10.yaml", "fedsim/reproduce/configs/cpu/fedbabu_cifar100.yaml",
           "fedsim/reproduce/configs/paper/fedper_mobilenet_cifar10.yaml",
           "fedsim/reproduce/configs/paper/fedbabu_mobilenet_cifar100.yaml",
           "fedsim/reproduce/papers/index.yaml", "fedsim/reproduce/papers/fedper/paper.yaml",
           "fedsim/reproduce/papers/fedper/claims.yaml", "fedsim/reproduce/papers/fedper/passages.md",
           "fedsim/reproduce/papers/fedbabu/findings.md", "fedsim/reproduce/papers/fedbabu/sources.md",
           "fedsim/reproduce/papers/leaderboard/leaderboard.yaml", "fedsim/reproduce/papers/leaderboard/pfllib.md",
           "fedsim/reproduce/configs/cpu/leaderboard_shakespeare.yaml",
           "fedsim/reproduce/papers/leaderboard_shakespeare/leaderboard.yaml",
           "fedsim/reproduce/papers/leaderboard_shakespeare/page.md",
           "fedsim/reproduce/configs/cpu/leaderboard_speakers.yaml",
           "fedsim/reproduce/papers/leaderboard_speakers/leaderboard.yaml",
           "fedsim/reproduce/papers/leaderboard_speakers/page.md")


def test_a_built_wheel_reproduces_from_a_folder_outside_the_checkout(tmp_path, data_root):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist")], check=True, capture_output=True, timeout=300)
    [wheel] = (tmp_path / "dist").glob("fedsim-*.whl")
    with zipfile.ZipFile(wheel) as z:
        assert set(CONFIGS) <= set(z.namelist())
        z.extractall(tmp_path / "site")  # a wheel's files are what pip installs
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "FEDSIM_DATA": str(data_root)}
    code = "import sys, fedsim.cli.main as m; print(m.__file__, file=sys.stderr); sys.exit(m.main())"
    out = subprocess.run([sys.executable, "-c", code, "reproduce", "fedper", "--only", "k4", "--dry-run", "--seeds", "1",
                          "--runs", "runs"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr.startswith(str(tmp_path / "site"))  # the wheel's code ran, not the checkout's
    assert "fedper-cpu-k4-fedper-s0: new" in out.stdout
