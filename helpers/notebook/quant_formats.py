"""The 8-bit formats notebook 06 compares (section 6): what int8, e4m3 and e5m2 keep of a checkpoint's weights."""
from __future__ import annotations

import torch

from ..engine.quant import ATTN, FP8_MAX, MLP
from ..model_store import load_state_dict

# NxD Inference 0.8 stores quantized weights as quantization_dtype "int8", "f8e4m3" or "f8e5m2" (the NxD guide,
# Model Weight Quantization: e4m3 "greater precision and less range", e5m2 "greater range and less precision").
# Largest value used for the scale: int8 127 (per-channel symmetric), e4m3 240 (Neuron's e4m3 range, FP8_MAX:
# NxDI compiles fp8 with --experimental-unsafe-fp8e4m3fn-as-fp8e4m3), e5m2 57344 (its largest finite value).
EIGHT_BIT_FORMATS = {"int8": (torch.int8, 127.0), "f8e4m3": (torch.float8_e4m3fn, FP8_MAX),
                     "f8e5m2": (torch.float8_e5m2, 57344.0)}


def fake_quantize(w: torch.Tensor, fmt: str) -> torch.Tensor:
    """Store ``w`` [out, in] in an 8-bit format with one scale per output channel (absmax to the format's largest
    value) and read it back in f32: what the format keeps of the weight."""
    if fmt not in EIGHT_BIT_FORMATS:
        raise ValueError(f"fmt={fmt!r}: use one of {list(EIGHT_BIT_FORMATS)}")
    dtype, top = EIGHT_BIT_FORMATS[fmt]
    w = w.float()
    scale = (w.abs().amax(dim=1, keepdim=True) / top).clamp(min=torch.finfo(torch.float32).eps)
    x = (w / scale).clamp(-top, top)
    q = x.round().to(dtype) if dtype == torch.int8 else x.to(dtype)
    return q.float() * scale


def rounding_errors(model_path, formats=tuple(EIGHT_BIT_FORMATS), every: int = 8) -> dict[str, float]:
    """Relative RMS error ``||w - fake_quantize(w)|| / ||w||`` of each format over every decoder projection
    (q/k/v/o, gate/up/down) of a checkpoint: the weights each int8 / FP8 mode would store. Scales are per output
    channel, so a sample of channels (every ``every``-th row) gives the same figure for a fraction of the work."""
    names = tuple(f".{p}.weight" for p in ATTN + MLP)
    weights = [t for n, t in load_state_dict(model_path).items() if n.endswith(names)]
    if not weights:
        raise ValueError(f"{model_path}: no decoder projection weights ({', '.join(ATTN + MLP)}) found")
    err = {f: 0.0 for f in formats}
    total = 0.0
    for w in weights:
        w = w[::every].float()
        total += float(w.square().sum())
        for f in formats:
            err[f] += float((w - fake_quantize(w, f)).square().sum())
    return {f: (e / total) ** 0.5 for f, e in err.items()}
