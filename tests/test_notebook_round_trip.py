"""helpers.notebook.round_trip: notebook 08's verdicts and metrics (the one cold build against the warm loads'
range, presharded against checkpoint loads) on hand-made timings."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.notebook import round_trip
from helpers.notebook.backend import Backend

CPU = Backend("reference", None, "cpu")


def _loads(presharded=(2.54, 3.27, 2.9), checkpoint=(2.6, 3.1, 3.0)):
    seconds = {"presharded": list(presharded), "checkpoint": list(checkpoint)} if presharded else \
        {"checkpoint": list(checkpoint)}
    return round_trip.WarmLoads(seconds, {k: [0.4] * len(v) for k, v in seconds.items()}, None)


def test_the_cold_build_outside_the_warm_range_is_a_difference_and_is_recorded(tmp_path, capsys):
    cold = round_trip.cold_against_warm(61.5, _loads())  # the run the issue quotes: 61.5 s against 2.54-3.27 s
    assert cold.measurable and "warm load is faster than cold build" in capsys.readouterr().out
    case = SimpleNamespace(bk=CPU, settings={"batch_size": 1, "tp_degree": 1})
    saved = round_trip.Saved(Path("x"), 1.0, {"graphs": [{}] * 7}, 10, 20)
    figures = round_trip.reference_figures("aoti", 61.5, 55.0, saved, _loads(), True, {"a": "", "b": "", "c": "",
                                                                                       "d": ""}, True, None)
    round_trip.write_round_trip_metrics(tmp_path / "m.json", case, cold, figures, True)
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["cold_over_warm_measurable"] is True and m["cold_over_warm"] == pytest.approx(61.5 / 2.9)
    assert m["graphs"] == 7 and m["refusals"] == 4 and m["warm_load_min_s"] == 2.54 and m["warm_load_max_s"] == 3.27
    assert m["cold_over_warm_verdict"].startswith("warm load is faster")


def test_a_cold_build_within_the_warm_range_is_no_difference():
    cold = round_trip.cold_against_warm(3.0, _loads())
    assert not cold.measurable and "within the range" in cold.verdict


def test_without_presharded_weights_the_cold_build_is_judged_against_checkpoint_loads(capsys):
    loads = _loads(presharded=None)
    assert round_trip.cold_against_warm(61.5, loads).b.samples == (2.6, 3.1, 3.0)
    assert round_trip.presharded_against_checkpoint(loads) is None
    assert "sharded_weights=False" in capsys.readouterr().out


def test_presharded_against_checkpoint_calls_a_difference_only_where_the_ranges_separate(tmp_path):
    assert not round_trip.presharded_against_checkpoint(_loads()).measurable
    apart = round_trip.presharded_against_checkpoint(_loads((1.0, 1.1, 1.2), (2.0, 2.1, 2.2)))
    assert apart.measurable and apart.verdict.startswith("presharded weights is faster than checkpoint")
    saved = round_trip.Saved(Path("x"), 1.0, {"graphs": []}, 10, 20)
    figures = round_trip.reference_figures("export", 9.0, 8.0, saved, _loads(), True, {}, True, apart)
    assert figures["presharded_vs_checkpoint_measurable"] is True and figures["presharded_load_s"] == 1.1


def test_setup_refuses_bad_parameters():
    with pytest.raises(ValueError, match="artifact"):
        round_trip.setup(artifact="neff")
    with pytest.raises(ValueError, match="warm_repeats"):
        round_trip.setup(warm_repeats=1)
