"""The neuron lanes' second model: a small random-weight checkpoint shaped like the production model the Neuron
cells name (Llama-3.1-8B-Instruct), so that a cell which only works on the embedded SmolLM2 fails in the lane.

    python ci/production_model.py    # build it once (cached), print its folder

What it shares with Llama-3.1-8B-Instruct, and the embedded SmolLM2-135M-Instruct does not:
  - 4 query heads per KV head (8 / 2 here; 32 / 8 there; SmolLM2: 9 / 3), head_dim 32 (a multiple of 16, as the
    reference engine's C ops take);
  - an untied LM head (``lm_head.weight`` stored; SmolLM2 ties it to the embeddings);
  - llama3 RoPE scaling, rope_theta 500000, max_position_embeddings 131072;
  - a tokenizer without a pad token, no pad_token_id in config.json or generation_config.json;
  - a list of EOS ids in config.json and generation_config.json (there [128001, 128008, 128009]: <|end_of_text|>,
    <|eom_id|>, <|eot_id|>; here [0, 2]: <|endoftext|>, <|im_end|>), the tokenizer's eos_token the last of them;
  - generation_config.json's sampling defaults (do_sample, temperature 0.6, top_p 0.9).
It is built from nothing but the embedded model's tokenizer (the SmolLM2 tokenizer files of the converted checkpoint,
vocabulary 49152, its pad token removed) and seeded random weights: 6 layers, hidden 256, so a cell costs little.

The weights are drawn from a seeded ``torch.Generator`` in the order of the sorted parameter names, not by the
model's own init, so transformers 4.47.1 (transformers-neuronx's pin), 4.57.1 (NxD Inference's) and 5 write the same
tensors; config.json carries both RoPE spellings (``rope_scaling`` + ``rope_theta``, and ``rope_parameters`` when
transformers 5 wrote it) as the embedded checkpoint does. The folder is cached under the model store's cache
(``helpers.model_store.cache_dir``), named by a content key: this file's source and the tokenizer files. A lane
builds it once; whichever venv builds it first, the others load it.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoConfig, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from helpers.model_store import cache_dir, portable_tokenizer, resolve_model_path, with_legacy_keys  # noqa: E402

NAME = "production-shaped"
SEED = 0
EOS_TOKENS = ("<|endoftext|>", "<|im_end|>")  # Llama-3.1-Instruct's list: <|end_of_text|>, <|eom_id|>, <|eot_id|>
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
ARCHITECTURE = dict(
    hidden_size=256, intermediate_size=896, num_hidden_layers=6,  # 8B: 4096, 14336 (3.5x), 32 layers
    num_attention_heads=8, num_key_value_heads=2, head_dim=32,  # 8B: 32 / 8, head_dim 128
    hidden_act="silu", rms_norm_eps=1e-5, attention_bias=False, mlp_bias=False, tie_word_embeddings=False,
    max_position_embeddings=131072, rope_theta=500000.0,
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192},
)
SAMPLING = dict(do_sample=True, temperature=0.6, top_p=0.9)  # Llama-3.1-8B-Instruct's generation_config.json
WEIGHT_STD = 0.08  # larger than an init's 0.02: greedy choices far from ties, so runs that should agree do


def content_key(tokenizer_dir: str | os.PathLike) -> str:
    """What the checkpoint is made of: this file's source (the architecture, seed, recipe) and the tokenizer files."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    for name in TOKENIZER_FILES:
        path = Path(tokenizer_dir) / name
        h.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"-") + b"\0")
    return h.hexdigest()[:16]


