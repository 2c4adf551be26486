"""What to expect on inf2: figures AWS and Hugging Face publish for a feature, with their source, release and instance.

One call per notebook, ``published_table("speculative")``, shows them as a table labelled "published, not measured
here". Each row is quoted from the source it links (a versioned Neuron documentation page, a permalink to the data
file at a commit, or a dated blog post); nothing in this module is computed, and no notebook computes these.
Where nothing is published for inf2 or trn1, the table says so and gives the nearest figure and its platform.
"""
from __future__ import annotations

from dataclasses import dataclass

from IPython.display import Markdown

# The Neuron SDK documentation sources at tag v2.19.1, the last release whose "Inf2 Inference Performance" page
# renders the decoder tables (the data files are byte-identical at v2.28.1, where the page no longer shows them).
_INF2_PERF = "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.19.1/general/benchmarks/inf2/inf2-performance.html"
_INF2_CSV = ("https://github.com/aws-neuron/aws-neuron-sdk/blob/800d00f87d73f32bffbd2831d653b43764c2cf32/general/"
             "benchmarks/inf2/latency_data_decoder.csv")
_OPTIMUM_8B = ("https://github.com/huggingface/optimum-neuron/blob/9d371f563fa7b76ffbf59abf412815f114bf4442/docs/"
               "source/benchmarks/inferentia-llama3.1-8b.mdx")
_RELEASE_NOTES = "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.28.1/release-notes/prev/rn.html"
_PYTORCH_BLOG = "https://pytorch.org/blog/high-performance-llama/"
_HF_BLOG_7B = "https://huggingface.co/blog/inferentia-llama2"
_TRN2_70B = ("https://awsdocs-neuron.readthedocs-hosted.com/en/v2.28.1/libraries/nxd-inference/tutorials/"
             "trn2-llama3.3-70b-tutorial.html")
_TRN2_APC = ("https://awsdocs-neuron.readthedocs-hosted.com/en/v2.28.1/libraries/nxd-inference/tutorials/"
             "trn2-llama3.3-70b-apc-tutorial.html")
_VLLM_DP3 = ("https://github.com/huggingface/optimum-neuron/blob/213224e6aae42e570b88b3a5e6f2716112823469/benchmark/"
             "vllm/data-parallel/llama3.1-8b/vllm-results-dp3.csv")
_FEATURE_GUIDE = ("https://awsdocs-neuron.readthedocs-hosted.com/en/v2.28.1/libraries/nxd-inference/developer_guides/"
                  "feature-guide.html")


@dataclass(frozen=True)
class Published:
    figure: str     # the figure as the source states it
    setting: str    # model, dtype, tp, batch, lengths
    instance: str
    release: str    # SDK or library version, and date where the source gives one
    source: str     # a URL a reader can open
    label: str      # the link text


def _inf2_row(figure: str, setting: str, release: str = "SDK 2.18.1") -> Published:
    """A row of the Inf2 performance data file (transformers-neuronx on an inf2.48xlarge)."""
    return Published(figure, setting, "inf2.48xlarge", f"transformers-neuronx, {release}", _INF2_CSV,
                     "Inf2 performance, decoder models (data file)")


_LLAMA3_8B_INF2 = (
    _inf2_row("TTFT p50 25 ms, TPOT p50 6.42 ms, 161.67 tok/s", "Llama-3-8B, int8 weights, tp 24, batch 1, "
              "128 in / 3968 out"),
    _inf2_row("TTFT p50 101.81 ms, TPOT p50 6.5 ms, 153.58 tok/s", "Llama-3-8B, int8 weights, tp 24, batch 1, "
              "2048 in / 2048 out"),
    _inf2_row("TTFT p50 66.02 ms, TPOT p50 10.45 ms, 859.09 tok/s", "Llama-3-8B, int8 weights, tp 24, batch 8, "
              "128 in / 3968 out"),
    Published("TTFT p50 27.34 ms, TPOT p50 6.86 ms, 149.74 tok/s", "Mistral-7B-Instruct-v0.2, bf16, tp 24, batch 1, "
              "128 in / 3968 out", "inf2.48xlarge", "transformers-neuronx, SDK 2.18.0", _INF2_PERF,
              "Inf2 Inference Performance (SDK 2.19.1 docs)"),
    Published("TTFT 0.3 s, inter-token latency 11 ms, 83 tok/s", "Llama-3.1-8B-Instruct, bf16, tp 8, batch 1, "
              "1024 in / 256 out, sequence length 4096", "inf2.48xlarge (8 of its 24 cores)",
              "optimum-neuron 0.3.0 (2025; charts, SDK not stated)", _OPTIMUM_8B,
              "optimum-neuron: Llama-3.1-8b on Inferentia2"),
    Published("TTFT 2.3 s, inter-token latency 16 ms, 322 tok/s", "Llama-3.1-8B-Instruct, bf16, tp 8, batch 8, "
              "1024 in / 256 out, sequence length 4096", "inf2.48xlarge (8 of its 24 cores)",
              "optimum-neuron 0.3.0 (2025; charts, SDK not stated)", _OPTIMUM_8B,
              "optimum-neuron: Llama-3.1-8b on Inferentia2"),
)

