"""Prompts -> a fixed-shape, left-padded batch (Neuron graphs have a fixed batch size)."""
from __future__ import annotations

import torch


def encode_prompts(tokenizer, prompts, batch_size: int, chat: bool = True):
    """Tokenize ``prompts`` into exactly ``batch_size`` left-padded rows.

    Fewer prompts than rows are repeated cyclically (a served batch is always full on Neuron);
    more prompts than rows is an error. ``chat=True`` applies the model's chat template.
    Returns the tokenizer's BatchEncoding (``input_ids``, ``attention_mask``).
    """
    if isinstance(prompts, str):
        prompts = [prompts]
    prompts = list(prompts)
    if not prompts:
        raise ValueError("no prompts given")
    if len(prompts) > batch_size:
        raise ValueError(f"{len(prompts)} prompts for batch_size={batch_size}: raise batch_size or pass fewer prompts")
    rows = [prompts[i % len(prompts)] for i in range(batch_size)]
    if chat:
        rows = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                              add_generation_prompt=True) for p in rows]
    tokenizer.padding_side = "left"
    return tokenizer(rows, return_tensors="pt", padding=True, add_special_tokens=not chat)


def hf_greedy(hf_model, enc, max_new_tokens: int, **kwargs) -> torch.Tensor:
    """The oracle: Hugging Face ``generate()`` greedy on the same batch (prompt + new tokens)."""
    with torch.inference_mode():
        return hf_model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, top_k=None, top_p=None,
                                 temperature=None, **kwargs)


# Tasks for choosing a speculative draft (notebook 05, ci/bench_speculative.py): how much of the
# answer already sits in the prompt decides what a prompt-lookup draft can guess.
SPECULATION_TASKS = {
    "quote": ("Repeat the following paragraph exactly, word for word:\n\nThe Inferentia2 accelerator has two "
              "NeuronCores per chip. Each core has its own high-bandwidth memory. Large models are split across "
              "cores with tensor parallelism, and the key-value cache is allocated once for the maximum "
              "sequence length."),
    "edit": ("Rewrite this sentence with British spelling, changing nothing else: The color of the theater "
             "curtains was gray, so the organizer apologized and analyzed the catalog again."),
    "open": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}
