"""int8 weight storage: 8-bit values plus scales, dequantized to ``amp`` at use (:class:`QuantWeight`, a weight
that owns its matmul), with the Neuron libraries' method names:

- transformers-neuronx 0.13 ``QuantizationConfig``: ``vector_dynamic`` = one scale per output channel,
  ``absmax / 127`` for ``s8`` (``absmax / 240`` for ``f8e4m3fn``); ``direct_cast`` = cast with no scale.
- NxD Inference 0.8 ``quantization_type``: ``per_tensor_symmetric`` = one scale per weight, ``absmax / 127.5``;
  ``per_channel_symmetric`` = one per output channel, ``absmax / 127``. NxDI quantizes a checkpoint once
  (:func:`save_quantized_state_dict`) and loads read it from ``quantized_checkpoints_path``.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ..model_store import load_config, load_state_dict
from ..planning.dtypes import AMP_DTYPES, QUANT_DTYPES
from .config import ModelArgs
from .weights import stored

TNX_METHODS = ("vector_dynamic", "direct_cast")
NXDI_METHODS = ("per_tensor_symmetric", "per_channel_symmetric")
FP8_MAX = 240.0  # transformers_neuronx/constants.py FpBounds.max (Neuron's e4m3 range)
ATTN = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
MLP = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
CHECKPOINT_FILE = "model.safetensors"


@dataclass(eq=False)
class QuantizationConfig:
    """transformers-neuronx's ``QuantizationConfig`` keywords (same names and defaults), NxDI's ``quantization_type``
    values as ``quantize_method`` and NxDI's ``quantized_checkpoints_path``. ``no_quantize_list``: layer prefixes
    ("model.layers.3") whose weights stay in ``amp``."""

    quant_dtype: str = "s8"
    dequant_dtype: str = "f16"
    quantize_method: str = "vector_dynamic"
    quantize_attn: bool = True
    no_quantize_list: list = field(default_factory=list)
    quantized_checkpoints_path: str | None = None

    def __post_init__(self):
        quant_dtype, quantize_method = self.quant_dtype, self.quantize_method
        if quant_dtype not in QUANT_DTYPES:
            raise ValueError(f"quant_dtype={quant_dtype!r}: use one of {list(QUANT_DTYPES)} "
                             "(transformers-neuronx names; NxDI's quantization_dtype='int8' is 's8')")
        if quantize_method not in TNX_METHODS + NXDI_METHODS:
            raise ValueError(f"quantize_method={quantize_method!r}: use one of {list(TNX_METHODS)} "
                             f"(transformers-neuronx) or {list(NXDI_METHODS)} (NxDI quantization_type)")
        if self.dequant_dtype not in AMP_DTYPES:
            raise ValueError(f"dequant_dtype={self.dequant_dtype!r}: use one of {sorted(AMP_DTYPES)}")
        if quantize_method == "direct_cast" and quant_dtype == "s8":
            raise ValueError("quantize_method='direct_cast' stores the weights cast to s8 with no scale: every "
                             "weight in (-1, 1), i.e. nearly all of an LLM's, becomes 0. Use "
                             "quantize_method='vector_dynamic' for s8, or quant_dtype='f8e4m3fn' for a direct cast. "
                             "(transformers-neuronx 0.13 fails here at load: quantize.py passes the name 's8' to "
                             "Tensor.to, 'Invalid device string'.)")
        if quantize_method in NXDI_METHODS and quant_dtype != "s8":
            raise ValueError(f"quantize_method={quantize_method!r} is implemented for int8 (quant_dtype='s8') "
                             "only in the reference engine")
        self.quantize_attn, self.no_quantize_list = bool(self.quantize_attn), list(self.no_quantize_list)

    def quantized_names(self, layer: int) -> tuple[str, ...]:
        """The HF projection names of ``layer`` whose weights are stored quantized."""
        if f"model.layers.{layer}" in self.no_quantize_list:
            return ()
        return (ATTN if self.quantize_attn else ()) + MLP


def check_quant_config(quant, amp: str) -> None:
    """Refuse a bad quantization setting before any build."""
    if not isinstance(quant, QuantizationConfig):
        raise TypeError(f"neuron_config.quant must be a helpers.engine.quant.QuantizationConfig, got {type(quant).__name__}")
    if quant.dequant_dtype != amp:
        raise ValueError(f"amp={amp!r} but quant.dequant_dtype={quant.dequant_dtype!r}: with int8 weight storage "
                         "amp must equal the dequant dtype (the weights are dequantized to amp at use; the "
                         f"transformers-neuronx guide: 'amp type must match dequant type'). Set "
                         f"QuantizationConfig(dequant_dtype={amp!r}) or amp={quant.dequant_dtype!r}.")
    path = quant.quantized_checkpoints_path
    if path is not None and not checkpoint_file(path).is_file():
        raise FileNotFoundError(f"Quantized checkpoint file not found: {checkpoint_file(path)} (NxDI's message). "
                                "Write it once with helpers.engine.quant.save_quantized_state_dict(model_path, quant).")


# -- storage ----------------------------------------------------------------------------------------
@dataclass
class QuantWeight:
    """A [out, in] weight stored as 8-bit values ``q`` and per-output-channel ``scale`` (None: unit scale)."""
    q: torch.Tensor
    scale: torch.Tensor | None
    dtype: torch.dtype  # dequantized dtype (= amp)

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + (0 if self.scale is None else self.scale.nbytes)

    @property
    def shape(self):
        return self.q.shape

    def dequantize(self) -> torch.Tensor:
        w = self.q.to(self.dtype)
        return w if self.scale is None else w * self.scale.to(self.dtype)[:, None]

    def linear(self, x: torch.Tensor, bias=None) -> torch.Tensor:
        """``x @ dequantize().T`` in ``x``'s dtype (= amp): the output channels' scale applied after the matmul
        (same product). On CPU with bf16/f16 activations, torch's weight-only int8 kernel does both in one pass."""
        if (self.q.dtype == torch.int8 and self.scale is not None and x.device.type == "cpu"
                and x.dtype in (torch.bfloat16, torch.float16)):
            y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, x.shape[-1]).contiguous(), self.q,
                                                   self.scale.to(x.dtype))
            y = y.view(*x.shape[:-1], -1)
        else:
            y = F.linear(x, self.q.to(x.dtype))
            if self.scale is not None:
                y = y * self.scale.to(x.dtype)
        return y if bias is None else y + bias


