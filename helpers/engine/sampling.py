"""Token selection for ``sample()`` (greedy is ``top_k=1``; else transformers' temperature -> top-k -> top-p warpers
and one multinomial draw), and the defaults every ``sample()`` resolves alike, the engine's and ``helpers.neuron``'s:
EOS, pad, start ids, a criterion's row flags."""
from __future__ import annotations

import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper


def validate_sampling_args(top_k, top_p, temperature) -> None:
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k={top_k!r}: must be an int >= 1 (top_k=1 is greedy)")
    if not 0.0 < float(top_p) <= 1.0:
        raise ValueError(f"top_p={top_p!r}: must be in (0, 1]")
    if not float(temperature) > 0.0:
        raise ValueError(f"temperature={temperature!r}: must be > 0 (use top_k=1 for greedy)")


def validate_input_ids(input_ids, vocab_size: int) -> torch.Tensor:
    """The prompt as a [B, L] int64 tensor, or a refusal that names the fix: float ids, an empty prompt or an
    id outside the vocabulary would otherwise fail deep inside torch (or, on Neuron, inside a compiled graph)."""
    ids = torch.as_tensor(input_ids)
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"input_ids has dtype {ids.dtype}: token ids are integers (pass the tokenizer's "
                         "input_ids, or .long() them)")
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2:
        raise ValueError(f"input_ids has shape {tuple(ids.shape)}: pass [batch, length] (or [length])")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"input_ids has shape {tuple(ids.shape)}: the prompt is empty; give every row at least one "
                         "token (e.g. the BOS token or a chat template)")
    bad = (ids < 0) | (ids >= vocab_size)
    if bool(bad.any()):
        raise ValueError(f"input_ids holds token id {int(ids[bad][0])} outside the vocabulary [0, {vocab_size}): "
                         "was the prompt encoded with this model's tokenizer?")
    return ids.long()


def eos_list(eos_token_id) -> list[int]:
    """An ``eos_token_id`` as configs and callers give it (None, one id or several) as a list of ids."""
    return [] if eos_token_id is None else ([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id))


def resolve_eos(model_eos: list[int], eos_token_override=None) -> list[int]:
    """The ids that end a row: the model's, unless ``eos_token_override`` (one id or several; ``[]``: none)."""
    return model_eos if eos_token_override is None else eos_list(eos_token_override)


def resolve_pad(pad_token_id: int | None, config_pad: int | None, eos: list[int]) -> int:
    """What finished rows are padded with: ``pad_token_id``, else the config's, else the first EOS id, else 0."""
    if pad_token_id is not None:
        return pad_token_id
    if config_pad is not None:
        return config_pad
    return eos[0] if eos else 0


def start_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Left padding -> index of each row's first real token (transformers-neuronx ``start_ids``)."""
    am = torch.as_tensor(attention_mask)
    if bool((am[:, 1:] < am[:, :-1]).any()):
        raise ValueError("attention_mask has padding after a real token: pad on the left "
                         "(tokenizer.padding_side = 'left')")
    return (am == 0).sum(dim=1)


def warpers(top_k: int, top_p: float, temperature: float) -> LogitsProcessorList:
    procs = LogitsProcessorList()
    if float(temperature) != 1.0:
        procs.append(TemperatureLogitsWarper(float(temperature)))
    if top_k > 0:
        procs.append(TopKLogitsWarper(top_k))
    if float(top_p) < 1.0:
        procs.append(TopPLogitsWarper(float(top_p)))
    return procs


def probabilities(logits: torch.Tensor, top_k: int, top_p: float, temperature: float) -> torch.Tensor:
    """The distribution ``select_next_tokens`` draws from, [B, V] (used by speculative sampling too)."""
    scores = warpers(top_k, top_p, temperature)(None, logits.float())
    return torch.softmax(scores, dim=-1)


def select_next_tokens(logits: torch.Tensor, top_k: int, top_p: float, temperature: float,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    if top_k == 1:
        return logits.argmax(dim=-1)
    probs = probabilities(logits, top_k, top_p, temperature)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


def row_flags(value, batch: int, device=None) -> torch.Tensor:
    """A criterion's answer as one bool per row: a per-row tensor as it is, one bool (tensor or not) for
    every row."""
    v = torch.as_tensor(value, dtype=torch.bool, device=device).reshape(-1)
    return v.expand(batch) if v.numel() == 1 else v
