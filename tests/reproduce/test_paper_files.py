"""A paper as data (fedsim/reproduce/papers/<paper>/): every shipped folder loads, a malformed file is refused with
one line naming the file and the field, the override values computed from the base or naming another run, and a
new paper added as a folder and a line of the index."""
import shutil

import pytest

from conftest import paper_folder
from fedsim.errors import ConfigError
from fedsim.reproduce import PAPERS
from fedsim.reproduce.claims import RunFolder
from fedsim.reproduce.paper_files import PAPERS_DIR, FromBase, load_paper, load_papers, passages


def test_every_paper_of_the_index_loads_in_its_order():
    assert list(PAPERS) == ["fedper", "fedbabu"]  # REPRODUCTION.md's order
    # and the privacy question, whose page is docs/privacy.md's section (fedsim.reproduce.privacy loads it)
    assert {p.name for p in PAPERS_DIR.iterdir() if (p / "claims.yaml").exists()} == {*PAPERS, "privacy"}


def _refusal(folder, key: str = "fedper") -> str:
    with pytest.raises(ConfigError) as err:
        load_paper(key, folder)
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("old, new, field, says", [
    ("{label: FedAvg, run: k4-fedavg}", "{label: FedAvg, run: k4-fedavg, metrc: acc}", "k4.arms.0.metrc",
     "Extra inputs are not permitted"),
    ("{label: FedAvg, run: k4-fedavg}", "{lable: FedAvg, run: k4-fedavg}", "k4.arms.0.label", "Field required"),
    ("    - {greater: [FedPer, FedAvg], by: 10}", "    - {greater: [FedPer, FedAvg], by: ten}", "k4.tests.0.by",
     "expected a number (got 'ten')"),
    ("    - {greater: [FedPer, FedAvg], by: 10}", "    - {greater: [FedPer, FedAvgg], by: 10}", "k4: tests.0",
     "reads 'FedAvgg', which is not an arm of the claim (FedAvg, FedPer)"),
    ("    - {greater: [FedPer, FedAvg], by: 10}", "    - {trend: [FedPer, FedAvg], by: 10}", "k4.tests.0: trend",
     "takes no by (its options: margin, text)"),
    ("{label: FedAvg, run: k4-fedavg}", "{label: FedAvg, run: k4-fedavgg}", "k4.arms.0.run",
     "'k4-fedavgg' is not a run of paper.yaml"),
    ("{{deep-model}}", "{{deep-modle}}", "base-necessary.explanation", "cites {{deep-modle}}"),
])
def test_a_malformed_claim_file_is_refused_in_one_line_naming_the_file_and_the_field(tmp_path, old, new, field, says):
    def edit(text: str) -> str:
        assert old in text
        return text.replace(old, new, 1)

    message = _refusal(paper_folder(tmp_path, "fedper", edit))
    assert message.startswith(f"{tmp_path / 'fedper' / 'claims.yaml'}: {field}")
    assert says in message


def test_a_malformed_paper_file_is_refused_naming_the_file_and_the_field(tmp_path):
    folder = paper_folder(tmp_path, "fedbabu", lambda text: text.replace("scale_notes:", "scale_note:"), "paper.yaml")
    message = _refusal(folder, "fedbabu")
    assert message.startswith(f"{folder / 'paper.yaml'}: scale_note: Extra inputs are not permitted")
    folder = paper_folder(tmp_path / "b", "fedbabu", lambda text: text.replace("max(1, train.rounds // 4)",
                                                                               "__import__('os')"), "paper.yaml")
    assert "runs.lg_fedavg: " in _refusal(folder, "fedbabu")


def test_a_value_from_the_base_is_integer_arithmetic_over_its_keys():
    tau10 = FromBase("max(1, train.rounds * train.local_epochs // 10)")
    assert tau10({"train": {"rounds": 20, "local_epochs": 4}}) == 8
    assert tau10({"train": {"rounds": 2, "local_epochs": 1}}) == 1
    with pytest.raises(ConfigError, match="has no train.epochs"):
        FromBase("train.epochs // 2")({"train": {}})
    for unsafe in ("__import__('os').system('true')", "train.rounds ** 99", "open('x')"):
        with pytest.raises(ValueError, match="only whole numbers"):
            FromBase(unsafe)


def test_the_shipped_data_reads_as_the_runner_takes_it():
    babu = PAPERS["fedbabu"]
    assert babu.runs["lg_fedavg"]["model.init_from"] == RunFolder("fedavg")
    assert babu.overrides("pfllib-fedper", "paper")["train.rounds"] == 2000  # scaled: pfllib-* at paper scale
    assert "engine.workers" not in babu.overrides("pfllib-fedper", "cpu")
    # A passage is cited into every text that names it, and nests: FedPer's optimizer note names why the CPU base
    # trained at momentum 0.9.
    why = passages(PAPERS_DIR / "fedper")["cpu-optimizer-why"]
    assert all(why in claim.regime for claim in PAPERS["fedper"].claims)
    assert "<!--" not in PAPERS["fedbabu"].claim("momentum").explanation


def test_a_new_paper_is_a_folder_and_a_line_of_the_index(tmp_path):
    papers = tmp_path / "papers"
    shutil.copytree(PAPERS_DIR / "fedper", papers / "fedper-again")
    (papers / "index.yaml").write_text("papers: [fedper-again]\n")
    loaded = load_papers(papers / "index.yaml")
    assert list(loaded) == ["fedper-again"]
    assert [c.id for c in loaded["fedper-again"].claims] == [c.id for c in PAPERS["fedper"].claims]
    (papers / "index.yaml").write_text("paper: [fedper-again]\n")
    with pytest.raises(ConfigError, match=r"index.yaml: papers: Field required"):
        load_papers(papers / "index.yaml")
