"""Drawings of a replay: which request occupies which slot over time, and the policies side by side.

Each function draws on the matplotlib axes it is given (no pyplot state here)."""
from __future__ import annotations

from .scheduler import RunResult


def plot_slots(ax, result: RunResult, horizon: float | None = None) -> None:
    """One row per slot (static: per batch row); a bar per request from its admission to its result: light up to its
    first token (context encoding, or a static batch's prefill), solid while it decodes, grey hatched once it has
    its tokens but still holds its row (static: until the batch's longest answer is done). Arrivals are ticks
    under the rows."""
    for s in result.served:
        color = f"C{s.rid % 10}"
        last = s.finished_s if s.last_token_s is None else s.last_token_s
        ax.barh(s.slot, s.first_token_s - s.admitted_s, left=s.admitted_s, color=color, alpha=0.35, height=0.8)
        ax.barh(s.slot, last - s.first_token_s, left=s.first_token_s, color=color, height=0.8)
        if s.finished_s > last:
            ax.barh(s.slot, s.finished_s - last, left=last, color="0.85", hatch="///", edgecolor="0.6", height=0.8)
        if s.finished_s - s.admitted_s > 0.04 * (horizon or s.finished_s):
            ax.text((s.admitted_s + s.finished_s) / 2, s.slot, str(s.rid), ha="center", va="center", fontsize=7)
    ax.plot([s.arrival_s for s in result.served], [-0.8] * len(result.served), "|", color="k", ms=6)
    ax.set_yticks(range(result.n_slots))
    ax.set_ylim(-1.2, result.n_slots - 0.4)
    ax.set(ylabel="slot" if result.policy == "continuous" else "batch row", title=result.name)
    if horizon:
        ax.set_xlim(0, horizon)


def _bar_values(values) -> tuple[list[float], list[list[float]]]:
    """Bar heights and [below, above] error lengths: a number, or a spread of repeats (anything with ``median``,
    ``low`` and ``high``, such as ``helpers.notebook.figures.Spread``) drawn as its median with a min-max bar."""
    mid = [float(v.median) if hasattr(v, "median") else float(v) for v in values]
    low = [m - float(v.low) if hasattr(v, "low") else 0.0 for m, v in zip(mid, values)]
    high = [float(v.high) - m if hasattr(v, "high") else 0.0 for m, v in zip(mid, values)]
    return mid, [low, high]


def plot_policies(axes, summaries: list[dict]) -> None:
    """Three axes: throughput, TTFT median and maximum over the requests, latency median and maximum, per policy.
    Each figure may be a number or a spread over repeated replays (min-max error bars)."""
    names = [f"{s['policy']} {s['slots']}" for s in summaries]
    x = range(len(names))
    a0, a1, a2 = axes
    mid, err = _bar_values([s["throughput_tok_s"] for s in summaries])
    a0.bar(x, mid, yerr=err, capsize=3, color=["C1" if s["policy"] == "static" else "C0" for s in summaries])
    a0.set(ylabel="generated tokens / s", title="throughput")
    n = summaries[0].get("n", "?") if summaries else "?"
    for ax, key, title in ((a1, "ttft", "time to first token"), (a2, "latency", "request latency")):
        for dx, stat, label in ((-0.2, "median", "median"), (0.2, "max", f"max of {n} requests")):
            mid, err = _bar_values([s[f"{key}_{stat}_s"] for s in summaries])
            ax.bar([i + dx for i in x], mid, yerr=err, capsize=3, width=0.4, label=label)
        ax.set(ylabel="seconds", title=title)
        ax.legend(fontsize=7)
    for ax in axes:
        ax.set_xticks(list(x))
        ax.set_xticklabels(names, rotation=30, ha="right")
