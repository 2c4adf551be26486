"""Stand-in only (no NxD Inference file of this name): what ``neuronx_distributed/quantization/quantization_config.py``
at neuronx-distributed v2.28.0 defines and NxD Inference 0.8 uses, transcribed: the enums with their
contains-by-value metaclass (``MyEnumMeta``), ``QuantizationType`` and ``KVQuantizationConfig``.

``neuronx_distributed_inference.models.config`` imports only ``ActivationQuantizationType``, ``QuantizedDtype`` and
``KVQuantizationConfig`` from it (as the pinned ``models/config.py`` does), so ``from
neuronx_distributed_inference.models.config import QuantizationType`` fails as on the release.
"""
import enum
import os

import torch


class MyEnumMeta(enum.EnumMeta):
    def __contains__(cls, item):
        try:
            cls(item)
        except ValueError:
            return False
        else:
            return True


class QuantizationType(enum.Enum, metaclass=MyEnumMeta):
    PER_TENSOR_SYMMETRIC = "per_tensor_symmetric"
    PER_CHANNEL_SYMMETRIC = "per_channel_symmetric"
    PER_KEY_SYMMETRIC = "per_key_symmetric"
    BLOCKWISE_SYMMETRIC = "blockwise_symmetric"
    EXPERT_WISE_PER_CHANNEL_SYMMETRIC = "expert_wise_per_channel_symmetric"


class KVQuantizationConfig:
    def __init__(self, **kwargs):
        self.k_quant_method = kwargs.pop("k_quant_method", QuantizationType.PER_TENSOR_SYMMETRIC)
        self.v_quant_method = kwargs.pop("v_quant_method", QuantizationType.PER_TENSOR_SYMMETRIC)
        self.quant_dtype = kwargs.pop("quant_dtype", torch.float8_e4m3fn)
        self.direct_cast = kwargs.pop("direct_cast", True)

        if self.direct_cast:
            assert self.k_quant_method == QuantizationType.PER_TENSOR_SYMMETRIC and self.v_quant_method == QuantizationType.PER_TENSOR_SYMMETRIC, "When using direct cast both K and V quantization strategies must be PER_TENSOR_SYMMETRIC"


class ActivationQuantizationType(enum.Enum, metaclass=MyEnumMeta):
    DYNAMIC = "dynamic"
    STATIC = "static"
    NONE = None


def get_float4x4_torch_dtype():
    if int(os.environ.get("NEURON_FLOAT4X4_IS_FLOAT16", "0")) > 0:
        return torch.float16
    else:
        return torch.uint16


class QuantizedDtype(enum.Enum, metaclass=MyEnumMeta):
    INT8 = torch.int8
    F8E4M3 = torch.float8_e4m3fn
    F8E4M3FN = torch.float8_e4m3fn
    F8E5M2 = torch.float8_e5m2

    F4E2M1FN_X4 = get_float4x4_torch_dtype()
    F8E4M3FN_X4 = torch.uint32
    F8E5M2_X4 = torch.uint32

    @classmethod
    def has_dtype(cls, dtype_string: str) -> None:
        """Check if the dtype string is a valid QuantizedDtype."""
        assert dtype_string.upper() in cls.__members__, f"{dtype_string} is not a valid QuantizedDtype."

    @classmethod
    def get_dtype(cls, dtype_string: str) -> torch.dtype:
        """Return the value for the given dtype string (in uppercase) if it exists."""
        QuantizedDtype.has_dtype(dtype_string=dtype_string)
        return cls[dtype_string.upper()].value


# Saved configs name these classes by their home module (to_dict writes __module__): keep neuronx-distributed's.
for _cls in (QuantizationType, KVQuantizationConfig, ActivationQuantizationType, QuantizedDtype):
    _cls.__module__ = "neuronx_distributed.quantization.quantization_config"
