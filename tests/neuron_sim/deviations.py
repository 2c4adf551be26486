"""Every deliberate deviation of the Neuron stand-ins from the pinned sources (transformers-neuronx v0.13.0 f4e3818,
NxD Inference 0.8 cd3abf3 / SDK 2.28.0). Read by tests/test_stand_in_deviations.py (DEVIATIONS.md is its rendering,
checked to be current) and by ci/fidelity.py (``probes``: regular expressions naming the fidelity probes whose
outcome is allowed to differ because of that row; any other difference fails the check).

Each row: ``what`` differs, ``why``, and ``cannot_pass``: why the deviation cannot turn a call that fails on the
pinned release into one that passes (none may). Published bugs are *not* deviations: the stand-ins reproduce them
(NxDI 0.8's ``tensor_capture_hook`` NameError, the int8 tied ``lm_head`` cast to int8, tnx's stopping criteria fed
the prompt, ...).

    python tests/neuron_sim/deviations.py > tests/neuron_sim/DEVIATIONS.md
"""
from __future__ import annotations

DEVIATIONS = [
    dict(id="compute-reference-engine", stack="both",
         what="Every forward computes with the repository's reference engine (helpers.NeuronModel) at tp_degree=1, "
              "whatever tp_degree is configured; no Neuron graph is compiled.",
         why="No Neuron hardware or compiler exists in CI; the numbers are never presented as Neuron measurements.",
         cannot_pass="The configuration checks that the release runs before and at compile (tp degree, buckets, "
                     "GQA, quantization settings) are transcribed and raise as published; what cannot be emulated "
                     "(compiler failures, device memory) is out of the stand-ins' claim, not made to pass."),
    dict(id="compiled-artifacts", stack="both",
         what="model.pt (NxDI) is a TorchScript module recording the compiled settings; presharded weights are each "
              "rank's tensor_split slice, not NxD's parallel-layer layout; tnx NEFF files are named by the stand-in's "
              "graph hash.",
         why="No Neuron compiler; the layout a user sees (file names, which call writes/reads what) is kept.",
         cannot_pass="Missing files raise the release's errors (torch.jit.load ValueError, safetensors errors, "
                     "'Quantized checkpoint file not found'); load() ignores neuron_config.json as the release does."),
    dict(id="nxdi-unknown-neuron-config-keyword", stack="nxdi",
         what="NeuronConfig raises ContractError on a keyword it does not pop (the release only logs 'NeuronConfig "
              "init: Unexpected keyword arguments').",
         why="A typo would silently run with the default; the contract test must see it.",
         cannot_pass="Stricter only: it turns a passing (ignored) keyword into a failure, never the reverse."),
    dict(id="nxdi-generation-config-typo", stack="nxdi",
         what="generate(generation_config=...) raises ContractError when the GenerationConfig carries an attribute "
              "transformers does not define.",
         why="Hugging Face keeps unknown keywords as unused attributes: a typo would be silently ignored.",
         cannot_pass="Stricter only: an accepted (ignored) keyword becomes an error, never the reverse."),
    dict(id="nxdi-silent-wrong-tokens", stack="nxdi",
         what="ContractError where the release computes wrong tokens without an error: padding_side='left', a "
              "left-padded batch with padding_side='right', a token-generation step past the largest bucket, "
              "assisted decoding with more than one row, a checkpoint with rope_parameters but no rope_theta.",
         why="The reference engine cannot reproduce the release's wrong tokens bit for bit; failing loudly keeps a "
             "notebook from passing on output the release would have spoiled.",
         cannot_pass="Each case fails on the release (wrong output); it fails on the stand-in too (an error)."),
    dict(id="nxdi-config-class-check", stack="nxdi",
         what="NeuronApplicationBase refuses a config that is not its get_config_cls(); save_quantized_state_dict "
              "refuses quantized_checkpoints_path=None (the release fails later, with AttributeError/TypeError).",
         why="An earlier, clearer error for the same failing call.",
         cannot_pass="Both calls fail on the release as well; only the exception type and point differ."),
    dict(id="not-transcribed", stack="both",
         what="Features not transcribed raise NotImplementedError: NxDI fused speculation, EAGLE, Medusa, async mode, "
              "chunked prefill, LoRA, tensor replacement/capture at run time, a batch larger than the compiled one (its "
              "slices are padded and routed to the graphs as published, then not computed), "
              "input_start_offsets, modules_to_not_convert finer than 'layers.N' or 'lm_head' (and 'layers.N' with "
              "per_tensor_symmetric), quantization dtypes other than int8; tnx features listed in its modules "
              "(among them batched speculation: SpeculativeGenerator.sample with batch > 1).",
         why="The notebooks do not use them; reproducing them without the hardware would be guesswork.",
         cannot_pass="NotImplementedError fails the call; a feature is never silently skipped.",
         probes=[r"^SpeculativeGenerator\[batch \d+( right-padded)?\]$",
                 r"^routing\[(batch 1|speculation 4)\] \w+ rows=[23] sampling_params=rows$"]),
    dict(id="nxdi-platform-inf2", stack="nxdi",
         what="Hardware queries (get_platform_target, logical NeuronCores) answer as an inf2/trn1 instance "
              "(logical_nc_config 1).",
         why="The pinned stacks' last Inf2/Trn1 release is what the notebooks target.",
         cannot_pass="On inf2/trn1 the release answers the same; trn2-only settings are not claimed."),
    dict(id="tnx-silent-misread", stack="tnx",
         what="ContractError where transformers-neuronx silently misreads the call: SpeculativeGenerator.sample with "
              "a left-padded attention_mask (it takes count_nonzero(attention_mask) as each row's end and writes the "
              "new tokens over the prompt), a left-padded batch without start_ids, a checkpoint with rope_parameters "
              "but no rope_theta (read as rope_theta=10000), load() after to_neuron() (no effect). Also a KV-cache "
              "position past n_positions, where the source fails too but without naming the cause (a one-token step "
              "raises StopIteration from DecoderProgram.find_bucket_id, decoder.py).",
         why="The reference engine cannot reproduce the release's wrong tokens bit for bit; failing loudly keeps a "
             "notebook from passing on output the release would have spoiled.",
         cannot_pass="Each case gives wrong output (or silently ignores the call, or fails) on the release; on the "
                     "stand-in it is an error.",
         probes=[r"^SpeculativeGenerator\[mask left-padded\]$"]),
    dict(id="tnx-module-functions", stack="tnx",
         what="_sanity_check (a function nested in PretrainedModel.from_pretrained) and check_gqa_fallback (a "
              "DecoderLmHeadForSamplingNoEmbedding method) are module-level functions of transformers_neuronx.base "
              "taking the decoder's values as arguments.",
         why="The stand-in has no decoder object; the logic is transcribed line for line.",
         cannot_pass="Same assertions, warnings and resulting GQA strategy (compared by ci/fidelity.py probes)."),
]


def render() -> str:
    lines = ["# Deliberate deviations of the Neuron stand-ins from the pinned sources", "",
             "Generated from `tests/neuron_sim/deviations.py` (`python tests/neuron_sim/deviations.py`). "
             "Published bugs are reproduced, not listed here.", "",
             "| id | stack | what | why | why it cannot turn a failing call into a passing one | fidelity probes |",
             "|---|---|---|---|---|---|"]
    for d in DEVIATIONS:
        probes = ", ".join(f"`{p}`" for p in d.get("probes", ())) or "-"
        cells = [f"`{d['id']}`", d["stack"], d["what"], d["why"], d["cannot_pass"], probes]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
