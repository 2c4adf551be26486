"""Stand-in of ``src/transformers_neuronx/dtypes.py`` at aws-neuron/transformers-neuronx v0.13.0 (commit f4e3818):
``to_torch_dtype`` only (``to_amp`` is not transcribed: nothing here calls it)."""
import torch


def to_torch_dtype(dtype):
    mapping = {
        'f32': torch.float32,
        'f16': torch.float16,
        'bf16': torch.bfloat16,
        's8': torch.int8,
        'f8e4m3fn': torch.float8_e4m3fn if hasattr(torch, 'float8_e4m3fn') else torch.int8,
    }
    return mapping[dtype]
