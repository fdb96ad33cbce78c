"""The leaderboard's statistics: paired t-test p-values, Holm's step-down adjustment and Bonferroni intervals."""
import math

import pytest
from scipy import stats

from fedsim.metrics.confidence import holm, mean_ci, paired_p_value, simultaneous_ci


def test_holm_multiplies_the_ith_smallest_by_m_minus_i_and_keeps_the_order():
    adjusted = holm({"a": 0.01, "b": 0.04, "c": 0.03})
    assert adjusted == pytest.approx({"a": 0.03, "c": 0.06, "b": 0.06})  # b's 0.04 x 1 raised to c's 0.06
    assert holm({"a": 0.6, "b": 0.9}) == {"a": 1.0, "b": 1.0}  # capped at 1
    assert holm({}) == {}


def test_a_paired_p_value_is_students_and_defined_where_the_differences_do_not_vary():
    diffs = [-1.0, 3.0, -1.0, 1.0, 1.0]
    assert paired_p_value(diffs) == pytest.approx(stats.ttest_1samp(diffs, 0).pvalue)
    assert paired_p_value([2.0, 2.0, 2.0]) == 0.0 and paired_p_value([0.0, 0.0]) == 1.0
    assert paired_p_value([5.0]) == 1.0


def test_a_bonferroni_interval_widens_with_the_comparisons_and_is_students_at_one():
    values = [1.0, 2.0, 4.0, 3.0, 5.0]
    one, four = simultaneous_ci(values, 1), simultaneous_ci(values, 4)
    assert (one.low, one.high) == pytest.approx((mean_ci(values).low, mean_ci(values).high), rel=1e-3)
    half = stats.t.ppf(1 - 0.05 / 8, 4) * stats.tstd(values) / math.sqrt(5)
    assert (four.low, four.high) == pytest.approx((3 - half, 3 + half))
    assert simultaneous_ci([1.0], 3).low is None
