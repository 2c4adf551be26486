"""The setup cell of a notebook that generates from chat prompts (03, 04) in one call: the backend, the seed, the
checkpoint, its tokenizer and the fixed-shape batch, checked against the KV cache before anything is built."""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple


from ..model_store import load_tokenizer
from ..prompts import encode_prompts
from .backend import Backend, start
from .provenance import measured_by


class PromptSetup(NamedTuple):
    bk: Backend
    model_dir: Path
    tok: object          # the checkpoint's tokenizer
    enc: object          # the left-padded batch (input_ids, attention_mask)
    prompt_len: int      # columns of the padded prompt
    seq_len: int         # prompt_len + max_new_tokens: sample()'s sequence_length


def prompt_setup(backend: str, neuron_stack, device: str, seed: int, model_path, prompts, batch_size: int,
                 n_positions: int, max_new_tokens: int) -> PromptSetup:
    """Resolve the backend, seed torch, load the tokenizer and encode ``prompts`` into ``batch_size`` rows; raise
    ValueError when the prompt plus ``max_new_tokens`` does not fit ``n_positions``."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}: use 1 or more")
    bk, model_dir = start(backend, neuron_stack, device, seed, model_path)
    tok = load_tokenizer(model_dir)
    enc = encode_prompts(tok, prompts, batch_size)
    prompt_len = enc.input_ids.shape[1]
    seq_len = prompt_len + max_new_tokens
    if seq_len > n_positions:
        raise ValueError(f"prompt ({prompt_len}) + max_new_tokens ({max_new_tokens}) = {seq_len} > n_positions="
                         f"{n_positions}: raise n_positions or shorten the prompt")
    print(f"backend: {bk}; batch {batch_size}; prompt {prompt_len} tokens (left-padded); generating {max_new_tokens}; "
          f"figures measured by {measured_by(bk)}")
    return PromptSetup(bk, model_dir, tok, enc, prompt_len, seq_len)
