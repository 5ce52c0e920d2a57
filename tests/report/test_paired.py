import json
import math

import pytest
from scipy import stats

from widenet_ds.report.paired import mean_interval, paired_difference


def test_the_interval_is_scipys_paired_t_interval():
    a, b = [6.31, 6.12, 6.25, 6.40], [6.33, 6.13, 6.26, 6.38]
    result = paired_difference(a, b)
    differences = [x - y for x, y in zip(a, b)]
    low, high = stats.t.interval(0.95, len(a) - 1, loc=stats.tmean(differences), scale=stats.sem(differences))
    assert result.mean == pytest.approx(sum(differences) / 4)
    assert (result.low, result.high) == (pytest.approx(low), pytest.approx(high))
    # and the same decision as scipy's paired t-test at 5%
    assert result.resolved == (stats.ttest_rel(a, b).pvalue < 0.05)


def test_a_hand_computed_interval_resolves_only_when_it_excludes_zero():
    # differences 1, 2, 3: mean 2, sd 1, t_{0.975, 2} = 4.3027: 2 +- 4.3027 / sqrt(3) = [-0.484, 4.484]
    result = paired_difference([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    assert (result.mean, round(result.low, 3), round(result.high, 3)) == (2.0, -0.484, 4.484)
    assert not result.resolved and result.verdict() == "not resolved"
    tight = paired_difference([2.0, 2.1, 1.9], [0.0, 0.0, 0.0])
    assert tight.resolved and tight.low > 0 and tight.verdict() == "resolved"
    assert mean_interval([2.0, 2.1, 1.9]) == tight
    assert json.loads(json.dumps({**vars(tight), "resolved": tight.resolved})) == {**vars(tight), "resolved": True}


def test_one_seed_has_no_interval_and_unpaired_input_is_refused():
    single = paired_difference([1.0], [0.0])
    assert single.mean == 1.0 and math.isnan(single.low) and not single.resolved
    assert "no interval" in single.format()
    with pytest.raises(ValueError, match="same seeds"):
        paired_difference([1.0, 2.0], [1.0])
