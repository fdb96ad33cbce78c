"""A run's parts (the first invocation and each resume) and their wall time: summary.json's wall_seconds is the
whole run's, not the resumed part's alone."""
import json
import time
from types import SimpleNamespace

from fedsim.metrics.parts import Parts


def test_a_resumed_runs_wall_time_counts_every_part_and_survives_a_kill(tmp_path):
    first = Parts(tmp_path, "2026-12-05T08:00:00Z", 0)
    first.reached(1)
    first.reached(2)
    first.record(SimpleNamespace(started=time.perf_counter() - 5.0))  # its checkpoint at round 2; then killed
    second = Parts(tmp_path, "2026-12-05T09:00:00Z", 2)
    second.reached(3)
    second.record(SimpleNamespace(started=time.perf_counter() - 3.0))
    summary = second.summary()
    assert [(p["started_at"], p["from_round"], p["to_round"]) for p in summary["parts"]] == [
        ("2026-12-05T08:00:00Z", 1, 2), ("2026-12-05T09:00:00Z", 3, 3)]
    assert summary["parts"][0]["seconds"] >= 5.0 and summary["parts"][1]["seconds"] >= 3.0
    assert summary["wall_seconds"] == sum(p["seconds"] for p in summary["parts"])
    assert json.loads((tmp_path / "parts.json").read_text()) == summary["parts"]
