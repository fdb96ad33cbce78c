import math

import pytest

from fedsim.metrics import summarize


def test_keys_and_population_std():
    s = summarize([2, 4, 4, 4, 5, 5, 7, 9])  # textbook case: population std 2, sample std would be 2.14
    assert set(s) == {"mean", "std", "min", "max", "p10", "worst10_mean", "jain"}
    assert (s["mean"], s["std"], s["min"], s["max"]) == (5.0, 2.0, 2.0, 9.0)


def test_p10_is_linear_interpolation():
    # position 0.1 * (5 - 1) = 0.4 between 0 and 10
    assert summarize([40, 0, 30, 10, 20])["p10"] == pytest.approx(4.0)
    assert summarize([0.3])["p10"] == pytest.approx(0.3)


@pytest.mark.parametrize(("n", "expected"), [(20, 1.5), (7, 1.0), (30, 2.0), (1, 1.0)])
def test_worst10_mean_takes_ceil_ten_percent(n, expected):
    # values n..1 (unsorted input): 20 clients -> worst 2 (1, 2); 7 -> worst 1;
    # 30 -> worst 3, not 4 (0.1 * 30 is just above 3 in floats)
    values = [float(v) for v in range(n, 0, -1)]
    assert summarize(values)["worst10_mean"] == pytest.approx(expected)


def test_jain_index():
    assert summarize([0.5, 0.5, 0.5, 0.5])["jain"] == pytest.approx(1.0)
    assert summarize([1.0, 0.0, 0.0, 0.0])["jain"] == pytest.approx(0.25)  # one client has everything: 1/n
    assert summarize([1.0, 2.0, 3.0])["jain"] == pytest.approx(36 / 42)  # (1+2+3)^2 / (3 * (1+4+9))
    assert summarize([0.0, 0.0])["jain"] == 1.0


def test_empty_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        summarize([])


def test_all_values_are_plain_floats():
    # The engine writes these dicts to rounds.jsonl and summary.json.
    assert all(isinstance(v, float) and math.isfinite(v) for v in summarize([0.1, 0.7, 0.4]).values())
