"""Key figures of a notebook, written as JSON to the ``metrics_path`` parameter."""
from __future__ import annotations

import json
import math
from pathlib import Path


def _clean(v):
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"metric value {v} is not finite")
    return v


def write_metrics(path, metrics: dict) -> dict:
    """Write ``metrics`` (a flat dict of numbers/strings/bools) to ``path`` if set; return it."""
    clean = {str(k): _clean(v) for k, v in metrics.items()}
    if path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(clean, indent=2, sort_keys=True))
        print(f"metrics -> {p}")
    return clean
