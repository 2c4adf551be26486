"""How a notebook reports what it measured: repeated timings as a spread, a difference only where the spreads
allow one, and plots whose title names the backend that measured them.

The rules (tests/test_notebook_rules.py checks the notebooks keep them):

- a timing is shown as its median with the min-max of its repeats (:class:`Spread`), never as one number;
- two timings are called different only when their ranges do not overlap (:func:`compare`); otherwise the
  notebook says "no difference measurable here" and shows both spreads;
- every plot's title names what measured it (:func:`titled`, from :func:`provenance.measured_by`).
"""
from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from .backend import Backend
from .provenance import measured_by


@dataclass(frozen=True)
class Spread:
    """The repeats of one measurement: median, min, max, n."""

    samples: tuple[float, ...]

    def __init__(self, samples: Iterable[float]):
        values = tuple(float(s) for s in samples)
        if not values:
            raise ValueError("a Spread needs at least one sample")
        object.__setattr__(self, "samples", values)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def low(self) -> float:
        return min(self.samples)

    @property
    def high(self) -> float:
        return max(self.samples)

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def relative_width(self) -> float:
        """(max - min) / median: how far apart the repeats are, as a share of the median."""
        return (self.high - self.low) / self.median if self.median else float("inf")

    def format(self, scale: float = 1.0, unit: str = "", digits: int = 2) -> str:
        m, lo, hi = (v * scale for v in (self.median, self.low, self.high))
        return f"{m:.{digits}f}{unit} (min {lo:.{digits}f}, max {hi:.{digits}f}, n={self.n})"

    def __str__(self) -> str:
        return self.format()


@dataclass(frozen=True)
class Comparison:
    """``a`` against ``b`` (lower is better, e.g. seconds): the median ratio and whether the ranges separate."""

    a: Spread
    b: Spread
    name_a: str
    name_b: str

    @property
    def ratio(self) -> float:
        """median(a) / median(b)."""
        return self.a.median / self.b.median

    @property
    def measurable(self) -> bool:
        """True when both were repeated and their ranges do not overlap: the repeats support a difference. One run
        of either has no spread to exceed, so it supports none."""
        if min(self.a.n, self.b.n) < 2:
            return False
        return self.a.high < self.b.low or self.b.high < self.a.low

    @property
    def verdict(self) -> str:
        if min(self.a.n, self.b.n) < 2:
            return f"no difference measurable here between {self.name_a} and {self.name_b} (one run: no spread)"
        if not self.measurable:
            return f"no difference measurable here between {self.name_a} and {self.name_b} (their ranges overlap)"
        faster, slower = (self.name_a, self.name_b) if self.a.median < self.b.median else (self.name_b, self.name_a)
        return f"{faster} is faster than {slower} (ranges do not overlap)"

    def __str__(self) -> str:
        return (f"{self.name_a}: {self.a.format(1e3, ' ms')}; {self.name_b}: {self.b.format(1e3, ' ms')}; "
                f"ratio of medians {self.ratio:.2f}: {self.verdict}")


def timing_metric(comparison: Comparison, value: float, max_width: float = 0.5) -> dict:
    """A timing claim for the metrics file: ``{"value": value}`` when both spreads are at most ``max_width`` of their
    medians, else ``{"value": None, "not_measurable": why}`` (ci/run_notebooks.py reports such a claim as not
    measurable here, for baselines marked ``"timing": true``). Write it with :func:`timing_entries`."""
    wide = [(name, s) for name, s in ((comparison.name_a, comparison.a), (comparison.name_b, comparison.b))
            if s.relative_width > max_width]
    if not wide:
        return {"value": value}
    why = "; ".join(f"the {name} repeats spread {s.relative_width:.0%} of their median" for name, s in wide)
    return {"value": None, "not_measurable": f"{why} (more than {max_width:.0%}): too noisy to test the claim here"}


def timing_entries(name: str, metric: dict) -> dict:
    """``{name: value}`` plus ``{name + "_not_measurable": why}`` where :func:`timing_metric` gave one."""
    out = {name: metric["value"]}
    if "not_measurable" in metric:
        out[f"{name}_not_measurable"] = metric["not_measurable"]
    return out


def compare(a: Iterable[float], b: Iterable[float], name_a: str = "a", name_b: str = "b") -> Comparison:
    """Seconds (or any lower-is-better figure) of two setups, each repeated: see :class:`Comparison`."""
    return Comparison(Spread(a), Spread(b), name_a, name_b)


def titled(target, text: str, bk: Backend | None = None, source: str | None = None):
    """Set a figure's (or an axes') title to ``text`` plus a line naming what produced it; returns ``target``.

    ``bk``: the backend that measured it (:func:`provenance.measured_by`); ``source``: for a figure no backend
    measured (a planner's arithmetic, say), what computed it. Exactly one of the two."""
    if (bk is None) == (source is None):
        raise ValueError("titled() needs exactly one of bk= (what measured the figure) or source= (what computed it)")
    title = f"{text}\nmeasured by {measured_by(bk)}" if bk is not None else f"{text}\n{source}"
    if hasattr(target, "suptitle"):
        target.suptitle(title, fontsize=9)
    else:
        target.set_title(title, fontsize=9)
    return target


@dataclass(frozen=True)
class OneRunComparison(Comparison):
    """``a`` measured once by nature (a cold build: each repeat would be a full compilation, and its cache would
    make the next one warm) against ``b``, repeated. A single value outside the range of ``n`` repeats happens by
    chance 2 / (n + 1) of the time (half the time for 3), so the difference is called only where it lies beyond
    the repeats' range by more than the range is wide."""

    @property
    def margin(self) -> float:
        """How far ``a`` lies outside ``b``'s range (0 inside it)."""
        return max(self.b.low - self.a.median, self.a.median - self.b.high, 0.0)

    @property
    def measurable(self) -> bool:
        return self.a.n == 1 and self.b.n >= 2 and self.margin > self.b.high - self.b.low

    @property
    def verdict(self) -> str:
        if self.a.n != 1:
            raise ValueError(f"{self.name_a} has {self.a.n} samples: compare repeated timings with compare()")
        if self.b.n < 2:
            return f"no difference measurable here between {self.name_a} and {self.name_b} (one {self.name_b}: no spread)"
        if not self.measurable:
            where = "within" if self.margin == 0 else "outside, but by less than the width of,"
            return (f"no difference measurable here between {self.name_a} and {self.name_b} (the one {self.name_a} "
                    f"lies {where} the range of the {self.b.n} {self.name_b} runs)")
        faster, slower = (self.name_a, self.name_b) if self.a.median < self.b.median else (self.name_b, self.name_a)
        return (f"{faster} is faster than {slower} (the one {self.name_a} lies outside the range of the {self.b.n} "
                f"{self.name_b} runs, by more than that range is wide)")


def compare_one(value: float, samples: Iterable[float], name_one: str = "a", name_many: str = "b") -> OneRunComparison:
    """One measurement that cannot be repeated (``value``, seconds) against a repeated one: see
    :class:`OneRunComparison`."""
    return OneRunComparison(Spread([value]), Spread(samples), name_one, name_many)
