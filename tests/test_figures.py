"""helpers.notebook.figures: spreads, comparisons that call a difference only where the ranges separate, titles."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from helpers.notebook.backend import Backend  # noqa: E402
from helpers.notebook.figures import Spread, compare, timing_entries, timing_metric, titled  # noqa: E402


def test_spread_median_min_max():
    s = Spread([3.0, 1.0, 2.0, 10.0])
    assert (s.median, s.low, s.high, s.n) == (2.5, 1.0, 10.0, 4)
    assert s.format(1e3, " ms", 0) == "2500 ms (min 1000, max 10000, n=4)"
    assert s.relative_width == pytest.approx(9.0 / 2.5)
    with pytest.raises(ValueError):
        Spread([])


def test_compare_calls_a_difference_only_when_ranges_separate():
    apart = compare([1.0, 1.1, 1.2], [2.0, 2.1, 2.2], "stream", "plain")
    assert apart.measurable and apart.ratio == pytest.approx(1.1 / 2.1)
    assert apart.verdict.startswith("stream is faster than plain")
    overlap = compare([1.0, 1.5, 2.1], [2.0, 2.1, 2.2], "stream", "plain")
    assert not overlap.measurable and "no difference measurable" in overlap.verdict
    assert "ratio of medians" in str(overlap) and "min" in str(overlap)
    assert compare([2.0, 2.1], [1.0, 1.1], "a", "b").verdict.startswith("b is faster than a")


def test_titled_names_the_backend():
    fig, ax = plt.subplots()
    titled(ax, "TTFT", Backend("reference", None, "cpu"))
    assert "TTFT" in ax.get_title() and "reference engine" in ax.get_title()
    titled(fig, "Two panels", Backend("reference", None, "cpu"))
    assert "reference engine" in fig._suptitle.get_text()
    plt.close(fig)


def test_titled_names_a_computed_source_and_needs_one():
    fig, ax = plt.subplots()
    titled(ax, "Memory per core", source="computed by helpers.planning from the configs (no measurement)")
    assert "helpers.planning" in ax.get_title()
    with pytest.raises(ValueError, match="exactly one"):
        titled(ax, "x")
    with pytest.raises(ValueError, match="exactly one"):
        titled(ax, "x", Backend("reference", None, "cpu"), source="y")
    plt.close(fig)


def test_timing_metric_is_not_measurable_when_the_repeats_spread_too_far():
    steady = compare([1.0, 1.05, 1.1], [2.0, 2.1, 2.2], "stream", "plain")
    assert timing_entries("x", timing_metric(steady, 0.5)) == {"x": 0.5}
    noisy = compare([1.0, 1.1, 3.0], [2.0, 2.1, 2.2], "stream", "plain")
    entries = timing_entries("x", timing_metric(noisy, 0.5))
    assert entries["x"] is None and "stream repeats spread" in entries["x_not_measurable"]


def test_one_run_supports_no_difference():
    single = compare([1.0], [2.0], "a", "b")
    assert not single.measurable and "one run" in single.verdict
    assert not compare([1.0, 1.1], [2.0], "a", "b").measurable


def test_one_run_against_repeats_is_a_difference_only_beyond_their_range():
    from helpers.notebook.figures import compare_one

    cold = compare_one(61.5, [2.54, 3.27, 2.9], "cold build", "warm load")  # notebook 08's run
    assert cold.measurable and cold.ratio == pytest.approx(61.5 / 2.9)
    assert cold.verdict.startswith("warm load is faster than cold build (the one cold build lies outside")
    assert "n=1" in str(cold) and "n=3" in str(cold)
    inside = compare_one(3.0, [2.54, 3.27, 2.9], "cold build", "warm load")
    assert not inside.measurable and "lies within the range of the 3 warm load runs" in inside.verdict
    near = compare_one(3.5, [2.54, 3.27, 2.9], "cold build", "warm load")  # outside, by less than the width
    assert not near.measurable and "by less than the width" in near.verdict
    below = compare_one(1.0, [2.0, 2.1, 2.2], "x", "y")
    assert below.measurable and below.verdict.startswith("x is faster than y")
    lone = compare_one(61.5, [2.9], "cold build", "warm load")
    assert not lone.measurable and "one warm load: no spread" in lone.verdict
    assert timing_entries("r", timing_metric(cold, cold.ratio)) == {"r": cold.ratio}
