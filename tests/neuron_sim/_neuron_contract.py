"""Bookkeeping shared by the stand-in Neuron packages (transformers_neuronx, neuronx_distributed_inference).

The stand-ins transcribe the signatures, enum members, call-order rules and user-visible behaviour of the
pinned releases (transformers-neuronx v0.13.0, NxD Inference 0.8.0 / SDK 2.28; each module names its source
file) and compute their tokens with the repository's reference engine. Where the real library is lenient
(swallows or only logs an unknown keyword) or silently computes wrong tokens, the stand-in raises
:class:`ContractError`, so the mistake fails a test instead of running with a default on an inf2 instance.
"""
from __future__ import annotations

import difflib

CALLS: list[tuple[str, dict]] = []


class ContractError(Exception):
    """A call that the pinned Neuron release would reject, or silently misread."""


def reset() -> None:
    CALLS.clear()


def record(name: str, **kwargs) -> None:
    CALLS.append((name, kwargs))


def calls(prefix: str = "") -> list[tuple[str, dict]]:
    return [c for c in CALLS if c[0].startswith(prefix)]


def refuse_unknown(where: str, kwargs: dict, known, real_behaviour: str) -> None:
    for key in kwargs:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ContractError(f"{where}: unknown keyword {key!r}.{hint} The pinned release {real_behaviour}.")
