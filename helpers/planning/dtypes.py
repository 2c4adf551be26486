"""The dtype names of the pinned Neuron libraries, and what they are in torch: the one map.

``amp`` (transformers-neuronx's name for the compute dtype): 'f32', 'bf16', 'f16'; NxD Inference
names the same dtypes by torch's name (``torch_dtype='bfloat16'``). Weight storage (``quant_dtype``,
transformers-neuronx ``QuantizationConfig``): 's8' and 'f8e4m3fn'.
"""
from __future__ import annotations

import torch

AMP_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
QUANT_DTYPES = {"s8": torch.int8, "f8e4m3fn": torch.float8_e4m3fn}


def amp_dtype(amp: str) -> torch.dtype:
    if amp not in AMP_DTYPES:
        raise ValueError(f"amp={amp!r} is not supported: use one of {sorted(AMP_DTYPES)} "
                         "(transformers-neuronx names: 'f32', 'bf16', 'f16').")
    return AMP_DTYPES[amp]


def amp_bytes(amp: str) -> int:
    """Bytes per element of ``amp``."""
    return amp_dtype(amp).itemsize


def amp_torch_name(amp: str) -> str:
    """``amp`` by torch's name, as NxD Inference's ``torch_dtype`` takes it ('bf16' -> 'bfloat16')."""
    return str(amp_dtype(amp)).split(".")[1]