def quantize_tensor(w: torch.Tensor, quant: QuantizationConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One [out, in] weight -> (8-bit values, f32 scale [out] or [1] for per-tensor, or None)."""
    w = w.float()
    qdtype = QUANT_DTYPES[quant.quant_dtype]
    if quant.quantize_method == "direct_cast":  # f8e4m3fn only (s8 is refused in the config)
        return w.to(qdtype), None
    if quant.quantize_method == "per_tensor_symmetric":
        scale = (w.abs().amax() / 127.5).reshape(1)
    else:  # vector_dynamic / per_channel_symmetric: one scale per output channel
        scale = w.abs().amax(dim=1) / (127.0 if qdtype == torch.int8 else FP8_MAX)
    scale = scale.clamp(min=torch.finfo(torch.float32).eps)  # an all-zero row stays zero
    x = w / scale[:, None]
    if qdtype == torch.int8:
        return x.round().clamp(-128, 127).to(torch.int8), scale
    return x.clamp(-FP8_MAX, FP8_MAX).to(qdtype), scale


def _fuse(parts: list[tuple[torch.Tensor, torch.Tensor | None]], dtype: torch.dtype) -> QuantWeight:
    """Stack quantized row blocks (fused q/k/v or gate/up) into one weight with per-row scales."""
    q = torch.cat([p[0] for p in parts])
    if parts[0][1] is None:
        return QuantWeight(q, None, dtype)
    scale = torch.cat([s.expand(v.shape[0]) for v, s in parts]).contiguous()
    return QuantWeight(q, scale, dtype)


# -- model -----------------------------------------------------------------------------------------
def _split(t: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    return list(torch.split(t, sizes, dim=0))


def quantize_model(model, quant: QuantizationConfig) -> None:
    """Replace a built ``Transformer``'s projection weights by :class:`QuantWeight` (in place; the model's
    ``linear`` runs them by :meth:`QuantWeight.linear`). Reads ``quant.quantized_checkpoints_path`` when set."""
    if quant.quantize_method == "direct_cast":
        warnings.warn(f"direct casting is enabled with dtype {quant.quant_dtype}, make sure the values are within "
                      "representable range of the datatype (transformers-neuronx's warning)")
    w, a, dtype = model.w, model.args, model.dtype
    D = a.head_dim
    qkv_sizes = [w.n_q * D, w.n_kv * D, w.n_kv * D]
    saved = load_quantized_state_dict(quant) if quant.quantized_checkpoints_path is not None else None
    for i, L in enumerate(w.layers):
        names = quant.quantized_names(i)
        if not names:
            continue
        ffn = L.w13.shape[0] // 2
        if saved is not None:
            get = {n: _saved_part(saved, i, n) for n in names}
        else:
            parts = dict(zip(ATTN[:3], _split(stored(L.wqkv), qkv_sizes))) | {ATTN[3]: stored(L.wo)}
            parts |= dict(zip(MLP[:2], _split(stored(L.w13), [ffn, ffn]))) | {MLP[2]: stored(L.w2)}
            get = {n: quantize_tensor(parts[n], quant) for n in names}
        if quant.quantize_attn:
            L.wqkv = _checked(_fuse([get[n] for n in ATTN[:3]], dtype), L.wqkv, i, "q/k/v")
            L.wo = _checked(_fuse([get[ATTN[3]]], dtype), L.wo, i, "o_proj")
        L.w13 = _checked(_fuse([get[MLP[0]], get[MLP[1]]], dtype), L.w13, i, "gate/up")
        L.w2 = _checked(_fuse([get[MLP[2]]], dtype), L.w2, i, "down_proj")


def _checked(qw: QuantWeight, old: torch.Tensor, layer: int, what: str) -> QuantWeight:
    if tuple(qw.shape) != tuple(old.shape):
        raise ValueError(f"layer {layer} {what}: quantized weight {tuple(qw.shape)} does not match the model's "
                         f"{tuple(old.shape)}: the quantized checkpoint belongs to another model (or tp_degree)")
    device = stored(old).device
    qw.q, qw.scale = qw.q.to(device), None if qw.scale is None else qw.scale.to(device)
    return qw


def quantized_weight_bytes(model) -> tuple[int, int]:
    """(bytes of the quantized projections, bytes the same projections take in ``amp``)."""
    stored = full = 0
    for t in model.w.matrices():
        if isinstance(t, QuantWeight):
            stored += t.nbytes
            full += t.q.numel() * torch.empty((), dtype=t.dtype).element_size()
    return stored, full


# -- NxDI-style quantized checkpoint --------------------------------------------------------------------
def checkpoint_file(path) -> Path:
    p = Path(path)
    return p if p.suffix == ".safetensors" else p / CHECKPOINT_FILE


def save_quantized_state_dict(model_path, quant: QuantizationConfig) -> Path:
    """Quantize a checkpoint's decoder projections once and write them to ``quant.quantized_checkpoints_path``
    (NxDI's ``save_quantized_state_dict``): ``layers.N.<proj>.weight`` (8-bit) and ``.scale`` (f32) in one
    safetensors file. Everything else (norms, embedding, LM head) is read from the original checkpoint."""
    if quant.quantized_checkpoints_path is None:
        raise ValueError("quant.quantized_checkpoints_path is required (NxDI asserts the same)")
    args = ModelArgs.from_hf(load_config(model_path))
    state = load_state_dict(model_path)
    out = {}
    for i in range(args.n_layers):
        for n in quant.quantized_names(i):
            q, scale = quantize_tensor(state[f"model.layers.{i}.{n}.weight"], quant)
            out[f"layers.{i}.{n}.weight"] = q.contiguous()
            if scale is not None:
                out[f"layers.{i}.{n}.scale"] = scale
    meta = {"format": "pt", "quantization": json.dumps(_meta(quant))}
    f = checkpoint_file(quant.quantized_checkpoints_path)
    f.parent.mkdir(parents=True, exist_ok=True)
    save_file(out, str(f), metadata=meta)
    return f


def _meta(quant: QuantizationConfig) -> dict:
    return {"quant_dtype": quant.quant_dtype, "quantize_method": quant.quantize_method,
            "quantize_attn": quant.quantize_attn, "no_quantize_list": quant.no_quantize_list}


def load_quantized_state_dict(quant: QuantizationConfig) -> dict:
    f = checkpoint_file(quant.quantized_checkpoints_path)
    with safe_open(str(f), framework="pt") as fh:
        meta = json.loads((fh.metadata() or {}).get("quantization", "{}"))
    if meta != _meta(quant):
        raise ValueError(f"{f} was written with {meta} but the config asks {_meta(quant)}: rewrite it with "
                         "save_quantized_state_dict(model_path, quant) or point quantized_checkpoints_path elsewhere")
    return load_file(str(f))


def _saved_part(saved: dict, layer: int, name: str):
    key = f"layers.{layer}.{name}"
    return saved[key + ".weight"], saved.get(key + ".scale")