FIGURES: dict[str, tuple[Published, ...]] = {
    "latency": _LLAMA3_8B_INF2,
    "tensor_parallel": (
        Published("30.1 ms/token at tp 2, 7.9 ms/token at tp 24", "Llama-2-7B, batch 1, 256 in / 256 out",
                  "inf2.xlarge (tp 2), inf2.48xlarge (tp 24)", "transformers-neuronx, SDK 2.13.2 (2023)",
                  _PYTORCH_BLOG, "PyTorch blog: High-Performance Llama 2 Training and Inference"),
        Published("57.3 ms/token at tp 2, 11.1 ms/token at tp 24", "Llama-2-13B, batch 1", "inf2",
                  "transformers-neuronx, SDK 2.13.2 (2023)", _PYTORCH_BLOG,
                  "PyTorch blog: High-Performance Llama 2 Training and Inference"),
        Published("256 new tokens in 15.9 s on 2 cores, 2.3 s on 24 cores", "Llama-2-7B, batch 1, 256 in",
                  "inf2.8xlarge (2 cores), inf2.48xlarge (24 cores)", "optimum-neuron (November 2023)", _HF_BLOG_7B,
                  "Hugging Face blog: Llama 2 on Inferentia2"),
    ),
    "speculative": (
        Published("TPOT and throughput up to 25% better", "Llama-2-70B, transformers-neuronx speculative decoding "
                  "(beta)", "not stated (inf2/trn1)", "SDK 2.18 release notes", _RELEASE_NOTES,
                  "Neuron release notes (previous releases)"),
        Published("TPOT 19.6 ms to 5.3 ms, 36 to 144 tok/s (TTFT 814.2 ms to 870.1 ms)", "Llama-3.3-70B with a "
                  "Llama-3.2-1B draft (fused speculation), batch 1", "trn2.48xlarge (no inf2/trn1 figure found)",
                  "NxD Inference, SDK 2.28.1 docs", _TRN2_70B, "NxD Inference tutorial: Llama-3.3-70B on Trn2"),
    ),
    "int8": (
        _inf2_row("TTFT p50 25 ms, TPOT p50 6.42 ms, 161.67 tok/s (no bf16 row of the same model to compare)",
                  "Llama-3-8B, int8 weights, tp 24, batch 1, 128 in / 3968 out"),
        Published("\"converted to a smaller data type to reduce memory bandwidth usage, which improves model "
                  "performance\" (no figure)", "NxD Inference weight quantization", "any",
                  "NxD Inference, SDK 2.28.1 docs", _FEATURE_GUIDE, "NxD Inference feature guide"),
    ),
    "continuous_batching": (
        Published("1226.12 tok/s at 5.33 requests/s (all replicas); inter-token latency 26.59 ms one request at a "
                  "time", "Llama-3.1-8B-Instruct, vLLM on Neuron, 3 replicas of tp 8, up to 32 sequences each, "
                  "4096 tokens", "not stated (12 Neuron devices: an inf2.48xlarge has 12)",
                  "optimum-neuron vLLM benchmark (September 2025)", _VLLM_DP3,
                  "optimum-neuron vLLM data-parallel benchmark (data file)"),
        _LLAMA3_8B_INF2[0], _LLAMA3_8B_INF2[2],
    ),
    "prefix_caching": (
        Published("TTFT up to 3x better on shared prompts", "NxD Inference prefix caching", "not stated",
                  "SDK 2.24 release notes", _RELEASE_NOTES, "Neuron release notes (previous releases)"),
        Published("TTFT 342.81 ms to 107.8 ms (>90% cache hits); 89.7 ms to 91.8 ms (no hits)", "Llama-3.3-70B, "
                  "tp 64, batch 4, sequence length 8192", "trn2.48xlarge (no inf2/trn1 figure found)",
                  "NxD Inference, SDK 2.28.1 docs", _TRN2_APC, "NxD Inference tutorial: automatic prefix caching"),
    ),
}


def published_table(feature: str):
    """The published figures of ``feature`` (a key of ``FIGURES``) as a Markdown table for the notebook."""
    if feature not in FIGURES:
        raise ValueError(f"feature {feature!r}: use one of {sorted(FIGURES)}")
    rows = ["| published figure (not measured here) | setting | instance | release | source |",
            "| --- | --- | --- | --- | --- |"]
    rows += [f"| {p.figure} | {p.setting} | {p.instance} | {p.release} | [{p.label}]({p.source}) |"
             for p in FIGURES[feature]]
    return Markdown("\n".join(rows))
