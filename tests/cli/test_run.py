"""`fedsim run`'s one-line summary of a finished run."""
from fedsim.cli.run import summary_line


def stats(mean: float) -> dict:
    return {"mean": mean, "std": 0.01, "min": mean - 0.1}


def test_the_summary_line_shows_the_accuracy_the_protocol_reports_and_the_time_to_accuracy():
    summary = {"acc": stats(0.1882), "acc_personalized": stats(0.6185), "reported": "acc_personalized",
               "system": {"time_to_accuracy": {"acc": {"0.5": None}, "acc_personalized": {"0.5": 812.25}}}}
    line = summary_line("babu", summary, "runs/babu")
    assert line.splitlines() == ["babu: mean client accuracy 61.85% personalized (std 1.00, min 51.85) -> runs/babu",
                                 "  simulated time to accuracy: 50% initial never reached, 50% personalized at 812.2 s"]


def test_a_summary_written_before_it_named_its_accuracy_shows_the_initial_one():
    assert summary_line("old", {"acc": stats(0.5)}, "runs/old") == (
        "old: mean client accuracy 50.00% initial (std 1.00, min 40.00) -> runs/old")
