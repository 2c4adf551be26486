"""The model's architecture (``ModelArgs``, from a Hugging Face ``config.json``) and the compile-time settings
(``NeuronConfig``, transformers-neuronx's names). Unknown keywords are refused with the closest valid name (the
Neuron libraries ignore or only log them, so a typo there runs with the default)."""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields

from ..planning.gqa import GQA, as_strategy
from .sampling import eos_list

ARTIFACTS = ("export", "aoti")  # NeuronConfig(compiled=...): graphs built ahead of time (helpers.artifacts)


def reject_unknown(kwargs, known, where: str, why: str | None = None) -> None:
    """Refuse the first key of ``kwargs`` that is not in ``known``, naming the closest valid one;
    ``why`` replaces the list of valid names at the end of the message (long lists)."""
    for key in kwargs:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"{where} got an unknown keyword {key!r}.{hint} {why or f'Valid: {sorted(known)}'}")


@dataclass(frozen=True)
class ModelArgs:
    """The architecture, read from a Hugging Face Llama/Mistral config.json."""
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    sliding_window: int | None
    attention_bias: bool
    eos_token_id: int | list | None
    pad_token_id: int | None
    hf_config: dict = field(repr=False, compare=False, hash=False, default_factory=dict)

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelArgs":
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act={cfg['hidden_act']!r}: the engine implements SiLU-gated MLPs only")
        if cfg.get("mlp_bias", False):
            raise ValueError(f"mlp_bias={cfg['mlp_bias']!r}: the engine implements MLPs without biases only; run this "
                             "checkpoint with transformers, or use one whose config.json has mlp_bias=false")
        n_heads = cfg["num_attention_heads"]
        rope = cfg.get("rope_parameters") or {}
        sliding = cfg.get("sliding_window") if cfg.get("model_type") == "mistral" or cfg.get("use_sliding_window") else None
        return cls(
            model_type=cfg["model_type"],
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            n_layers=cfg["num_hidden_layers"],
            n_heads=n_heads,
            n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // n_heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", cfg.get("rope_theta", 10000.0)),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            sliding_window=sliding,
            attention_bias=bool(cfg.get("attention_bias", False)),
            eos_token_id=cfg.get("eos_token_id"),
            pad_token_id=cfg.get("pad_token_id"),
            hf_config=dict(cfg),
        )

    @property
    def eos_ids(self) -> list[int]:
        return eos_list(self.eos_token_id)


@dataclass
class NeuronConfig:
    """The subset of transformers-neuronx's ``NeuronConfig`` the reference engine implements,
    with the same keyword names, plus ``compiled`` (reference only): False = eager graphs,
    "export" (or True) = torch.export programs per bucket, "aoti" = AOTInductor packages per
    bucket; both can be saved and loaded (helpers.artifacts)."""
    group_query_attention: str | None = None
    quant: object | None = None
    fuse_qkv: bool = True
    on_device_embedding: bool = False
    padding_side: str = "left"
    compiled: bool = False

    def __init__(self, **kwargs):
        names = [f.name for f in fields(self)]
        reject_unknown(kwargs, names, "NeuronConfig")
        for f in fields(self):
            setattr(self, f.name, kwargs.get(f.name, f.default))
        if self.group_query_attention is not None:
            # transformers-neuronx's GQA values, plus NxD Inference's two (reference engine only: NxDI itself
            # has no such knob, it calls determine_sharding_strategy; see helpers.planning.gqa)
            try:
                self.group_query_attention = as_strategy(self.group_query_attention)
            except ValueError:
                raise ValueError(f"group_query_attention={self.group_query_attention!r}: use a GQA member "
                                 f"({', '.join(g.name for g in GQA)}), helpers.planning.gqa.NxDIGQA "
                                 "(CONVERT_TO_MHA, REPLICATE_TO_TP_DEGREE) or its value") from None
        if self.compiled not in (False, True, *ARTIFACTS):
            raise ValueError(f"compiled={self.compiled!r}: use False (eager), 'export' (or True: torch.export "
                             "graphs per bucket) or 'aoti' (AOTInductor packages per bucket)")
        if self.padding_side != "left":
            raise ValueError("padding_side must be 'left': the engine takes left-padded batches, as "
                             "transformers-neuronx's sample() does")