def _tokenizer_without_pad(src: Path, dest: Path) -> dict[str, int]:
    """Copy the tokenizer files with the pad token taken out; returns the special tokens' ids by content."""
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, dest / name)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = dest / name
        if path.is_file():
            cfg = json.loads(path.read_text())
            cfg.pop("pad_token", None)
            path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False))
    portable_tokenizer(dest)
    tok = json.loads((dest / "tokenizer.json").read_text())
    if tok.get("padding"):  # a pad token configured in the tokenizers backend itself
        tok["padding"] = None
        (dest / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    return {t["content"]: t["id"] for t in tok["added_tokens"]}


def _vocab_size(dest: Path) -> int:
    tok = json.loads((dest / "tokenizer.json").read_text())
    return max([*tok["model"]["vocab"].values(), *(t["id"] for t in tok["added_tokens"])]) + 1


def build(dest: str | os.PathLike, tokenizer_dir: str | os.PathLike) -> Path:
    """Write the checkpoint into ``dest`` (created; replaced if present) from the tokenizer files of
    ``tokenizer_dir``. Deterministic: the same tokenizer gives the same tensors under any transformers version."""
    dest, src = Path(dest), Path(tokenizer_dir)
    dest.mkdir(parents=True, exist_ok=True)
    special = _tokenizer_without_pad(src, dest)
    tok_cfg = json.loads((dest / "tokenizer_config.json").read_text())
    eos = [special[t] for t in EOS_TOKENS]
    if special.get(tok_cfg.get("eos_token")) != eos[-1]:
        raise ValueError(f"{src}: the tokenizer's eos_token {tok_cfg.get('eos_token')!r} is not {EOS_TOKENS[-1]!r}")
    bos = special.get(tok_cfg.get("bos_token"))
    config = LlamaConfig(vocab_size=_vocab_size(dest), bos_token_id=bos, eos_token_id=eos, pad_token_id=None,
                         **ARCHITECTURE)
    with torch.device("meta"):  # the parameters' names and shapes only: the weights are drawn below
        model = LlamaForCausalLM(config)
    gen = torch.Generator().manual_seed(SEED)
    state = {}
    for name, param in sorted(model.state_dict().items()):
        state[name] = (torch.randn(param.shape, generator=gen) * WEIGHT_STD if param.dim() > 1
                       else torch.ones(param.shape)).contiguous()  # 1-D: the RMSNorm weights
    save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})
    cfg = config.to_dict()
    cfg.update(architectures=["LlamaForCausalLM"], _name_or_path=NAME, torch_dtype="float32",
               rope_theta=ARCHITECTURE["rope_theta"], rope_scaling=ARCHITECTURE["rope_scaling"])
    cfg.pop("pad_token_id", None)
    if "dtype" in cfg:  # transformers 5's name (with_legacy_keys adds torch_dtype from it)
        cfg["dtype"] = "float32"
    (dest / "config.json").write_text(json.dumps(with_legacy_keys(cfg), indent=2))
    GenerationConfig(bos_token_id=bos, eos_token_id=eos, **SAMPLING).to_json_file(str(dest / "generation_config.json"))
    return dest


def properties(path: str | os.PathLike) -> dict:
    """What a checkpoint folder says about the properties above, read back with transformers (the tests check them;
    the embedded model's differ)."""
    path = Path(path)
    cfg = AutoConfig.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    gen = GenerationConfig.from_pretrained(path)
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        untied = "lm_head.weight" in f.keys() and not torch.equal(f.get_tensor("lm_head.weight"),
                                                                  f.get_tensor("model.embed_tokens.weight"))
    rope = dict(getattr(cfg, "rope_scaling", None) or getattr(cfg, "rope_parameters", None) or {})
    eos = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
    return dict(pad_token=tok.pad_token, pad_token_id=[getattr(cfg, "pad_token_id", None), gen.pad_token_id],
                tie_word_embeddings=cfg.tie_word_embeddings, untied_lm_head=untied,
                rope_type=rope.get("rope_type", rope.get("type", "default")),
                rope_theta=getattr(cfg, "rope_theta", None) or rope.get("rope_theta"),
                rope_factors=[rope.get(k) for k in ("factor", "low_freq_factor", "high_freq_factor",
                                                    "original_max_position_embeddings")],
                eos_token_id=eos, tokenizer_eos_in_list=tok.eos_token_id in eos,
                eos_within_vocab=all(0 <= e < len(tok) for e in eos), vocab_size=cfg.vocab_size,
                heads_per_kv_head=cfg.num_attention_heads // cfg.num_key_value_heads,
                head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)


def production_model_path(tokenizer_dir: str | os.PathLike | None = None) -> Path:
    """The cached checkpoint's folder, built on first use from ``tokenizer_dir`` (default: the embedded model's)."""
    src = resolve_model_path(tokenizer_dir)
    dest = cache_dir() / f"{NAME}-{content_key(src)}"
    if (dest / "config.json").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        build(tmp, src)
        try:
            tmp.rename(dest)  # atomic; another process that got there first wins (same content)
        except OSError:
            if not (dest / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


if __name__ == "__main__":
    print(production_model_path())
